//! Named reconfiguration scenarios, such as those of the Tenplex paper.

use tenplan_ptc::{Cluster, DeviceId, Problem};

use crate::{find, ModelState, ParallelConfig, Result, StateKind};

/// A reconfiguration of a model's state on a cluster.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name for reports, such as `gpt3-1.3b/scale-up-dp`.
    pub name: String,
    /// Model name.
    pub model: &'static str,
    /// State moved.
    pub state: StateKind,
    /// Cluster description (see `Cluster::parse`).
    pub cluster: &'static str,
    /// Devices dead when the reconfiguration starts.
    pub dead: Vec<DeviceId>,
    /// Layout before.
    pub from: ParallelConfig,
    /// Layout after.
    pub to: ParallelConfig,
}

impl Scenario {
    /// The problem this scenario poses.
    pub fn problem(&self) -> Result<Problem> {
        let state = ModelState::new(find(self.model)?, self.state);
        let cluster = Cluster::parse(self.cluster)?.with_dead(self.dead.iter().copied())?;
        Ok(Problem::new(
            state.layout(&self.from)?,
            state.layout(&self.to)?,
            cluster,
        )?)
    }
}

fn cfg(s: &str) -> ParallelConfig {
    s.parse().expect("scenario layouts are well-formed")
}

/// The Tenplex paper's scenarios (SOSP'24, §6) on its 4×4 on-premise
/// cluster, for GPT-3 1.3B, 2.7B and 6.7B with mixed precision and Adam
/// state, as (tp, pp, dp): scale-up by data (4,2,1)→(4,2,2), pipeline
/// (4,2,1)→(4,4,1) and model (tensor) parallelism (4,2,1)→(8,2,1);
/// redeployment of (4,2,1) from hosts 0–1 to hosts 2–3; and recovery from the
/// failure of host 0's four GPUs, (4,2,2)→(4,2,1) on devices 4–11.
pub fn paper() -> Vec<Scenario> {
    let mut out = Vec::new();
    for model in ["gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b"] {
        let base = || cfg("tp=4,pp=2,dp=1");
        let mut add = |kind: &str, from: ParallelConfig, to: ParallelConfig, dead: Vec<DeviceId>| {
            out.push(Scenario {
                name: format!("{model}/{kind}"),
                model,
                state: StateKind::Training,
                cluster: "tenplex-onprem",
                dead,
                from,
                to,
            })
        };
        add("scale-up-dp", base(), cfg("tp=4,pp=2,dp=2"), vec![]);
        add("scale-up-pp", base(), cfg("tp=4,pp=4,dp=1"), vec![]);
        add("scale-up-tp", base(), cfg("tp=8,pp=2,dp=1"), vec![]);
        add("redeploy", base(), cfg("tp=4,pp=2,dp=1,devices=8-15"), vec![]);
        add(
            "failure",
            cfg("tp=4,pp=2,dp=2"),
            cfg("tp=4,pp=2,dp=1,devices=4-11"),
            vec![0, 1, 2, 3],
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_paper_scenario_is_a_valid_problem() {
        let all = super::paper();
        assert_eq!(all.len(), 15);
        for s in all {
            s.problem().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }
}
