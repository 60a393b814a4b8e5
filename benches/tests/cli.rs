//! The benchmark binary end to end: the demo verifies every plan; the
//! scale suite runs each row as its own `tenplan plan` process, stops
//! runs past their time limit and refuses bad sizes.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `tenplan` binary the scale suite runs: beside this one (a workspace
/// test run builds it).
fn tenplan_bin() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tenplan-bench")).with_file_name("tenplan");
    assert!(
        bin.is_file(),
        "{} is missing: build it (cargo build --bin tenplan; cargo test --workspace does)",
        bin.display()
    );
    bin
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenplan-bench"))
        .args(args)
        .env("TENPLAN_BIN", tenplan_bin())
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
    let dir = std::env::temp_dir().join(format!("tenplan-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn demo_verifies_every_plan() {
    let o = bench(&["demo", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 15 * tenplan::planner::PLANNERS.len());
    assert!(rows.iter().all(|r| r["verified"] == true));
    assert!(rows
        .iter()
        .all(|r| r["makespan_s"].as_f64().unwrap() >= r["lower_bound_s"].as_f64().unwrap() * 0.999));
}

#[test]
fn scale_suite_stops_runs_past_its_time_limit_and_refuses_bad_sizes() {
    // A time limit no run can meet: every row is reported as timed out, the
    // table and the JSON still come out whole.
    let json = tmp("scale.json");
    let o = bench(&[
        "suite",
        "--suite",
        "scale",
        "--gpus",
        "1024",
        "--planners",
        "tenplex",
        "--fabrics",
        "dgx-h100",
        "--timeout",
        "0.001",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("| 1024 | dgx-h100 | llama3-70b/dp-shrink | tenplex | - | - | - | > 0.001 s |"),
        "{out}"
    );
    assert!(
        out.contains("| tenplex | dgx-h100 | 1024 |") && out.contains("| 6 |"),
        "{out}"
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(rows.len(), 6);
    assert!(
        rows.iter()
            .all(|r| r["status"] == "timed out" && r["gpus"] == 1024 && r["fabric"] == "dgx-h100"),
        "{rows:?}"
    );
    for (args, needle) in [
        (&["--gpus", "1000"][..], "multiple of 1024 GPUs, not 1000"),
        (&["--timeout", "0"][..], "--timeout must be a positive number"),
        (&["--planners", "nope"][..], "unknown planner `nope`"),
        (&["--fabrics", "torus"][..], "unknown fabric `torus`"),
    ] {
        let mut all = vec!["suite", "--suite", "scale"];
        all.extend_from_slice(args);
        fails(&bench(&all), 1, needle);
    }
    fails(
        &bench(&["suite", "--suite", "paper", "--gpus", "1024"]),
        1,
        "--gpus, --timeout and --fabrics are options of the scale suite, not of `paper`",
    );
}
