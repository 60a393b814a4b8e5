//! The crates' layering, checked over `cargo metadata`: the libraries are
//! siblings on a common base (`ptc`), one application layer sits above
//! them, and the faces (the command line, the Python package, the
//! benchmarks, the fuzzer) sit on top. A crate that reaches upward, or a
//! library other than the planner that pulls in the LP solver, fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each library crate and the workspace crates it may depend on
/// (normal dependencies, transitively). Tests may use more (dev-dependencies).
const ALLOWED: &[(&str, &[&str])] = &[
    ("tenplan-ptc", &[]),
    ("tenplan-models", &["tenplan-ptc"]),
    ("tenplan-proofs", &["tenplan-ptc"]),
    ("tenplan-planner", &["tenplan-ptc"]),
    ("tenplan-formats", &["tenplan-ptc", "tenplan-models"]),
    (
        "tenplan-executor",
        &["tenplan-ptc", "tenplan-proofs", "tenplan-formats", "tenplan-models"],
    ),
    (
        "tenplan-application",
        &[
            "tenplan-ptc",
            "tenplan-models",
            "tenplan-proofs",
            "tenplan-planner",
            "tenplan-formats",
            "tenplan-executor",
        ],
    ),
];

/// The faces: nothing else may depend on them.
const FACES: &[&str] = &["tenplan", "tenplan-python", "tenplan-bench", "tenplan-fuzz"];

/// The LP solver: the planner's alone (and what stands above it).
const SOLVER: &[&str] = &["highs", "highs-sys", "good_lp"];

/// Every package's normal dependencies, by name, from `cargo metadata`.
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let run = |extra: &[&str]| {
        Command::new(&cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .args(extra)
            .output()
            .expect("cargo runs")
    };
    // Offline first: the index is cached by the build that ran this test.
    let mut out = run(&["--offline"]);
    if !out.status.success() {
        out = run(&[]);
    }
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let name = names[node["id"].as_str().unwrap()].to_string();
        let normal = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null()));
        let entry = deps.entry(name).or_default();
        for d in normal {
            entry.insert(names[d["pkg"].as_str().unwrap()].to_string());
        }
    }
    deps
}

/// Everything `from` depends on, transitively.
fn closure(deps: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = deps.get(from).into_iter().flatten().map(String::as_str).collect();
    while let Some(d) = stack.pop() {
        if seen.insert(d.to_string()) {
            stack.extend(deps.get(d).into_iter().flatten().map(String::as_str));
        }
    }
    seen
}

#[test]
fn libraries_are_siblings_under_one_application_layer() {
    let deps = normal_dependencies();
    let ours: BTreeSet<&str> = ALLOWED.iter().map(|(n, _)| *n).chain(FACES.iter().copied()).collect();
    for (crate_name, allowed) in ALLOWED {
        let reach = closure(&deps, crate_name);
        let internal: BTreeSet<&str> = reach.iter().map(String::as_str).filter(|d| ours.contains(d)).collect();
        let extra: Vec<&&str> = internal.iter().filter(|d| !allowed.contains(d)).collect();
        assert!(
            extra.is_empty(),
            "{crate_name} depends on {extra:?}; it may depend on {allowed:?} only"
        );
        if *crate_name != "tenplan-planner" && *crate_name != "tenplan-application" {
            let solver: Vec<&String> = reach.iter().filter(|d| SOLVER.contains(&d.as_str())).collect();
            assert!(
                solver.is_empty(),
                "{crate_name} pulls in the LP solver through {solver:?}"
            );
        }
    }
    for (name, direct) in deps.iter().filter(|(n, _)| !FACES.contains(&n.as_str())) {
        let faces: Vec<&String> = direct.iter().filter(|d| FACES.contains(&d.as_str())).collect();
        assert!(faces.is_empty(), "{name} depends on the faces {faces:?}");
    }
}

#[test]
fn the_planner_and_the_executor_stay_apart() {
    let deps = normal_dependencies();
    let executor = closure(&deps, "tenplan-executor");
    assert!(!executor.contains("tenplan-planner"), "{executor:?}");
    let planner = closure(&deps, "tenplan-planner");
    for other in [
        "tenplan-models",
        "tenplan-proofs",
        "tenplan-executor",
        "tenplan-formats",
    ] {
        assert!(!planner.contains(other), "the planner depends on {other}");
    }
}
