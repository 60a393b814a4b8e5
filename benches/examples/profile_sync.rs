//! Times the stages of planning a weight sync (`tenplan sync`, one row of
//! `tenplan-bench suite --suite rl`): the problem, cutting fragments, the cut
//! bound, a greedy plan and the `lp` plan.
//!
//! `cargo run --release -p tenplan-bench --example profile_sync -- MODEL TRAINER ENGINES CLUSTER`
//! e.g. `kimi-k2 tp=8,pp=8,dp=4,ep=4,split=8:8:8:8:8:7:7:7 tp=8,dp=16,devices=256-383 dgx-h100-rail:48`

use std::time::Instant;

use tenplan::application::SyncRequest;
use tenplan::models::find;
use tenplan::planner::{cut_lower_bound, fragments, planner};
use tenplan::ptc::{Cluster, DType};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, trainer, engines, cluster] = &args[..] else {
        anyhow::bail!("usage: profile_sync MODEL TRAINER ENGINES CLUSTER");
    };
    let req = SyncRequest {
        model: find(model)?.clone(),
        trainer: trainer.parse()?,
        engines: engines.parse()?,
        cluster: Cluster::open(cluster)?,
        dtype: DType::BF16,
        trainer_dtype: None,
        planner: "lp".parse()?,
    };
    let mut t = Instant::now();
    let mut lap = |what: &str| {
        #[allow(clippy::print_stdout)]
        {
            println!("{what:<10} {:>9.3} s", t.elapsed().as_secs_f64());
        }
        t = Instant::now();
    };
    let problem = req.problem()?;
    lap("problem");
    let f = fragments(&problem)?;
    lap("fragments");
    #[allow(clippy::print_stdout)]
    {
        println!("           {} fragments", f.len());
    }
    let cut = cut_lower_bound(&problem, &f);
    lap("cut bound");
    #[allow(clippy::print_stdout)]
    {
        println!("           {:.9} s: {}", cut.seconds, cut.reason);
    }
    drop(f);
    let _ = planner("hotspa")?.plan(&problem)?;
    lap("hotspa");
    let _ = planner("lp")?.plan(&problem)?;
    lap("lp");
    Ok(())
}
