//! One test body, every back end: the same verified plans performed on host
//! memory, as per-device message-passing programs (what the torch.distributed
//! executor runs), on checkpoint files (load and reshard) and on CUDA devices
//! (when this build and machine have them) must all give the interpreter's bytes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use tenplan_executor::{
    cuda_device_count, execute, load, reshard, run_programs, run_programs_with, CudaExecutor, HostMemory,
};
use tenplan_formats::checkpoint::{self, Checkpoint, CheckpointInfo};
use tenplan_planner::{planner, PLANNERS};
use tenplan_proofs::strategies::healthy_problems;
use tenplan_proofs::{addends, materialize, random_tensors, verify, State};
use tenplan_ptc::{read_box, JobState, Problem, Region, SourceBox};

fn scratch() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tenplan-backends-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Write the source state of `problem` (from `globals`) as a checkpoint.
fn write_source(problem: &Problem, globals: &[Vec<u8>], dir: &std::path::Path) -> Checkpoint {
    let tensors = problem.tensors();
    let whole: Vec<Region> = tensors.iter().map(|t| Region::full(&t.shape)).collect();
    let info = CheckpointInfo {
        model: None,
        config: None,
        state: None,
        cluster: problem.cluster().clone(),
        job: JobState::default(),
        hf_config: None,
        scalars: Vec::new(),
    };
    checkpoint::write(
        dir,
        problem.source(),
        &info,
        None,
        |b, slab, buf| {
            let t = b.tensor as usize;
            let src = [SourceBox {
                tensor: b.tensor,
                region: &whole[t],
                data: &globals[t],
                file: None,
            }];
            read_box(&src, slab, buf, tensors[t].dtype.size() as usize);
            Ok(())
        },
        &|_| {},
    )
    .unwrap();
    Checkpoint::open(dir).unwrap()
}

/// Every back end on one problem; returns how many ran.
fn every_backend(problem: &Problem, seed: u64, planners: &[&str]) -> Result<usize, TestCaseError> {
    let mut globals = random_tensors(problem.tensors(), seed);
    let mut source = materialize(problem.source(), &globals, |_| true);
    addends(problem.source(), &mut globals, &mut source, seed);
    let host = HostMemory::from_buffers(problem.source(), source).unwrap();
    // Checkpoints hold reduced state: partial state is not stored. On a GPU
    // the box_reduce kernel adds it; driver copies alone cannot.
    let partial = (0..problem.tensors().len() as u32).any(|t| problem.source().is_partial(t));
    let dir = scratch();
    let ckpt = (!partial).then(|| {
        let c = write_source(problem, &globals, &dir.join("src"));
        c.verify().unwrap();
        c
    });
    let gpu = (cuda_device_count() > 0).then(|| {
        let kernel = CudaExecutor::new().unwrap();
        assert!(kernel.uses_kernel(), "the driver refused the box-copy kernel's PTX");
        [kernel, CudaExecutor::new().unwrap().with_driver_copies()]
    });
    let mut ran = 0;
    for name in planners {
        let plan = planner(name).unwrap().plan(problem).unwrap();
        let want: State = materialize(plan.problem.target(), &globals, |_| true);
        let verified = verify(&plan).unwrap();
        // Host memory.
        prop_assert_eq!(
            &execute(&verified, &host).unwrap().into_buffers(),
            &want,
            "host, {}",
            name
        );
        // Per-device programs, by message passing.
        prop_assert_eq!(
            &run_programs(&verified, &host).unwrap().into_buffers(),
            &want,
            "programs, {}",
            name
        );
        // Every message that saves a copy by travelling alone does.
        prop_assert_eq!(
            &run_programs_with(&verified, &host, 0).unwrap().into_buffers(),
            &want,
            "programs with messages alone, {}",
            name
        );
        // Files: load into memory, and reshard into a new checkpoint.
        if let Some(ckpt) = &ckpt {
            let (loaded, _) = load(&verified, ckpt).unwrap();
            prop_assert_eq!(&loaded.into_buffers(), &want, "files, {}", name);
            let out = dir.join(name);
            let info = CheckpointInfo {
                model: None,
                config: None,
                state: None,
                cluster: plan.problem.cluster().clone(),
                job: JobState::default(),
                hf_config: None,
                scalars: Vec::new(),
            };
            let r = reshard(&verified, ckpt, &out, &info, &|_| {}).unwrap();
            prop_assert_eq!(r.bytes_read, r.written.data_bytes);
            Checkpoint::open(&out).unwrap().verify().unwrap();
        }
        // CUDA.
        for (gpu, path) in gpu.iter().flatten().zip(["kernel", "driver copies"]) {
            match gpu.execute(&verified, &host) {
                Err(e) if partial && !gpu.uses_kernel() => {
                    prop_assert!(e.to_string().contains("box_reduce"), "{}", e)
                }
                run => prop_assert_eq!(&run.unwrap().target.into_buffers(), &want, "cuda ({}), {}", path, name),
            }
        }
        ran += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ran)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_backend_matches_the_interpreter(problem in healthy_problems(), seed in any::<u64>()) {
        every_backend(&problem, seed, PLANNERS)?;
    }
}

#[test]
fn a_model_reshard_on_every_backend() {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_ptc::Cluster;
    let state = ModelState::new(find("mixtral-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=2,ep=2,zero=1".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=1,pp=2,dp=4,ep=4".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
    assert_eq!(every_backend(&problem, 9, &["lp", "least-loaded"]).unwrap(), 2);
}

/// Gradients held as addends on 8 data-parallel ranks and reduced by the
/// plan: on a GPU, several waves of the box_reduce kernel, addends staged
/// between GPUs where there are several.
#[test]
fn partial_gradients_on_every_backend() {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_ptc::Cluster;
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::WeightsAndGrads);
    let grads = |t: u32| state.tensors()[t as usize].name.starts_with("grad.");
    let from = state
        .layout(&"tp=2,dp=4".parse().unwrap())
        .unwrap()
        .with_partial(grads)
        .unwrap();
    let to = state.layout(&"tp=4,dp=2".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
    assert_eq!(every_backend(&problem, 21, PLANNERS).unwrap(), PLANNERS.len());
}

/// Relays, multicast forwards and staging rounds, as the lp planner makes
/// them across nodes, performed as per-device programs.
#[test]
fn programs_relay_forward_and_stage() {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_planner::issue::stage;
    use tenplan_ptc::{Cluster, DType};
    let state = ModelState::new(find("llama-tiny").unwrap(), StateKind::Weights(DType::BF16));
    // Weights on one node, wanted by every device of two more: the lp
    // planner sends each box across the network once per node and forwards
    // it over NVLink.
    let from = state.layout(&"tp=2,dp=1,devices=0-1".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=2,dp=4,devices=4-11".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("3x4").unwrap()).unwrap();
    let globals = random_tensors(problem.tensors(), 5);
    let host = HostMemory::from_buffers(problem.source(), materialize(problem.source(), &globals, |_| true)).unwrap();
    let want = materialize(problem.target(), &globals, |_| true);
    let plan = planner("lp").unwrap().plan(&problem).unwrap();
    assert!(plan.copies.iter().any(|c| !c.fanout.is_empty()), "the plan multicasts");
    let staged = stage(&plan, 4 << 10).unwrap();
    assert!(staged.copies.iter().any(|c| c.round > 0), "the plan is staged");
    for plan in [&plan, &staged] {
        let verified = verify(plan).unwrap();
        assert_eq!(run_programs(&verified, &host).unwrap().into_buffers(), want);
        assert_eq!(run_programs_with(&verified, &host, 0).unwrap().into_buffers(), want);
    }
}

/// checkpoint-engine's broadcast: chains through every engine device, whose
/// relays keep what they need as it passes, on every back end.
#[test]
fn a_broadcast_chain_on_every_backend() {
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_ptc::{Cluster, DType, Forwarding};
    let state = ModelState::new(find("mixtral-tiny").unwrap(), StateKind::Weights(DType::BF16));
    let from = state.layout(&"tp=2,dp=2".parse().unwrap()).unwrap();
    let to = state
        .serving_layout(&"tp=2,dp=4,devices=4-11".parse().unwrap())
        .unwrap();
    let problem = Problem::new(from, to, Cluster::parse("3x4").unwrap())
        .unwrap()
        .with_forwarding(Forwarding::Cluster);
    let plan = planner("broadcast").unwrap().plan(&problem).unwrap();
    assert!(plan.copies.iter().any(|c| c.fanout.iter().any(|f| f.in_passing)));
    assert_eq!(every_backend(&problem, 13, &["broadcast"]).unwrap(), 1);
}

/// With `TENPLAN_REQUIRE_CUDA=1` (set where a GPU is known to be present)
/// a missing GPU fails the run instead of skipping the CUDA back end.
#[test]
fn cuda_runs_or_says_why_not() {
    match CudaExecutor::new() {
        Ok(gpu) => assert!(gpu.gpus() > 0),
        Err(e) if std::env::var_os("TENPLAN_REQUIRE_CUDA").is_some_and(|v| v == "1") => {
            panic!("TENPLAN_REQUIRE_CUDA=1, and the CUDA back end cannot run: {e}")
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("--features cuda") || msg.contains("no CUDA driver"),
                "unexpected: {msg}"
            );
            #[allow(clippy::print_stderr)]
            {
                eprintln!("skipping the CUDA back end: {msg}");
            }
        }
    }
}
