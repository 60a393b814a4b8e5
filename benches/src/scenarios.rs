//! Named reconfiguration scenarios, such as those of the Tenplex paper.

use anyhow::{bail, Result};
use tenplan::application::{ModelMove, SyncRequest};
use tenplan::models::{find, ParallelConfig, StateKind};
use tenplan::ptc::{Cluster, DType, DeviceId, Problem};

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
    pub cluster: String,
    /// Devices dead when the reconfiguration starts.
    pub dead: Vec<DeviceId>,
    /// Layout before.
    pub from: ParallelConfig,
    /// Layout after.
    pub to: ParallelConfig,
    /// `to` is an inference-engine layout ([`tenplan::models::ModelState::serving_layout`]):
    /// a weight sync of RL post-training, where the engines may forward
    /// weights among themselves across the cluster
    /// ([`tenplan::ptc::Forwarding::Cluster`]).
    pub serving: bool,
}

impl Scenario {
    /// The problem this scenario poses, as the application layer poses
    /// it: a model's state between two layouts, or a weight sync.
    pub fn problem(&self) -> Result<Problem> {
        let model = find(self.model)?.clone();
        let cluster = Cluster::parse(&self.cluster)?.with_dead(self.dead.iter().copied())?;
        if self.serving {
            let dtype = match self.state {
                StateKind::Weights(d) => d,
                other => bail!("{}: a weight sync moves weights, not {other}", self.name),
            };
            let sync = SyncRequest {
                model,
                trainer: self.from.clone().into(),
                engines: self.to.clone().into(),
                cluster,
                dtype,
                trainer_dtype: None,
                planner: "lp".parse()?,
            };
            return Ok(sync.problem()?);
        }
        let movement = ModelMove {
            model,
            state: self.state,
            from: self.from.clone().into(),
            to: self.to.clone().into(),
            cluster,
        };
        Ok(movement.problem()?)
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
                cluster: "tenplex-onprem".into(),
                dead,
                from,
                to,
                serving: false,
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
            cluster: cluster.into(),
            dead,
            from: cfg(from),
            to: cfg(to),
            serving: false,
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

/// Layers per stage of Llama 3.1 405B's 126 layers: one layer fewer on the
/// first and the last stage, as Meta trained it.
fn llama405_split(pp: u32) -> String {
    let inner = (126 + 2) / pp;
    let mut stages = vec![inner; pp as usize];
    stages[0] -= 1;
    stages[pp as usize - 1] -= 1;
    let stages: Vec<String> = stages.iter().map(u32::to_string).collect();
    format!("split={}", stages.join(":"))
}

/// The scale suite at `gpus` GPUs (a multiple of 1,024) on DGX-H100 nodes,
/// all with mixed-precision Adam state:
/// - LLaMA-3 70B (tp8, pp8) shrinking data parallelism by a quarter;
/// - GPT-3 175B with ZeRO-1 (tp8, pp16) shrinking data parallelism by a quarter;
/// - Llama 3.1 405B changing pipeline parallelism from 16 to 8 stages on
///   the same GPUs (tp8, data parallelism doubling);
/// - DeepSeek-V3 (tp1, pp16, ep64) shrinking data parallelism by a quarter,
///   with expert parallelism 16 where 64 no longer divides it;
/// - LLaMA-3 70B losing its first node and continuing with one replica fewer;
/// - LLaMA-3 70B on half the GPUs redeployed to the other half.
///
/// The nodes are those of a DGX-H100 preset: `dgx-h100` (a
/// non-blocking network), `dgx-h100-rail` or `dgx-h100-rail-2to1` (a
/// rail-optimized fabric, its spine at 1:1 or 2:1).
pub fn scale_on(gpus: u32, preset: &str) -> Result<Vec<Scenario>> {
    if gpus == 0 || !gpus.is_multiple_of(1024) {
        bail!("the scale suite runs on a multiple of 1024 GPUs, not {gpus}");
    }
    let cluster = format!("{preset}:{}", gpus / 8);
    let s = |name: &str, model: &'static str, from: String, to: String, dead: Vec<DeviceId>| Scenario {
        name: format!("{model}/{name}"),
        model,
        state: StateKind::Training,
        cluster: cluster.clone(),
        dead,
        from: cfg(&from),
        to: cfg(&to),
        serving: false,
    };
    let dp70 = gpus / 64;
    let dp175 = gpus / 128;
    let dp_ds = gpus / 16;
    let ds_split = "split=4:4:4:4:4:4:4:4:4:4:4:4:4:3:3:3";
    let ds_ep = if (dp_ds * 3 / 4).is_multiple_of(64) { 64 } else { 16 };
    Ok(vec![
        s(
            "dp-shrink",
            "llama3-70b",
            format!("tp=8,pp=8,dp={dp70}"),
            format!("tp=8,pp=8,dp={}", dp70 * 3 / 4),
            vec![],
        ),
        s(
            "zero1-dp-shrink",
            "gpt3-175b",
            format!("tp=8,pp=16,dp={dp175},zero=1"),
            format!("tp=8,pp=16,dp={},zero=1", dp175 * 3 / 4),
            vec![],
        ),
        s(
            "pp-16-to-8",
            "llama3.1-405b",
            format!("tp=8,pp=16,dp={dp175},{}", llama405_split(16)),
            format!("tp=8,pp=8,dp={},{}", dp175 * 2, llama405_split(8)),
            vec![],
        ),
        s(
            "ep-dp-shrink",
            "deepseek-v3",
            format!("tp=1,pp=16,dp={dp_ds},ep=64,{ds_split}"),
            format!("tp=1,pp=16,dp={},ep={ds_ep},{ds_split}", dp_ds * 3 / 4),
            vec![],
        ),
        s(
            "node-failure",
            "llama3-70b",
            format!("tp=8,pp=8,dp={dp70}"),
            format!("tp=8,pp=8,dp={},devices=8-{}", dp70 - 1, 8 + 64 * (dp70 - 1) - 1),
            (0..8).collect(),
        ),
        s(
            "redeploy",
            "llama3-70b",
            format!("tp=8,pp=8,dp={}", dp70 / 2),
            format!("tp=8,pp=8,dp={},devices={}-{}", dp70 / 2, gpus / 2, gpus - 1),
            vec![],
        ),
    ])
}

/// Weight syncs of RL post-training on a DGX-H100 rail-optimized fabric
/// (48 nodes unless said: the trainer on the first 32, the inference
/// engines on the last 16), bf16 weights, trainer layouts as Megatron-LM keeps them,
/// engine layouts as [`tenplan::models::ModelState::serving_layout`] describes them:
/// - DeepSeek-V3 (671B) and a Kimi-K2-like 1T model, 256 training GPUs to
///   16 engines of tp=8 (128 GPUs), to 2 engines of tp=64, and (DeepSeek)
///   to one expert-parallel engine of 128 GPUs (tp=128, ep=128: two whole
///   experts per GPU; each GPU keeps 1/128 of the weights, as the
///   expert-parallel engines of the published anchors do);
/// - Qwen3-235B-A22B on one node, the engine (tp=8) colocated with the
///   trainer (tp=4, ep=2, dp=2);
/// - LLaMA-3 70B, 64 training GPUs to 4 engines of tp=16 (key/value heads
///   replicated twice);
/// - DeepSeek-V3 to an inference fleet larger than the trainer: 64 engines
///   of tp=8 (512 GPUs on 64 more nodes, 96 in all), where the trainer's
///   NICs cannot send every engine its own copy in the time an engine
///   needs to receive one, and the engines must forward weights to one
///   another.
pub fn rl() -> Vec<Scenario> {
    let s = weight_sync;
    let rail = "dgx-h100-rail:48";
    let ds = "tp=8,pp=8,dp=4,ep=4,split=8:8:8:8:8:7:7:7";
    vec![
        s("256-to-16x8", "deepseek-v3", rail, ds, "tp=8,dp=16,devices=256-383"),
        s("256-to-2x64", "deepseek-v3", rail, ds, "tp=64,dp=2,devices=256-383"),
        s("256-to-1x128", "deepseek-v3", rail, ds, "tp=128,ep=128,devices=256-383"),
        s("256-to-16x8", "kimi-k2", rail, ds, "tp=8,dp=16,devices=256-383"),
        s("256-to-2x64", "kimi-k2", rail, ds, "tp=64,dp=2,devices=256-383"),
        s(
            "8-to-8-colocated",
            "qwen3-235b-a22b",
            "dgx-h100-rail:1",
            "tp=4,dp=2,ep=2",
            "tp=8",
        ),
        s(
            "64-to-4x16",
            "llama3-70b",
            "dgx-h100-rail:16",
            "tp=8,pp=4,dp=2",
            "tp=16,dp=4,devices=64-127",
        ),
        s(
            "256-to-64x8",
            "deepseek-v3",
            "dgx-h100-rail:96",
            ds,
            "tp=8,dp=64,devices=256-767",
        ),
    ]
}

/// A weight sync of bf16 weights from a trainer's layout to engines'.
fn weight_sync(name: &str, model: &'static str, cluster: &str, from: &str, to: &str) -> Scenario {
    Scenario {
        name: format!("{model}/{name}"),
        model,
        state: StateKind::Weights(DType::BF16),
        cluster: cluster.into(),
        dead: vec![],
        from: cfg(from),
        to: cfg(to),
        serving: true,
    }
}

/// The configurations NVIDIA published for NCCL M2N (`nccl-extensions`),
/// on GB200 NVL72 racks, bf16 weights, trainer and engines on GPUs of
/// their own: DeepSeek-V3 on 256 GPUs, a trainer of tp=1, pp=4, ep=16
/// with an expert data-parallel degree of 2 (128 GPUs: dp=32 in tenplan's
/// terms, where ep is carved from dp) to 16 engines of tp=8; and
/// Qwen3-235B-A22B on 128 GPUs, whose layouts were not published with the
/// time: assumed here a trainer of tp=4, pp=4, dp=4, ep=4 (64 GPUs) to 8
/// engines of tp=8. Their published times are in [`published`].
pub fn m2n() -> Vec<Scenario> {
    let s = weight_sync;
    vec![
        s(
            "m2n-128-to-16x8",
            "deepseek-v3",
            "gb200-nvl72:4",
            "tp=1,pp=4,dp=32,ep=16,split=16:15:15:15",
            "tp=8,dp=16,devices=128-255",
        ),
        s(
            "m2n-64-to-8x8",
            "qwen3-235b-a22b",
            "gb200-nvl72:2",
            "tp=4,pp=4,dp=4,ep=4,split=24:24:23:23",
            "tp=8,dp=8,devices=64-127",
        ),
    ]
}

/// A published time for a scenario, with where it was published.
pub fn published(scenario: &str) -> Option<(f64, &'static str)> {
    match scenario {
        "deepseek-v3/m2n-128-to-16x8" => Some((1.447, "NCCL M2N (nccl-extensions), 256 GB200")),
        "qwen3-235b-a22b/m2n-64-to-8x8" => Some((0.989, "NCCL M2N (nccl-extensions), 128 GB200")),
        _ => None,
    }
}

/// A suite by name: `paper`, `large`, `rl`, `m2n` (the rl suite's rows
/// with published M2N times), or `all` (paper and large).
pub fn suite(name: &str) -> Option<Vec<Scenario>> {
    match name {
        "rl" => Some(rl()),
        "m2n" => Some(m2n()),
        "paper" => Some(paper()),
        "large" => Some(large()),
        "all" => Some(paper().into_iter().chain(large()).collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_paper_scenario_is_a_valid_problem() {
        let all = super::paper();
        assert_eq!(all.len(), 15);
        for s in all {
            s.problem().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }

    #[test]
    fn scale_scenarios_are_valid_problems_at_every_size() {
        for gpus in [1024, 4096, 16384] {
            let all = super::scale_on(gpus, "dgx-h100").unwrap();
            assert_eq!(all.len(), 6);
            for s in all {
                // Build the layouts (cheap checks first): the problem itself
                // is what the scale benchmark measures.
                s.from.check_cluster(&Cluster::parse(&s.cluster).unwrap()).unwrap();
                s.to.check_cluster(&Cluster::parse(&s.cluster).unwrap()).unwrap();
            }
        }
        assert_eq!(super::llama405_split(16), "split=7:8:8:8:8:8:8:8:8:8:8:8:8:8:8:7");
        assert_eq!(super::llama405_split(8), "split=15:16:16:16:16:16:16:15");
        let e = super::scale_on(1000, "dgx-h100").unwrap_err().to_string();
        assert!(e.contains("multiple of 1024"), "{e}");
        assert!(super::scale_on(1024, "dgx-h100").unwrap()[0].problem().is_ok());
    }

    #[test]
    fn rl_scenarios_are_weight_syncs_the_models_can_serve() {
        let all = super::rl();
        assert_eq!(all.len(), 8);
        for s in &all {
            assert!(s.serving);
            let cluster = Cluster::parse(&s.cluster).unwrap();
            s.from.check_cluster(&cluster).unwrap();
            s.to.check_cluster(&cluster).unwrap();
            let state = tenplan::models::ModelState::new(find(s.model).unwrap(), s.state);
            state.validate(&s.from).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
        // The one-node and the dense rows in full (the MoE rows on 384 GPUs
        // are what the benchmark measures).
        for s in all
            .iter()
            .filter(|s| !s.model.starts_with("deepseek") && !s.model.starts_with("kimi"))
        {
            s.problem().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }
}
