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

/// Large-scale scenarios on DGX-H100-like nodes (8 GPUs, NVSwitch, 8 NICs),
/// all with mixed-precision Adam state:
/// - LLaMA-2-70B scaling down from (tp8, pp8, dp8) on 512 GPUs to
///   (tp8, pp4, dp12) on 384;
/// - GPT-3 175B with ZeRO-1 scaling down from (tp8, pp16, dp8) on 1024 GPUs
///   to (tp8, pp16, dp6) on 768;
/// - Mixtral-8x7B changing expert parallelism from 8 to 4 on 64 GPUs;
/// - LLaMA-2-70B losing one node (devices 0–7) and continuing with dp7;
/// - LLaMA-2-70B redeployed to 64 other nodes.
pub fn large() -> Vec<Scenario> {
    let s =
        |name: &str, model: &'static str, cluster: &'static str, from: &str, to: &str, dead: Vec<DeviceId>| Scenario {
            name: format!("{model}/{name}"),
            model,
            state: StateKind::Training,
            cluster,
            dead,
            from: cfg(from),
            to: cfg(to),
        };
    vec![
        s(
            "scale-down-pp",
            "llama2-70b",
            "dgx-h100:64",
            "tp=8,pp=8,dp=8",
            "tp=8,pp=4,dp=12",
            vec![],
        ),
        s(
            "scale-down-zero",
            "gpt3-175b",
            "dgx-h100:128",
            "tp=8,pp=16,dp=8,zero=1",
            "tp=8,pp=16,dp=6,zero=1",
            vec![],
        ),
        s(
            "ep-8-to-4",
            "mixtral-8x7b",
            "dgx-h100:8",
            "tp=2,pp=4,dp=8,ep=8",
            "tp=2,pp=4,dp=8,ep=4",
            vec![],
        ),
        s(
            "node-failure",
            "llama2-70b",
            "dgx-h100:64",
            "tp=8,pp=8,dp=8",
            "tp=8,pp=8,dp=7,devices=8-455",
            (0..8).collect(),
        ),
        s(
            "redeploy",
            "llama2-70b",
            "dgx-h100:128",
            "tp=8,pp=8,dp=8",
            "tp=8,pp=8,dp=8,devices=512-1023",
            vec![],
        ),
    ]
}

/// A suite by name: `paper`, `large`, or `all`.
pub fn suite(name: &str) -> Option<Vec<Scenario>> {
    match name {
        "paper" => Some(paper()),
        "large" => Some(large()),
        "all" => Some(paper().into_iter().chain(large()).collect()),
        _ => None,
    }
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
