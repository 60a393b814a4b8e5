//! The dataset stream and the random numbers do not depend on the layout.

use proptest::prelude::*;
use tenplan_ptc::{DatasetFields, DatasetState, Purpose, RngState};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn state(n: u64, seed: u64, consumed: u64, batch: u64) -> DatasetState {
    DatasetState::new(DatasetFields {
        dataset_size: n,
        seed,
        consumed,
        global_batch: batch,
    })
    .unwrap()
}

/// What data-parallel ranks 0..dp read in the next `steps` steps, rank after
/// rank within each step, through the micro-batch API.
fn read_by_ranks(s: &DatasetState, dp: u64, micro: u64, steps: u64) -> Vec<Vec<u64>> {
    let mut per_step = vec![Vec::new(); steps as usize];
    for r in 0..dp {
        let (a, b) = s.share(dp, r).unwrap();
        let count = (b - a).div_ceil(micro) * steps;
        for m in s.micro_batches(dp, r, micro, count).unwrap() {
            per_step[m.step as usize].extend(m.samples);
        }
    }
    per_step
}

proptest! {
    #![proptest_config(config())]

    /// D changing at arbitrary steps, global batch constant: the global
    /// batches are those of the job that never changed.
    #[test]
    fn reconfigurations_do_not_change_the_global_batches(
        n in 1u64..200, seed in any::<u64>(), consumed in 0u64..1000, batch in 1u64..40,
        segments in prop::collection::vec((1u64..5, 1u64..40, 1u64..8), 1..6),
    ) {
        let start = state(n, seed, consumed, batch);
        let total: u64 = segments.iter().map(|s| s.0).sum();
        let want = start.global_batches(total).unwrap();
        let mut got = Vec::new();
        let mut s = start;
        for (steps, dp, micro) in segments {
            let dp = dp.min(batch);
            got.extend(read_by_ranks(&s, dp, micro, steps));
            s = s.advance(steps).unwrap();
        }
        prop_assert_eq!(got, want);
        prop_assert_eq!(s.fields().consumed, consumed + total * batch);
    }

    /// The global batch size changing at arbitrary steps: across the whole
    /// run no sample of an epoch is lost or repeated, including across epoch
    /// boundaries.
    #[test]
    fn batch_size_changes_lose_and_repeat_nothing(
        n in 1u64..100, seed in any::<u64>(), epochs_before in 0u64..3,
        segments in prop::collection::vec((1u64..6, 1u64..30, 1u64..5), 1..8),
    ) {
        let mut s = state(n, seed, epochs_before * n, 1);
        let mut stream = Vec::new();
        for (steps, batch, dp) in segments {
            s = s.with_global_batch(batch).unwrap();
            for step in read_by_ranks(&s, dp.min(batch), batch, steps) {
                stream.extend(step);
            }
            s = s.advance(steps).unwrap();
        }
        for epoch in stream.chunks(n as usize) {
            let mut e = epoch.to_vec();
            e.sort_unstable();
            let len = e.len();
            e.dedup();
            prop_assert_eq!(e.len(), len, "a sample repeats within an epoch");
            if len as u64 == n {
                prop_assert_eq!(e, (0..n).collect::<Vec<_>>());
            }
        }
    }

    /// Dropout values for (sample, layer, element) are the same whatever the
    /// data- and tensor-parallel degrees: each rank draws only its samples and
    /// its slice of each activation, by global element index.
    #[test]
    fn random_numbers_do_not_depend_on_the_layout(
        n in 1u64..100, seed in any::<u64>(), batch in 1u64..16, rng_seed in any::<u64>(),
        step in 0u64..100, layers in 1u32..4, width_per_tp in 1u64..6,
        (dp1, tp1, dp2, tp2) in (1u64..8, 0u32..3, 1u64..8, 0u32..3),
    ) {
        let width = width_per_tp * 4; // divisible by tp in {1, 2, 4}
        let data = state(n, seed, 0, batch);
        let rng = RngState { seed: rng_seed, step };
        let draw = |dp: u64, tp: u64| {
            let mut values = std::collections::BTreeMap::new();
            for d in 0..dp.min(batch) {
                for m in data.micro_batches(dp.min(batch), d, batch, 1).unwrap() {
                    for (k, &sample) in m.samples.iter().enumerate() {
                        let position = m.first_position + k as u64;
                        for layer in 0..layers {
                            let stream = rng.stream(Purpose::Dropout { layer }, position, 0);
                            for t in 0..tp {
                                let (a, b) = (t * width / tp, (t + 1) * width / tp);
                                for (i, v) in (a..b).zip(stream.values(a..b)) {
                                    values.insert((sample, position, layer, i), v);
                                }
                            }
                        }
                    }
                }
            }
            values
        };
        let (a, b) = (draw(dp1, 1 << tp1), draw(dp2, 1 << tp2));
        prop_assert_eq!(a.len() as u64, batch * layers as u64 * width);
        prop_assert_eq!(a, b);
    }
}
