//! Times each stage of `tenplan plan` on a problem file: planning, checking,
//! the lower bound's parts (fragments, cuts, messages) and the simulation.
//!
//! `cargo run --release -p tenplan-bench --example profile_stages -- problem.json [planner]`

use std::time::Instant;

use tenplan::planner::{cut_lower_bound, fragments, issue_lower_bound, planner, simulate};
use tenplan::proofs::check;
use tenplan::ptc::Problem;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: profile_stages PROBLEM.json [PLANNER]"))?;
    let name = args.next().unwrap_or_else(|| "hotspa".into());
    let t = Instant::now();
    let problem = Problem::from_json(&std::fs::read_to_string(path)?)?;
    let lap = |what: &str, t: &mut Instant| {
        #[allow(clippy::print_stdout)]
        {
            println!("{what:<10} {:>9.3} s", t.elapsed().as_secs_f64());
        }
        *t = Instant::now();
    };
    let mut t = t;
    lap("load", &mut t);
    let plan = planner(&name)?.plan(&problem)?;
    lap("plan", &mut t);
    check(&plan)?;
    lap("check", &mut t);
    let f = fragments(&problem)?;
    lap("fragments", &mut t);
    let _ = cut_lower_bound(&problem, &f);
    lap("cut bound", &mut t);
    let _ = issue_lower_bound(&problem, &f);
    lap("messages", &mut t);
    let _ = simulate(&plan);
    lap("simulate", &mut t);
    Ok(())
}
