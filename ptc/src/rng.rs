//! Counter-based random numbers whose values do not depend on the layout.
//!
//! Every random number a job draws is addressed by what it is for, not by who
//! draws it: a [`Stream`] is named by a purpose (dropout in layer `l`, data
//! augmentation, ...), a global sample id and a step, and its values are
//! indexed by the element's position in the global (unsharded) tensor. A
//! tensor-parallel rank that owns elements `a..b` reads `values(a..b)`; any
//! other layout reads the same numbers for the same elements. The generator
//! is Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of
//! cuRAND, PyTorch and JAX, so the state to carry across a reconfiguration is
//! the seed and the step counter.

use serde::{Deserialize, Serialize};

/// What a stream of random numbers is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Purpose {
    /// Dropout masks of one layer.
    Dropout {
        /// Layer index.
        layer: u32,
    },
    /// Data augmentation of a sample.
    Augmentation,
    /// Anything else, named by a number.
    Other {
        /// Caller-chosen id.
        id: u32,
    },
}

/// The RNG part of a job's state: a seed and the number of steps taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngState {
    /// Seed of every stream.
    pub seed: u64,
    /// Training steps taken so far.
    pub step: u64,
}

impl RngState {
    /// The stream for `purpose`, item `item` and step `step` (counted from
    /// this state's step). For per-sample streams, `item` is the sample's
    /// position in the global stream (see `DatasetState`), which is unique
    /// across epochs and the same under every layout.
    pub fn stream(&self, purpose: Purpose, item: u64, step: u64) -> Stream {
        let (tag, a) = match purpose {
            Purpose::Dropout { layer } => (1u64, layer as u64),
            Purpose::Augmentation => (2, 0),
            Purpose::Other { id } => (3, id as u64),
        };
        let id = mix(mix(mix(tag << 32 | a) ^ item) ^ self.step.wrapping_add(step));
        Stream {
            key: [self.seed as u32, (self.seed >> 32) as u32],
            id: [id as u32, (id >> 32) as u32],
        }
    }

    /// The state after `steps` steps.
    pub fn advance(&self, steps: u64) -> RngState {
        RngState {
            seed: self.seed,
            step: self.step.wrapping_add(steps),
        }
    }
}

/// A random-access stream of 32-bit random numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    key: [u32; 2],
    id: [u32; 2],
}

impl Stream {
    /// The `i`-th number of the stream.
    pub fn at(&self, i: u64) -> u32 {
        let block = i / 4;
        philox4x32_10([block as u32, (block >> 32) as u32, self.id[0], self.id[1]], self.key)[(i % 4) as usize]
    }

    /// Numbers `range.start..range.end`, as a rank owning those elements reads them.
    pub fn values(&self, range: std::ops::Range<u64>) -> Vec<u32> {
        range.map(|i| self.at(i)).collect()
    }

    /// The `i`-th number as a uniform float in `[0, 1)`.
    pub fn uniform(&self, i: u64) -> f32 {
        (self.at(i) >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

/// The SplitMix64 finaliser: a cheap, well-mixing hash of 64 bits.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Philox4x32 with 10 rounds (Random123).
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    for round in 0..10 {
        if round > 0 {
            key[0] = key[0].wrapping_add(W0);
            key[1] = key[1].wrapping_add(W1);
        }
        let p0 = M0 * ctr[0] as u64;
        let p1 = M1 * ctr[2] as u64;
        ctr = [
            ((p1 >> 32) as u32) ^ ctr[1] ^ key[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ ctr[3] ^ key[1],
            p0 as u32,
        ];
    }
    ctr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn slices_read_the_same_numbers_as_the_whole() {
        let s = RngState { seed: 42, step: 3 }.stream(Purpose::Dropout { layer: 5 }, 1234, 0);
        let whole = s.values(0..64);
        let halves = [s.values(0..24), s.values(24..64)].concat();
        assert_eq!(whole, halves);
        let other = RngState { seed: 42, step: 3 }.stream(Purpose::Dropout { layer: 6 }, 1234, 0);
        assert_ne!(whole, other.values(0..64));
        assert_eq!(
            RngState { seed: 42, step: 0 }
                .advance(3)
                .stream(Purpose::Augmentation, 9, 1)
                .at(0),
            RngState { seed: 42, step: 4 }.stream(Purpose::Augmentation, 9, 0).at(0)
        );
    }
}
