//! End-to-end tests of the `tenplan` command line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn tenplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenplan"))
        .args(args)
        .output()
        .expect("runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A clean failure: the given exit code, no panic, and a last line that is
/// one `error:` line naming the problem.
fn fails(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("error: "), "{err}");
    assert!(last.contains(needle), "expected `{needle}` in: {last}");
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenplan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const SMALL: &[&str] = &[
    "plan",
    "--model",
    "gpt-tiny",
    "--cluster",
    "2x4",
    "--from",
    "tp=2,pp=2,dp=2",
    "--to",
    "tp=4,pp=1,dp=2,zero=1",
];

#[test]
fn plan_prints_a_table_and_json() {
    let o = tenplan(SMALL);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for key in [
        "bytes moved",
        "cross-node bytes",
        "max resource load",
        "simulated makespan",
        "lower bound",
        "verified            yes",
    ] {
        assert!(out.contains(key), "{key} missing in\n{out}");
    }
    let mut args = SMALL.to_vec();
    args.push("--json");
    let o = tenplan(&args);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for key in [
        "planner",
        "bytes_total",
        "bytes_cross_node",
        "makespan_s",
        "lower_bound_s",
        "planning_time_s",
        "verified",
        "copies",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["verified"], true);
    assert!(v["makespan_s"].as_f64().unwrap() >= v["lower_bound_s"].as_f64().unwrap());
}

#[test]
fn plan_files_verify_and_simulate() {
    let path = tmp("plan.json");
    let mut args = SMALL.to_vec();
    args.extend(["--planner", "least-loaded", "--out", path.to_str().unwrap()]);
    assert!(tenplan(&args).status.success());
    let v = tenplan(&["verify", path.to_str().unwrap()]);
    assert!(v.status.success(), "{}", stderr(&v));
    assert!(stdout(&v).starts_with("verified: "));
    let s = tenplan(&["simulate", path.to_str().unwrap(), "--json"]);
    assert!(s.status.success(), "{}", stderr(&s));
    let r: serde_json::Value = serde_json::from_str(&stdout(&s)).unwrap();
    assert_eq!(r["planner"], "least-loaded");
}

#[test]
fn problem_files_give_the_same_plan() {
    let problem = tmp("problem.json");
    let (a, b) = (tmp("direct.json"), tmp("via-problem.json"));
    let mut emit = SMALL.to_vec();
    emit.extend(["--emit-problem", problem.to_str().unwrap()]);
    assert!(tenplan(&emit).status.success());
    let mut direct = SMALL.to_vec();
    direct.extend(["--out", a.to_str().unwrap()]);
    assert!(tenplan(&direct).status.success());
    let o = tenplan(&[
        "plan",
        "--problem",
        problem.to_str().unwrap(),
        "--out",
        b.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}

#[test]
fn bad_models_and_layouts_fail_cleanly() {
    fails(
        &tenplan(&["plan", "--model", "gpt5", "--from", "tp=1", "--to", "tp=2"]),
        1,
        "unknown model `gpt5`",
    );
    fails(
        &tenplan(&["plan", "--model", "gpt3-6.7b", "--from", "tp=4,pp=2", "--to", "tp=3"]),
        1,
        "tp=3 does not divide the 32 attention heads (num_attention_heads) of gpt3-6.7b",
    );
    fails(
        &tenplan(&["plan", "--model", "gpt3-6.7b", "--from", "tp=four", "--to", "tp=2"]),
        1,
        "malformed layout `tp=four`",
    );
    fails(
        &tenplan(&[
            "plan",
            "--model",
            "gpt3-6.7b",
            "--from",
            "tp=4,pp=4,dp=2",
            "--to",
            "tp=2",
        ]),
        1,
        "has 16 devices",
    );
    fails(
        &tenplan(&[
            "plan",
            "--model",
            "gpt3-6.7b",
            "--from",
            "tp=4,devices=0-7",
            "--to",
            "tp=2",
        ]),
        1,
        "= 4 ranks, but 8 devices were given",
    );
    fails(
        &tenplan(&[
            "plan",
            "--model",
            "gpt3-6.7b",
            "--from",
            "tp=4",
            "--to",
            "tp=2",
            "--cluster",
            "4y4",
        ]),
        1,
        "unknown cluster",
    );
    fails(
        &tenplan(&[
            "plan",
            "--model",
            "gpt-tiny",
            "--from",
            "tp=1",
            "--to",
            "tp=2",
            "--planner",
            "magic",
        ]),
        1,
        "unknown planner",
    );
    fails(
        &tenplan(&[
            "plan", "--model", "gpt-tiny", "--from", "tp=1", "--to", "tp=2", "--dead", "99",
        ]),
        1,
        "device 99 in --dead 99 does not exist",
    );
    fails(
        &tenplan(&[
            "plan", "--model", "gpt-tiny", "--from", "tp=1", "--to", "tp=2", "--dead", "1",
        ]),
        1,
        "dead device 1",
    );
    fails(
        &tenplan(&["plan", "--model", "mixtral-8x7b", "--from", "ep=3,dp=3", "--to", "tp=2"]),
        1,
        "ep=3 does not divide the 8 experts",
    );
}

#[test]
fn lost_state_is_reported_as_infeasible() {
    let o = tenplan(&[
        "plan",
        "--model",
        "gpt-tiny",
        "--cluster",
        "2x4",
        "--from",
        "tp=2,dp=1",
        "--to",
        "tp=2,devices=4-5",
        "--dead",
        "0",
    ]);
    fails(&o, 3, "no plan exists");
    assert!(stderr(&o).contains("held only by dead devices [0]"));
}

#[test]
fn broken_plan_files_fail_cleanly() {
    let junk = tmp("junk.json");
    std::fs::write(&junk, "this is not json").unwrap();
    fails(
        &tenplan(&["verify", junk.to_str().unwrap()]),
        1,
        "not a valid plan file",
    );
    fails(&tenplan(&["verify", "/nonexistent/plan.json"]), 1, "cannot read");
    let truncated = tmp("truncated.json");
    let path = tmp("good.json");
    let mut args = SMALL.to_vec();
    args.extend(["--out", path.to_str().unwrap()]);
    assert!(tenplan(&args).status.success());
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    fails(
        &tenplan(&["verify", truncated.to_str().unwrap()]),
        1,
        "not a valid plan file",
    );
    let future = tmp("future.json");
    std::fs::write(&future, text.replacen("\"version\":1", "\"version\":9", 1)).unwrap();
    fails(
        &tenplan(&["verify", future.to_str().unwrap()]),
        1,
        "version 9 is not supported",
    );

    let mut plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    // An out-of-bounds box.
    let mut oob = plan.clone();
    oob["copies"][0]["box"][0][1] = 1_000_000.into();
    let p = tmp("oob.json");
    std::fs::write(&p, oob.to_string()).unwrap();
    // Out-of-range indices make the file invalid before any checking (exit 1).
    fails(&tenplan(&["verify", p.to_str().unwrap()]), 1, "outside tensor");
    fails(&tenplan(&["simulate", p.to_str().unwrap()]), 1, "outside tensor");
    // A doubly written element.
    let first = plan["copies"][0].clone();
    plan["copies"].as_array_mut().unwrap().push(first);
    let p = tmp("double.json");
    std::fs::write(&p, plan.to_string()).unwrap();
    fails(&tenplan(&["verify", p.to_str().unwrap()]), 4, "written twice");
}

#[test]
fn models_lists_every_family() {
    let out = stdout(&tenplan(&["models"]));
    for m in ["gpt3-175b", "llama2-70b", "llama3-8b", "mixtral-8x7b"] {
        assert!(out.contains(m), "{m}");
    }
}

/// The benchmarks left the product: the old commands say where they went.
#[test]
fn benchmarks_moved_to_their_own_binary() {
    for (old, new) in [
        ("demo", "tenplan-bench demo"),
        ("bench", "tenplan-bench suite"),
        ("bench-switch", "tenplan-bench switch"),
        ("bench-executor", "tenplan-bench executor"),
    ] {
        fails(&tenplan(&[old, "--json"]), 1, new);
    }
}

#[test]
fn data_shows_a_ranks_samples_and_rejects_bad_states() {
    let o = tenplan(&[
        "data",
        "--state",
        "dataset_size=100,seed=3,consumed=0,global_batch=8",
        "--layout",
        "dp=4",
        "--rank",
        "3",
        "--steps",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[1]["first_position"], 14);
    fails(
        &tenplan(&[
            "data",
            "--state",
            "dataset_size=100,seed=3,consumed=0,global_batch=2",
            "--layout",
            "dp=4",
            "--rank",
            "0",
        ]),
        1,
        "dp=4 is larger than the global batch of 2",
    );
    fails(
        &tenplan(&[
            "data",
            "--state",
            "dataset_size=100,seed=3,consumed=0,global_batch=8",
            "--layout",
            "dp=2",
            "--rank",
            "0",
            "--dataset-size",
            "99",
        ]),
        1,
        "state is for a dataset of 100 samples, but this dataset has 99",
    );
    let bad = tmp("negative-state.json");
    std::fs::write(&bad, r#"{"dataset_size":100,"seed":1,"consumed":-5,"global_batch":8}"#).unwrap();
    fails(
        &tenplan(&[
            "data",
            "--state",
            bad.to_str().unwrap(),
            "--layout",
            "dp=2",
            "--rank",
            "0",
        ]),
        1,
        "not a valid dataset state",
    );
    fails(
        &tenplan(&[
            "data",
            "--state",
            "dataset_size=100,seed=3,consumed=18446744073709551610,global_batch=8",
            "--layout",
            "dp=2",
            "--rank",
            "0",
        ]),
        1,
        "overflows 64 bits",
    );
}

#[test]
fn plans_carry_the_job_state() {
    let job = tmp("job.json");
    std::fs::write(
        &job,
        r#"{"dataset":{"dataset_size":1000,"seed":1,"consumed":640,"global_batch":64},"rng":{"seed":9,"step":10}}"#,
    )
    .unwrap();
    let path = tmp("with-job.json");
    let mut args = SMALL.to_vec();
    args.extend(["--job", job.to_str().unwrap(), "--out", path.to_str().unwrap()]);
    let o = tenplan(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(plan["problem"]["job"]["dataset"]["consumed"], 640);
    assert_eq!(plan["problem"]["job"]["rng"]["step"], 10);
    assert!(tenplan(&["verify", path.to_str().unwrap()]).status.success());
}

#[test]
fn switch_orders_strategies_within_a_memory_budget() {
    let base = [
        "switch",
        "--model",
        "llama-tiny",
        "--cluster",
        "1x4",
        "--configs",
        "tp=1,dp=4",
        "tp=2,dp=2",
        "tp=4,dp=1",
    ];
    let o = tenplan(&[&base[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let order: Vec<&str> = v["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(order.len(), 4);
    assert_eq!((order[0], order[3]), ("tp=1,dp=4", "tp=1,dp=4"));
    assert_eq!(v["switches"].as_array().unwrap().len(), 3);
    let total: f64 = v["switches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["makespan_s"].as_f64().unwrap())
        .sum();
    assert!((total - v["total_s"].as_f64().unwrap()).abs() < 1e-12);
    for s in v["switches"].as_array().unwrap() {
        assert!(s["makespan_s"].as_f64().unwrap() >= s["lower_bound_s"].as_f64().unwrap() * (1.0 - 1e-9));
    }
    assert!(v["cached_lookup_ns"].as_f64().unwrap() > 0.0);
    // Gradients too: more bytes per step.
    let g = tenplan(&[&base[..], &["--state", "params+grads", "--json"]].concat());
    let gv: serde_json::Value = serde_json::from_str(&stdout(&g)).unwrap();
    assert!(gv["bytes_moved"].as_u64().unwrap() > v["bytes_moved"].as_u64().unwrap());
    // A budget no switch fits, and a bad state, fail cleanly.
    fails(
        &tenplan(&[&base[..], &["--memory-budget", "1KB"]].concat()),
        1,
        "memory budget",
    );
    fails(
        &tenplan(&[&base[..], &["--state", "optimizer"]].concat()),
        1,
        "unknown state",
    );
    fails(
        &tenplan(&[&base[..], &["--memory-budget", "lots"]].concat()),
        1,
        "bad byte count",
    );
    // A budget between the cheapest and dearest switch keeps the step feasible.
    let peak = v["peak_device_bytes"].as_u64().unwrap();
    let ok = tenplan(&[&base[..], &["--memory-budget", &peak.to_string(), "--json"]].concat());
    assert!(ok.status.success(), "{}", stderr(&ok));
    let t = tenplan(&base);
    assert!(stdout(&t).contains("a cached switch is returned in"), "{}", stdout(&t));
}

#[test]
fn integral_plans_report_their_gap() {
    let o = tenplan(&[SMALL, &["--integral", "--json", "--time-limit", "5"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["planner"], "lp-integral");
    assert_eq!(v["verified"], true);
    assert!(v["mip"]["gap"].as_f64().unwrap() >= -1e-9);
    assert!(["optimal", "time limit (best found)"].contains(&v["mip"]["status"].as_str().unwrap()));
    let t = tenplan(&[SMALL, &["--integral"]].concat());
    assert!(stdout(&t).contains("MIP: "), "{}", stdout(&t));
    fails(
        &tenplan(&[SMALL, &["--integral", "--planner", "hotspa"]].concat()),
        1,
        "--integral is its own planner",
    );
}

#[test]
fn staging_budget_splits_plans_into_rounds() {
    let o = tenplan(&[SMALL, &["--staging-budget", "4KB", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["rounds"].as_u64().unwrap() > 1, "{v}");
    assert_eq!(v["verified"], true);
    fails(
        &tenplan(&[SMALL, &["--staging-budget", "2B"]].concat()),
        1,
        "smaller than one element",
    );
    fails(
        &tenplan(&[SMALL, &["--staging-budget", "much"]].concat()),
        1,
        "bad byte count",
    );
}

#[test]
fn a_checkpoint_on_storage_recovers_lost_state() {
    let lost = [
        "plan",
        "--model",
        "gpt-tiny",
        "--cluster",
        "2x4",
        "--from",
        "tp=2,pp=2",
        "--to",
        "tp=2,pp=2,devices=4-7",
        "--dead",
        "0-3",
    ];
    fails(&tenplan(&lost), 3, "no plan exists");
    let o = tenplan(&[&lost[..], &["--storage", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["verified"], true);
    assert!(v["bytes_cross_node"].as_u64().unwrap() > 0);
    // Every planner reads what it must from the store (device 8).
    for p in ["tenplex", "least-loaded", "hotspa", "central", "lp-placed"] {
        let path = tmp(&format!("storage-{p}.json"));
        let o = tenplan(
            &[
                &lost[..],
                &["--storage", "--planner", p, "--out", path.to_str().unwrap()],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{p}: {}", stderr(&o));
        let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(plan["copies"].as_array().unwrap().iter().all(|c| c["src"] == 8), "{p}");
        assert!(tenplan(&["verify", path.to_str().unwrap()]).status.success());
    }
}

#[test]
fn multicast_can_be_turned_off_for_comparison() {
    let args = [
        "plan",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "2x4",
        "--from",
        "tp=2",
        "--to",
        "tp=2,dp=2,devices=4-7",
        "--state",
        "weights",
        "--json",
    ];
    let cross = |extra: &[&str]| -> f64 {
        let o = tenplan(&[&args[..], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["bytes_cross_node"].as_f64().unwrap()
    };
    let (multicast, unicast) = (cross(&[]), cross(&["--no-multicast"]));
    assert!((unicast / multicast - 2.0).abs() < 0.01, "{unicast} vs {multicast}");
    fails(
        &tenplan(&[&args[..], &["--planner", "tenplex", "--no-multicast"]].concat()),
        1,
        "--no-multicast needs the lp planner",
    );
}

#[test]
fn forwarding_across_the_cluster_lets_replicas_feed_each_other() {
    // One node of two devices to four replicas, a node each: within nodes
    // the source node sends the weights four times; across the cluster it
    // sends them once and the replicas forward them.
    let args = [
        "plan",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "5x2",
        "--from",
        "tp=2",
        "--to",
        "tp=2,dp=4,devices=2-9",
        "--state",
        "weights",
        "--json",
    ];
    let run = |extra: &[&str]| -> (f64, f64) {
        let o = tenplan(&[&args[..], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["verified"], true);
        (v["makespan_s"].as_f64().unwrap(), v["lower_bound_s"].as_f64().unwrap())
    };
    let (within, within_bound) = run(&[]);
    for planner in ["lp", "trees"] {
        let (across, bound) = run(&["--forwarding", "cluster", "--planner", planner]);
        assert!(bound < within_bound / 3.0, "{bound} vs {within_bound}");
        assert!(
            across < within / 3.0 && across >= bound,
            "{planner}: {across} vs {within}"
        );
    }
    fails(
        &tenplan(&[&args[..], &["--forwarding", "everywhere"]].concat()),
        1,
        "--forwarding: unknown `everywhere`",
    );
    // A problem file keeps it, and a file naming no such forwarding fails.
    let problem = tmp("forwarding-problem.json");
    let emit = [
        &args[..],
        &["--forwarding", "cluster", "--emit-problem", problem.to_str().unwrap()],
    ]
    .concat();
    assert!(tenplan(&emit).status.success());
    let text = std::fs::read_to_string(&problem).unwrap();
    assert!(text.contains("\"forwarding\": \"cluster\""), "{text}");
    let o = tenplan(&[
        "plan",
        "--problem",
        problem.to_str().unwrap(),
        "--planner",
        "trees",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(
        (v["makespan_s"].as_f64().unwrap() - run(&["--forwarding", "cluster", "--planner", "trees"]).0).abs() < 1e-12
    );
    let bad = text.replace("\"forwarding\": \"cluster\"", "\"forwarding\": \"everywhere\"");
    std::fs::write(&problem, bad).unwrap();
    fails(
        &tenplan(&["plan", "--problem", problem.to_str().unwrap()]),
        1,
        "unknown variant `everywhere`",
    );
}

/// A topology file written by `tenplan topology` poses the same problem as
/// the preset it came from; an oversubscribed spine prices a plan that
/// crosses it; a broken file is one clear error naming the element.
#[test]
fn topology_files_round_trip_and_price_the_spine() {
    let o = tenplan(&["topology", "--cluster", "dgx-h100-rail-2to1:64"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("tier 1: 16 switches, uplink 800.00 GB/s, 2.00:1 oversubscribed"),
        "{}",
        stdout(&o)
    );
    let file = tmp("rail.json");
    let o = tenplan(&[
        "topology",
        "--cluster",
        "dgx-h100-rail-2to1:8",
        "--out",
        file.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = |cluster: &str, planner: &str| -> serde_json::Value {
        let o = tenplan(&[
            "plan",
            "--model",
            "llama3-8b",
            "--cluster",
            cluster,
            "--from",
            "tp=8,dp=8",
            "--to",
            "tp=4,pp=2,dp=6",
            "--planner",
            planner,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let key = |v: &serde_json::Value| (v["makespan_s"].clone(), v["lower_bound_s"].clone(), v["copies"].clone());
    let from_file = plan(file.to_str().unwrap(), "lp");
    assert_eq!(key(&from_file), key(&plan("dgx-h100-rail-2to1:8", "lp")));
    // Least-loaded ignores the fabric and pays for it at 2:1; the LP
    // routes around it and stays at its bound.
    let flat = plan("dgx-h100:8", "least-loaded");
    let spine = plan("dgx-h100-rail-2to1:8", "least-loaded");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(
        f(&spine, "makespan_s") > f(&flat, "makespan_s") * 1.05,
        "{spine} vs {flat}"
    );
    assert!(
        f(&from_file, "makespan_s") <= f(&from_file, "lower_bound_s") * 1.05,
        "{from_file}"
    );
    assert!(
        f(&from_file, "makespan_s") * 5.0 < f(&spine, "makespan_s"),
        "{from_file} vs {spine}"
    );

    let text = std::fs::read_to_string(&file).unwrap();
    for (from, to, needle) in [
        (
            r#""to": "su0-rail3""#,
            r#""to": "su9-rail3""#,
            "`su9-rail3` is neither a switch nor a NIC",
        ),
        (
            r#""capacity": 200000000000.0"#,
            r#""capacity": 0.0"#,
            "capacity 0 must be positive",
        ),
        (
            r#""from": "node3/nic7""#,
            r#""from": "node3/gpu7""#,
            "link a NIC instead of `node3/gpu7`",
        ),
        (
            r#""from": "node3/nic7""#,
            r#""from": "node9/nic7""#,
            "names node `node9`",
        ),
        (
            r#""name": "spine""#,
            r#""name": "spine", "bogus": 1"#,
            "unknown field `bogus`",
        ),
    ] {
        assert!(text.contains(from), "{from} not in the topology file");
        let bad = tmp("bad.json");
        std::fs::write(&bad, text.replacen(from, to, 1)).unwrap();
        fails(
            &tenplan(&[
                "plan",
                "--model",
                "gpt3-1.3b",
                "--cluster",
                bad.to_str().unwrap(),
                "--from",
                "tp=8",
                "--to",
                "tp=4",
            ]),
            1,
            needle,
        );
    }
    // A cycle among switches.
    let cyc = text.replacen(
        r#""from": "su0-rail0","#,
        r#""from": "spine", "to": "su0-rail1", "capacity": 1.0}, {"from": "su0-rail0","#,
        1,
    );
    let bad = tmp("cycle.json");
    std::fs::write(&bad, cyc).unwrap();
    fails(
        &tenplan(&["topology", "--cluster", bad.to_str().unwrap()]),
        1,
        "its own ancestor",
    );
}
