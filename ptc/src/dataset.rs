//! Dataset position as part of the PTC: the same stream of global batches
//! whatever the data-parallel degree.
//!
//! The job reads a dataset of `N` samples in a global order: epoch `e` is a
//! pseudo-random permutation of `0..N` keyed by `(seed, e)`, computed one
//! index at a time (a keyed Feistel network with cycle walking), never
//! materialised. Position `p` of the stream is sample `perm_{p / N}(p % N)`;
//! epochs follow each other without gaps, so a batch may straddle two.
//!
//! A training step consumes the next `global_batch` positions. Data-parallel
//! rank `r` of `D` reads a contiguous share of them: the first `B mod D` ranks
//! read `⌈B/D⌉` samples, the others `⌊B/D⌋`. The global batches therefore
//! never depend on `D`, and a reconfiguration only needs the three integers
//! of [`DatasetState`] to resume with no sample skipped or repeated.

use serde::{Deserialize, Serialize};

/// Most samples [`DatasetState::micro_batches`] lists in one call (2²⁴).
pub const MAX_SAMPLES_LISTED: u64 = 1 << 24;

/// Why a dataset state or request is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A dataset with no samples, or an empty batch.
    #[error("{what} must be at least 1")]
    Zero {
        /// What is zero.
        what: &'static str,
    },
    /// A state saved for another dataset.
    #[error("state is for a dataset of {state} samples, but this dataset has {actual}")]
    DatasetSize {
        /// Size recorded in the state.
        state: u64,
        /// Size of the dataset given.
        actual: u64,
    },
    /// The consumed-sample counter would overflow.
    #[error("consumed-sample counter {consumed} plus {more} more samples overflows 64 bits")]
    Overflow {
        /// Counter.
        consumed: u64,
        /// Samples asked for.
        more: u128,
    },
    /// More data-parallel ranks than samples per batch.
    #[error("dp={dp} is larger than the global batch of {batch} samples: some ranks would get no data")]
    TooManyRanks {
        /// Data-parallel degree.
        dp: u64,
        /// Global batch size.
        batch: u64,
    },
    /// More samples asked for at once than [`MAX_SAMPLES_LISTED`].
    #[error("{samples} samples asked for at once; list at most {max}")]
    TooManySamples {
        /// Samples asked for (micro-batches × micro-batch size, saturated).
        samples: u64,
        /// The limit.
        max: u64,
    },
    /// A rank outside `0..dp`.
    #[error("data-parallel rank {rank} does not exist (dp={dp})")]
    NoSuchRank {
        /// Rank.
        rank: u64,
        /// Data-parallel degree.
        dp: u64,
    },
}

/// The dataset part of a job's state: which global order, how far along, and
/// how many samples a step consumes.
///
/// Invariants (checked by [`DatasetState::new`] and on deserialisation):
/// `dataset_size ≥ 1`, `global_batch ≥ 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "DatasetFields", into = "DatasetFields")]
pub struct DatasetState {
    fields: DatasetFields,
}

/// The plain fields of a [`DatasetState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetFields {
    /// Number of samples in the dataset.
    pub dataset_size: u64,
    /// Seed of the global sample order.
    pub seed: u64,
    /// Samples consumed so far, over all epochs.
    pub consumed: u64,
    /// Samples per training step, over all data-parallel ranks.
    pub global_batch: u64,
}

impl TryFrom<DatasetFields> for DatasetState {
    type Error = DataError;
    fn try_from(f: DatasetFields) -> Result<Self, DataError> {
        DatasetState::new(f)
    }
}

impl From<DatasetState> for DatasetFields {
    fn from(s: DatasetState) -> Self {
        s.fields
    }
}

/// One micro-batch of one data-parallel rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MicroBatch {
    /// Training step, counted from the state's position.
    pub step: u64,
    /// Index of the micro-batch within the rank's share of that step.
    pub micro: u64,
    /// Global stream positions it reads (its samples are `sample_at` of these).
    pub first_position: u64,
    /// Sample indices, in order.
    pub samples: Vec<u64>,
}

impl DatasetState {
    /// A validated state.
    pub fn new(fields: DatasetFields) -> Result<DatasetState, DataError> {
        if fields.dataset_size == 0 {
            return Err(DataError::Zero { what: "dataset_size" });
        }
        if fields.global_batch == 0 {
            return Err(DataError::Zero { what: "global_batch" });
        }
        Ok(DatasetState { fields })
    }

    /// The plain fields.
    pub fn fields(&self) -> &DatasetFields {
        &self.fields
    }

    /// Check that this state belongs to a dataset of `size` samples.
    pub fn for_dataset(&self, size: u64) -> Result<(), DataError> {
        if size != self.fields.dataset_size {
            return Err(DataError::DatasetSize {
                state: self.fields.dataset_size,
                actual: size,
            });
        }
        Ok(())
    }

    /// The sample at stream position `p`.
    pub fn sample_at(&self, p: u64) -> u64 {
        let n = self.fields.dataset_size;
        permute(p % n, n, epoch_key(self.fields.seed, p / n))
    }

    /// The samples of the next `steps` global batches.
    pub fn global_batches(&self, steps: u64) -> Result<Vec<Vec<u64>>, DataError> {
        let b = self.fields.global_batch;
        self.check_room(steps as u128 * b as u128)?;
        Ok((0..steps)
            .map(|t| {
                let start = self.fields.consumed + t * b;
                (start..start + b).map(|p| self.sample_at(p)).collect()
            })
            .collect())
    }

    /// Positions `[start, end)` of each step's global batch that rank `rank`
    /// of `dp` reads.
    pub fn share(&self, dp: u64, rank: u64) -> Result<(u64, u64), DataError> {
        let b = self.fields.global_batch;
        if dp == 0 {
            return Err(DataError::Zero { what: "dp" });
        }
        if dp > b {
            return Err(DataError::TooManyRanks { dp, batch: b });
        }
        if rank >= dp {
            return Err(DataError::NoSuchRank { rank, dp });
        }
        let (q, extra) = (b / dp, b % dp);
        let start = rank * q + rank.min(extra);
        Ok((start, start + q + u64::from(rank < extra)))
    }

    /// The next `count` micro-batches of data-parallel rank `rank` of `dp`,
    /// each of at most `micro_batch` samples (a rank's share of a step is cut
    /// into micro-batches in order; the last one of a step may be smaller).
    pub fn micro_batches(
        &self,
        dp: u64,
        rank: u64,
        micro_batch: u64,
        count: u64,
    ) -> Result<Vec<MicroBatch>, DataError> {
        if micro_batch == 0 {
            return Err(DataError::Zero { what: "micro_batch" });
        }
        let samples = count.saturating_mul(micro_batch);
        if samples > MAX_SAMPLES_LISTED {
            return Err(DataError::TooManySamples {
                samples,
                max: MAX_SAMPLES_LISTED,
            });
        }
        let (s, e) = self.share(dp, rank)?;
        let per_step = (e - s).div_ceil(micro_batch);
        let steps = count.div_ceil(per_step);
        self.check_room(steps as u128 * self.fields.global_batch as u128)?;
        let mut out = Vec::new();
        'steps: for step in 0..steps {
            let base = self.fields.consumed + step * self.fields.global_batch;
            for micro in 0..per_step {
                if out.len() as u64 == count {
                    break 'steps;
                }
                let a = base + s + micro * micro_batch;
                let b = (a + micro_batch).min(base + e);
                out.push(MicroBatch {
                    step,
                    micro,
                    first_position: a,
                    samples: (a..b).map(|p| self.sample_at(p)).collect(),
                });
            }
        }
        Ok(out)
    }

    /// The state after `steps` training steps.
    pub fn advance(&self, steps: u64) -> Result<DatasetState, DataError> {
        let more = steps as u128 * self.fields.global_batch as u128;
        self.check_room(more)?;
        let mut fields = self.fields;
        fields.consumed += more as u64;
        Ok(DatasetState { fields })
    }

    /// The same position with another global batch size (takes effect at the
    /// next step; the stream of samples itself does not change).
    pub fn with_global_batch(&self, global_batch: u64) -> Result<DatasetState, DataError> {
        DatasetState::new(DatasetFields {
            global_batch,
            ..self.fields
        })
    }

    fn check_room(&self, more: u128) -> Result<(), DataError> {
        if self.fields.consumed as u128 + more > u64::MAX as u128 {
            return Err(DataError::Overflow {
                consumed: self.fields.consumed,
                more,
            });
        }
        Ok(())
    }
}

use crate::rng::mix;

fn epoch_key(seed: u64, epoch: u64) -> u64 {
    mix(seed ^ mix(epoch ^ 0x5eed_da7a))
}

/// A keyed bijection of `0..n`: a balanced Feistel network on the smallest
/// even number of bits covering `n` (a bijection of `0..2^bits`), with cycle
/// walking to stay inside `0..n`. Fewer than 4 walks are needed on average.
fn permute(i: u64, n: u64, key: u64) -> u64 {
    let bits = (64 - (n - 1).leading_zeros()).max(2).div_ceil(2) * 2;
    let half = bits / 2;
    let mask = (1u64 << half) - 1;
    let mut x = i;
    loop {
        let (mut l, mut r) = (x >> half, x & mask);
        for round in 0..6u64 {
            let f = mix(r ^ mix(key ^ round)) & mask;
            (l, r) = (r, l ^ f);
        }
        x = (l << half) | r;
        if x < n {
            return x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(n: u64, consumed: u64, b: u64) -> DatasetState {
        DatasetState::new(DatasetFields {
            dataset_size: n,
            seed: 7,
            consumed,
            global_batch: b,
        })
        .unwrap()
    }

    #[test]
    fn every_epoch_is_a_permutation() {
        for n in [1, 2, 3, 5, 16, 17, 100, 1000] {
            let s = state(n, 0, 1);
            for epoch in 0..3 {
                let mut seen: Vec<u64> = (0..n).map(|i| s.sample_at(epoch * n + i)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n={n}");
            }
        }
        let s = state(1000, 0, 1);
        let e0: Vec<u64> = (0..1000).map(|p| s.sample_at(p)).collect();
        let e1: Vec<u64> = (1000..2000).map(|p| s.sample_at(p)).collect();
        assert_ne!(e0, e1, "epochs are shuffled differently");
    }

    #[test]
    fn shares_are_contiguous_and_differ_by_at_most_one() {
        let s = state(100, 0, 10);
        let shares: Vec<(u64, u64)> = (0..4).map(|r| s.share(4, r).unwrap()).collect();
        assert_eq!(shares, vec![(0, 3), (3, 6), (6, 8), (8, 10)]);
        assert!(matches!(
            s.share(11, 0),
            Err(DataError::TooManyRanks { dp: 11, batch: 10 })
        ));
        assert!(matches!(s.share(4, 4), Err(DataError::NoSuchRank { .. })));
    }

    #[test]
    fn bad_states_are_typed_errors() {
        assert!(DatasetState::new(DatasetFields {
            dataset_size: 0,
            seed: 0,
            consumed: 0,
            global_batch: 1
        })
        .is_err());
        assert!(
            serde_json::from_str::<DatasetState>(r#"{"dataset_size":10,"seed":1,"consumed":-1,"global_batch":2}"#)
                .is_err()
        );
        assert!(matches!(
            state(10, u64::MAX - 1, 4).advance(1),
            Err(DataError::Overflow { .. })
        ));
        assert!(matches!(
            state(10, 0, 4).for_dataset(11),
            Err(DataError::DatasetSize { state: 10, actual: 11 })
        ));
    }

    #[test]
    fn micro_batches_cut_the_share_in_order() {
        let s = state(50, 5, 10);
        let m = s.micro_batches(3, 0, 2, 3).unwrap();
        // Rank 0 of 3 reads 4 of every 10: two micro-batches of 2 per step.
        assert_eq!(
            m.iter()
                .map(|x| (x.step, x.micro, x.first_position))
                .collect::<Vec<_>>(),
            vec![(0, 0, 5), (0, 1, 7), (1, 0, 15)]
        );
    }
}

/// The layout-independent part of a job's state that travels with a plan:
/// where the job is in its dataset and its random streams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobState {
    /// Dataset position, if the job has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetState>,
    /// Random-number state, if the job has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<crate::RngState>,
}
