//! Fuzzing the checkpoint reader: any truncation, extension or byte flip of
//! any file of a checkpoint gives an error or a checkpoint whose contents
//! still match every digest — never a panic, never silently different data.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use tenplan_executor::generate::{fill_region, tensor_key};
use tenplan_formats::checkpoint::{self, Checkpoint, CheckpointInfo};
use tenplan_models::{find, ModelState, StateKind};
use tenplan_ptc::{Cluster, JobState};

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "tenplan-corrupt-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn original() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("original");
        let state = ModelState::new(find("llama-tiny").unwrap(), StateKind::Training);
        let layout = state.layout(&"tp=2,dp=2,zero=1".parse().unwrap()).unwrap();
        let tensors = layout.tensors().clone();
        let info = CheckpointInfo {
            model: Some(tenplan_models::find("llama-tiny").unwrap().clone()),
            config: Some("tp=2,dp=2,zero=1".into()),
            state: Some("training".into()),
            cluster: Cluster::parse("1x4").unwrap(),
            job: JobState::default(),
            hf_config: None,
            scalars: Vec::new(),
        };
        checkpoint::write(
            &dir,
            &layout,
            &info,
            None,
            |b, slab, buf| {
                let t = &tensors[b.tensor as usize];
                fill_region(tensor_key(1, t), t, slab, buf);
                Ok(())
            },
            &|_| {},
        )
        .unwrap();
        dir
    })
}

#[derive(Clone, Debug)]
enum Damage {
    Truncate(f64),
    Extend(u8),
    Flip(f64, u8),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0..1.0f64).prop_map(Damage::Truncate),
        any::<u8>().prop_map(Damage::Extend),
        (0.0..1.0f64, 1..=255u8).prop_map(|(at, x)| Damage::Flip(at, x)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn damaged_files_never_panic_nor_pass_with_other_data(file in 0usize..5, how in damage()) {
        let src = original();
        let dir = scratch("case");
        std::fs::create_dir_all(&dir).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(src)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for n in &names {
            std::fs::copy(src.join(n), dir.join(n)).unwrap();
        }
        let victim = dir.join(&names[file % names.len()]);
        let mut bytes = std::fs::read(&victim).unwrap();
        match how {
            Damage::Truncate(f) => bytes.truncate((bytes.len() as f64 * f) as usize),
            Damage::Extend(x) => bytes.push(x),
            Damage::Flip(f, x) => {
                let i = ((bytes.len() as f64 * f) as usize).min(bytes.len() - 1);
                bytes[i] ^= x;
            }
        }
        std::fs::write(&victim, &bytes).unwrap();
        let outcome = Checkpoint::open(&dir).and_then(|c| c.verify().map(|_| c));
        if let Ok(c) = outcome {
            // Accepted: then it must hold exactly the original tensors.
            let o = Checkpoint::open(src).unwrap();
            prop_assert_eq!(c.digests(), o.digests());
            for t in 0..o.layout().tensors().len() as u32 {
                let a: Vec<(_, _)> = c.boxes(t).iter().map(|b| (b.region.clone(), b.data.to_vec())).collect();
                let b: Vec<(_, _)> = o.boxes(t).iter().map(|b| (b.region.clone(), b.data.to_vec())).collect();
                prop_assert_eq!(a, b);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
