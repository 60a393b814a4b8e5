//! A digest of every plan of a suite: the proof that a change of the code
//! changed no plan. Each line is scenario, planner, the plan file's length
//! and the xxh3-128 of the plan file (docs/plan-format.md), which holds
//! the problem, every copy in issue order, the fills and the paces.
//!
//! The paper, large and rl suites are planned in this process; the scale
//! suite's rows by `tenplan plan --out` processes (the `tenplan` binary
//! `TENPLAN_BIN` names, so two builds' binaries can be compared).

use std::process::Command;

use anyhow::{bail, Context, Result};
use tenplan::application::assess::plan;
use tenplan::planner::{PlannerSpec, PLANNERS, SYNC_COMPARED};

use crate::{out, scale, scenarios, tenplan_bin};

/// Print the digests of the scale suite's plans at `gpus` GPUs on
/// `fabrics`, each planned by its own `tenplan plan` process.
pub fn scale_digests(gpus: &[u32], fabrics: &[String], planners: &[String]) -> Result<()> {
    let bin = tenplan_bin()?;
    let file = std::env::temp_dir().join(format!("tenplan-digests-{}.json", std::process::id()));
    for f in fabrics {
        for &g in gpus {
            for sc in scenarios::scale_on(g, f)? {
                for p in planners {
                    let mut args = scale::plan_args(&sc, p);
                    args.retain(|a| a != "--json");
                    let o = Command::new(&bin)
                        .args(&args)
                        .arg("--out")
                        .arg(&file)
                        .output()
                        .with_context(|| format!("cannot run {}", bin.display()))?;
                    if !o.status.success() {
                        bail!("{} {}: {}", sc.name, p, String::from_utf8_lossy(&o.stderr).trim());
                    }
                    let json = std::fs::read(&file)?;
                    let d = xxhash_rust::xxh3::xxh3_128(&json);
                    out(&format!("{g}/{f}/{}\t{p}\t{}\t{d:032x}\n", sc.name, json.len()));
                }
            }
        }
    }
    let _ = std::fs::remove_file(&file);
    Ok(())
}

/// Print the digests of `suite`'s plans, one line per (scenario, planner).
pub fn digests(suite: &str) -> Result<()> {
    let all = scenarios::suite(suite)
        .with_context(|| format!("unknown suite `{suite}` (expected paper, large, rl or all)"))?;
    let names = if suite == "rl" { SYNC_COMPARED } else { PLANNERS };
    for sc in all {
        let problem = sc.problem().with_context(|| sc.name.clone())?;
        for name in names {
            let spec: PlannerSpec = name.parse()?;
            let json = plan(&problem, &spec)
                .with_context(|| format!("{} with {name}", sc.name))?
                .plan
                .to_json();
            let d = xxhash_rust::xxh3::xxh3_128(json.as_bytes());
            out(&format!("{}\t{}\t{}\t{:032x}\n", sc.name, name, json.len(), d));
        }
    }
    Ok(())
}
