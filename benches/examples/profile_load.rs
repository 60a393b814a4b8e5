//! Times each stage of loading a checkpoint into another layout, as
//! `tenplan-bench executor`'s warm load does: open, plan, check, read.
//!
//! `cargo run --release -p tenplan-bench --example profile_load -- CKPT LAYOUT [REPS]`

use std::time::Instant;

use tenplan::formats::Checkpoint;
use tenplan::models::{ModelState, StateKind};
use tenplan::planner::planner;
use tenplan::ptc::{Cluster, Problem};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = || anyhow::anyhow!("usage: profile_load CKPT LAYOUT [REPS]");
    let dir = args.next().ok_or_else(usage)?;
    let to = args.next().ok_or_else(usage)?;
    let reps: usize = args.next().map_or(Ok(5), |r| r.parse())?;
    let cluster = Cluster::parse("dgx-h100:1")?;
    for _ in 0..reps {
        let mut t = Instant::now();
        let mut laps = Vec::new();
        let mut lap = |what: &'static str| {
            laps.push((what, t.elapsed().as_secs_f64()));
            t = Instant::now();
        };
        let ckpt = Checkpoint::open(std::path::Path::new(&dir))?;
        lap("open");
        let spec = ckpt
            .manifest()
            .model()
            .map_err(anyhow::Error::msg)?
            .ok_or_else(|| anyhow::anyhow!("no model"))?;
        let kind: StateKind = ckpt.manifest().state.as_deref().unwrap_or("weights:f32").parse()?;
        let target = ModelState::new(&spec, kind).layout(&to.parse()?)?;
        let problem = Problem::new(ckpt.layout().clone(), target, cluster.clone())?;
        lap("target");
        let plan = planner("lp")?.plan(&problem)?;
        lap("plan");
        let verified = tenplan::proofs::verify(&plan).map_err(|v| anyhow::anyhow!("{v}"))?;
        lap("verify");
        if std::env::var_os("PLAIN").is_some() {
            use std::os::unix::fs::FileExt;
            let files: Vec<std::fs::File> = ckpt.files().map(std::fs::File::open).collect::<Result<_, _>>()?;
            let lens: Vec<usize> = files
                .iter()
                .map(|f| f.metadata().map(|m| m.len() as usize))
                .collect::<Result<_, _>>()?;
            let mut dst = tenplan::executor::HostBuffer::zeroed(lens.iter().sum());
            lap("alloc");
            if std::env::var_os("TOUCH").is_some() {
                use rayon::prelude::*;
                dst.par_chunks_mut(2 << 20)
                    .for_each(|c| c.iter_mut().step_by(4096).for_each(|b| *b = 1));
                lap("touch");
            }
            let mut jobs = Vec::new();
            let mut rest: &mut [u8] = &mut dst;
            for (f, len) in files.iter().zip(&lens) {
                let (mine, tail) = rest.split_at_mut(*len);
                rest = tail;
                for (i, c) in mine.chunks_mut(8 << 20).enumerate() {
                    jobs.push((f, (i * (8 << 20)) as u64, c));
                }
            }
            use rayon::prelude::*;
            jobs.into_par_iter().try_for_each(|(f, at, c)| f.read_exact_at(c, at))?;
            lap("plain");
            drop(dst);
            lap("free");
        } else {
            let (memory, _) = tenplan::executor::load(&verified, &ckpt)?;
            lap("read");
            drop(memory);
            lap("free");
        }
        #[allow(clippy::print_stdout)]
        {
            println!(
                "{}",
                laps.iter()
                    .map(|(w, s)| format!("{w} {s:.3}"))
                    .collect::<Vec<_>>()
                    .join("  ")
            );
        }
    }
    Ok(())
}
