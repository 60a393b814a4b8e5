//! Worker processes on loopback: each device's `tenplan worker` executes its
//! part of a plan over TCP (relays included); every target buffer must equal
//! the reference interpreter's.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tenplan::executor::generate::{fill_region, tensor_key};
use tenplan::models::{find, ModelState, StateKind};
use tenplan::planner::planner;
use tenplan::proofs::materialize;
use tenplan::ptc::{Cluster, Plan, Problem, Region};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenplan-workers-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Free loopback ports, one per device.
fn peers(devices: u32, dir: &Path) -> PathBuf {
    let listeners: Vec<TcpListener> = (0..devices)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let text: String = listeners
        .iter()
        .enumerate()
        .map(|(d, l)| format!("{d} {}\n", l.local_addr().unwrap()))
        .collect();
    let path = dir.join("peers.txt");
    fs::write(&path, text).unwrap();
    path
}

fn spawn(plan: &Path, peers: &Path, device: u32, out: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tenplan"))
        .args(["worker", "--plan"])
        .arg(plan)
        .args(["--peers"])
        .arg(peers)
        .args([
            "--device",
            &device.to_string(),
            "--seed",
            "3",
            "--frame-bytes",
            "512",
            "--out",
        ])
        .arg(out)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (status.code(), String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("worker did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn plan_with_relays() -> Plan {
    let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
    let from = state.layout(&"tp=2,pp=2,dp=2".parse().unwrap()).unwrap();
    let to = state.layout(&"tp=4,dp=2,zero=1".parse().unwrap()).unwrap();
    let problem = Problem::new(from, to, Cluster::parse("2x4").unwrap()).unwrap();
    let mut plan = planner("lp").unwrap().plan(&problem).unwrap();
    // Replicated boxes cross the network once and are forwarded on the node.
    assert!(plan.copies.iter().filter(|c| !c.fanout.is_empty()).count() > 20);
    // Send some copies through one or two relays, as a relayed plan does.
    let mut relayed = 0;
    for (i, c) in plan.copies.iter_mut().enumerate() {
        if c.src != c.dst && i % 3 == 0 {
            let other = |d: u32| (d + 1) % 8;
            let mut via = vec![other(c.dst)];
            if i % 2 == 0 {
                via.insert(0, other(c.src));
            }
            via.retain(|&v| v != c.src && v != c.dst);
            relayed += usize::from(!via.is_empty());
            c.via = via;
        }
    }
    assert!(relayed > 100);
    tenplan::proofs::check(&plan).expect("relays keep the plan valid");
    plan
}

#[test]
fn workers_on_loopback_match_the_interpreter() {
    let dir = scratch("ok");
    let plan = plan_with_relays();
    let plan_path = dir.join("plan.json");
    fs::write(&plan_path, plan.to_json()).unwrap();
    let peers = peers(8, &dir);
    let children: Vec<(u32, Child)> = (0..8)
        .map(|d| {
            (
                d,
                spawn(&plan_path, &peers, d, &dir.join(format!("dev{d}.safetensors")), &[]),
            )
        })
        .collect();
    for (d, child) in children {
        let (code, err) = wait(child, Duration::from_secs(120));
        assert_eq!(code, Some(0), "worker {d}: {err}");
    }
    // The reference: the target layout materialised from the same contents.
    let tensors = plan.problem.tensors();
    let globals: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| {
            let mut g = vec![0u8; t.bytes() as usize];
            fill_region(tensor_key(3, t), t, &Region::full(&t.shape), &mut g);
            g
        })
        .collect();
    let want = materialize(plan.problem.target(), &globals, |_| true);
    for (d, bufs) in &want {
        let bytes = fs::read(dir.join(format!("dev{d}.safetensors"))).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let shard = plan.problem.target().shard_of(*d).unwrap();
        for (b, want) in shard.buffers.iter().zip(bufs) {
            assert_eq!(
                file.tensor(&b.name).unwrap().data(),
                &want[..],
                "device {d} buffer {}",
                b.name
            );
        }
    }
}

#[test]
fn a_missing_peer_is_a_clean_timeout() {
    let dir = scratch("missing");
    let plan = plan_with_relays();
    let plan_path = dir.join("plan.json");
    fs::write(&plan_path, plan.to_json()).unwrap();
    let peers = peers(8, &dir);
    // Only device 0 runs: its sends never connect, nothing arrives.
    let child = spawn(
        &plan_path,
        &peers,
        0,
        &dir.join("dev0.safetensors"),
        &["--timeout", "1"],
    );
    let (code, err) = wait(child, Duration::from_secs(60));
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("error: worker 0: "), "{err}");
    assert!(last.contains("timed out"), "{err}");
    assert!(!dir.join("dev0.safetensors").exists());

    // A tampered plan is refused before any connection.
    let mut bad = plan.clone();
    bad.copies.pop();
    fs::write(&plan_path, bad.to_json()).unwrap();
    let child = spawn(&plan_path, &peers, 0, &dir.join("dev0.safetensors"), &[]);
    let (code, err) = wait(child, Duration::from_secs(60));
    assert_eq!(code, Some(4), "{err}");
    fs::write(&peers, "0 not-an-address\n").unwrap();
    fs::write(&plan_path, plan.to_json()).unwrap();
    let child = spawn(&plan_path, &peers, 0, &dir.join("dev0.safetensors"), &[]);
    let (code, err) = wait(child, Duration::from_secs(60));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("bad address `not-an-address`"), "{err}");
}
