//! What the command line prints for people: every table and summary, made
//! from an operation's outcome (the same object `--json` prints). Kept
//! apart from the argument parsing so that tests snapshot them.

use std::fmt::Write as _;

use tenplan_application::units::{bytes, seconds};
use tenplan_application::{
    CheckedKind, Diffed, ExportOutcome, Format, Imported, Initialized, ModelSummary, PlanReport, Resharded, Schedule,
    SyncComparison,
};
use tenplan_planner::MipReport;
use tenplan_ptc::{DatasetState, MicroBatch};

/// A plan's report as a two-column table.
pub fn plan_report(r: &PlanReport) -> String {
    let mut s = String::new();
    let rows = [
        ("planner", r.planner.clone()),
        (
            "copies",
            format!(
                "{} (+ {} zero-fills){}",
                r.copies,
                r.fills,
                if r.rounds > 1 {
                    format!(" in {} staging rounds", r.rounds)
                } else {
                    String::new()
                }
            ),
        ),
        (
            "bytes moved",
            format!(
                "{} between devices, {} in total",
                bytes(r.bytes_moved),
                bytes(r.bytes_total)
            ),
        ),
        ("cross-node bytes", bytes(r.bytes_cross_node)),
        (
            "max resource load",
            format!("{} ({})", seconds(r.max_load_s), r.bottleneck),
        ),
        ("simulated makespan", seconds(r.makespan_s)),
        (
            "lower bound",
            format!("{} ({})", seconds(r.lower_bound_s), r.lower_bound_reason),
        ),
        ("planning time", seconds(r.planning_time_s)),
        (
            "verified",
            if r.verified {
                format!("yes, {}", r.verdict)
            } else {
                format!("NO, {}", r.verdict)
            },
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(s, "{k:<20}{v}");
    }
    s
}

/// The MIP's line under an integral plan's report.
pub fn mip_line(m: &MipReport) -> String {
    format!(
        "MIP: {}, {} binaries; {} under the cost model, {:.2}% above the certified bound\n",
        mip_status(m),
        m.binaries,
        seconds(m.makespan_s),
        100.0 * m.gap
    )
}

/// `optimal`, or that the time limit stopped the search.
pub fn mip_status(m: &MipReport) -> &'static str {
    if m.optimal {
        "optimal"
    } else {
        "time limit (best found)"
    }
}

/// `tenplan models`: one row per model.
pub fn models_table(models: &[ModelSummary]) -> String {
    let mut s = String::from("| model | family | layers | hidden | heads | kv heads | head dim | ffn | vocab | experts | tensors | parameters | training state |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in models {
        let spec = &m.spec;
        let experts = match (spec.experts, spec.shared_ffn > 0) {
            (0, _) => "-".to_string(),
            (e, false) => e.to_string(),
            (e, true) => format!("{e} + shared"),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            spec.name,
            spec.family,
            spec.layers,
            spec.hidden,
            spec.heads,
            spec.groups,
            spec.head_dim,
            spec.ffn,
            spec.vocab,
            experts,
            m.tensors,
            params(m.parameters),
            bytes(m.training_state_bytes)
        );
    }
    s
}

/// A parameter count as people write it: 1.54B, 124.4M.
fn params(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

/// `tenplan data`: the samples a data-parallel rank reads next.
pub fn data_table(state: &DatasetState, dp: u64, rank: u64, share: (u64, u64), batches: &[MicroBatch]) -> String {
    let mut s = format!(
        "rank {rank} of dp={dp} reads positions {}..{} of every global batch of {}\n| step | micro-batch | first position | samples |\n|---:|---:|---:|---|\n",
        share.0,
        share.1,
        state.fields().global_batch
    );
    for m in batches {
        let samples: Vec<String> = m.samples.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            m.step,
            m.micro,
            m.first_position,
            samples.join(" ")
        );
    }
    s
}

/// `tenplan sync`: every planner's plan of one weight sync.
pub fn sync_table(r: &SyncComparison) -> String {
    let mut t = format!(
        "{} weights ({}, {}) from the trainer's {} to inference engines {} on {}\n\n",
        r.model,
        r.dtype,
        bytes(r.bytes),
        r.from,
        r.to,
        r.cluster
    );
    if let Some(c) = &r.conversion {
        t += &format!(
            "Each trainer rank converts its {} pieces to {} before sending ({}); the plans move {} bytes.\n\n",
            c.from,
            c.to,
            if c.lossy {
                "a narrowing, as asked: values are rounded to nearest even"
            } else {
                "exact"
            },
            c.to
        );
    }
    t += "| planner | simulated | lower bound | gap | cross-node | moved | copies | planning | checked |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for p in &r.rows {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |",
            p.planner,
            seconds(p.makespan_s),
            seconds(p.lower_bound_s),
            p.gap,
            bytes(p.bytes_cross_node),
            bytes(p.bytes_moved),
            p.copies,
            seconds(p.planning_time_s),
            if p.verified { "yes" } else { "NO" }
        );
    }
    let f = &r.broadcast_floor;
    t += &format!(
        "\nA bucketed broadcast of every weight to every engine device (checkpoint-engine's policy, planned as `broadcast`) takes at least {} ({}).\n",
        seconds(f.seconds),
        f.reason
    );
    t
}

/// HotSPa's step times for LLaMA-2-7B on 8 GPUs (Table 1 of the paper),
/// depending on sequence length and TP: the scale of a step's switching
/// overhead.
pub const HOTSPA_STEP_S: (f64, f64) = (13.9, 30.8);

/// What `tenplan switch` says of a schedule.
pub struct SwitchSummary<'a> {
    /// The model's name.
    pub model: &'a str,
    /// The cluster, as given.
    pub cluster: &'a str,
    /// What moves.
    pub state: &'a str,
    /// The planner.
    pub planner: &'a str,
    /// The schedule.
    pub schedule: &'a Schedule,
    /// Switch plans cached.
    pub planned: usize,
    /// Seconds planning took.
    pub planning_time_s: f64,
    /// Median time to fetch a cached switch plan, in nanoseconds.
    pub lookup_ns: f64,
}

/// `tenplan switch`: the best order of a step and its switches.
pub fn switch_table(o: &SwitchSummary<'_>) -> String {
    let sched = o.schedule;
    let mut t = format!(
        "{} on {}, moving {} with {}: best order {}\n\n",
        o.model,
        o.cluster,
        o.state,
        o.planner,
        sched.order.join(" → ")
    );
    t += "| from | to | makespan | lower bound | makespan / bound | moved | cross-node | peak device memory |\n";
    t += "|---|---|---:|---:|---:|---:|---:|---:|\n";
    for s in &sched.switches {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {:.3} | {} | {} | {} (device {}) |",
            s.from,
            s.to,
            seconds(s.makespan_s),
            seconds(s.lower_bound_s),
            s.makespan_s / s.lower_bound_s,
            bytes(s.bytes_moved),
            bytes(s.bytes_cross_node),
            bytes(s.peak_device_bytes),
            s.peak_device
        );
    }
    t += &format!(
        "\nper step: {} switching ({} bound), {} moved, peak {} per device\n",
        seconds(sched.total_s),
        seconds(sched.total_bound_s),
        bytes(sched.bytes_moved),
        bytes(sched.peak_device_bytes)
    );
    t += &format!(
        "overhead: {:.2}%–{:.2}% of a {}–{} s HotSPa step (LLaMA-2-7B, 8 GPUs, Table 1)\n",
        100.0 * sched.total_s / HOTSPA_STEP_S.1,
        100.0 * sched.total_s / HOTSPA_STEP_S.0,
        HOTSPA_STEP_S.0,
        HOTSPA_STEP_S.1
    );
    t += &format!(
        "planned {} switches in {:.2} s; a cached switch is returned in {:.0} ns\n",
        o.planned, o.planning_time_s, o.lookup_ns
    );
    t
}

/// `n` things: "1 file", "2 files".
fn counted(n: usize, thing: &str) -> String {
    format!("{n} {thing}{}", if n == 1 { "" } else { "s" })
}

/// `N entry` or `N entries`.
fn entries(n: usize) -> String {
    format!("{n} entr{}", if n == 1 { "y" } else { "ies" })
}

/// ` and N other entries` (entries that are not tensors), or nothing.
fn and_others(n: usize) -> String {
    match n {
        0 => String::new(),
        1 => " and 1 other entry".into(),
        n => format!(" and {n} other entries"),
    }
}

/// `tenplan init`'s summary.
pub fn initialized(w: &Initialized) -> String {
    format!(
        "wrote {}: {}, {} tensors, {} of data in {:.2} s\n",
        w.out.display(),
        counted(w.files, "file"),
        w.tensors,
        bytes(w.data_bytes),
        w.seconds
    )
}

/// `tenplan import`'s summary.
pub fn imported(i: &Imported) -> String {
    format!(
        "imported {} ({} tensors) as {} {}{}: {}, {} in {:.2} s\n{}",
        i.hf.display(),
        i.hf_tensors,
        i.model,
        i.layout,
        if i.files_names { " under the files' names" } else { "" },
        counted(i.files, "file"),
        bytes(i.data_bytes),
        i.seconds,
        left_out(&i.excluded)
    )
}

/// `tenplan reshard`'s summary.
pub fn resharded(r: &Resharded) -> String {
    let check = if r.src_format == "tenplan" && r.format == Format::Tenplan {
        "digests match"
    } else {
        "digests recorded"
    };
    let format = match r.format {
        Format::Dcp => "PyTorch DCP",
        Format::TorchDist => "Megatron-Core torch_dist",
        _ => "tenplan",
    };
    let out = format!(
        "resharded {} ({}) -> {} ({format}, {}): plan {} ({} copies, {:.3} s), read {}, wrote {} tensors{} in {} ({}), {:.2} s in all; {check}\n",
        r.src.display(),
        r.src_format,
        r.out.display(),
        r.to,
        r.planner,
        r.copies,
        r.plan_seconds,
        bytes(r.bytes_read),
        r.tensors,
        and_others(r.other_entries),
        counted(r.files, "file"),
        bytes(r.file_bytes),
        r.seconds,
    );
    out + &left_out(&r.excluded)
}

/// A line naming the entries left out on purpose, if any.
fn left_out(excluded: &[String]) -> String {
    match excluded.len() {
        0 => String::new(),
        n => format!(
            "left out on purpose: {n} entr{} ({}{})\n",
            if n == 1 { "y" } else { "ies" },
            excluded.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if n > 3 { ", ..." } else { "" }
        ),
    }
}

/// `tenplan check`'s summary.
pub fn checked(c: &tenplan_application::Checked) -> String {
    let took = c.seconds;
    match &c.kind {
        CheckedKind::Dcp {
            ranks,
            files,
            tensors,
            chunks,
            other_entries,
        } => format!(
            "ok: {} (PyTorch DCP, {ranks} ranks), {files} files, {tensors} tensors in {chunks} chunks{}, {} read in {took:.2} s\n",
            c.dir.display(),
            and_others(other_entries.len()),
            bytes(c.bytes),
        ),
        CheckedKind::Megatron {
            ranks,
            tp,
            pp,
            ep,
            transformer_impl,
            files,
            tensors,
            chunks,
            other_entries,
            common_entries,
            optimizer,
        } => format!(
            "ok: {} (Megatron-Core torch_dist, {ranks} ranks{}{}), {files} files, {tensors} tensors in {chunks} chunks{}{}, common.pt with {}, {} read in {took:.2} s\n",
            c.dir.display(),
            match (tp, pp, ep) {
                (Some(tp), Some(pp), Some(ep)) if *ep > 1 => format!(": tp={tp}, pp={pp}, ep={ep}"),
                (Some(tp), Some(pp), _) => format!(": tp={tp}, pp={pp}"),
                _ => String::new(),
            },
            transformer_impl.map_or(String::new(), |i| format!("; norms named for --transformer-impl {i}")),
            optimizer.map_or(String::new(), |f| format!(" (distributed optimizer state, {})", f.name())),
            and_others(other_entries.len()),
            entries(common_entries.len()),
            bytes(c.bytes),
        ),
        CheckedKind::Tenplan {
            model,
            layout,
            files,
            tensors,
        } => format!(
            "ok: {} ({} {}), {files} files, {tensors} tensors, {} checked in {took:.2} s\n",
            c.dir.display(),
            model.as_deref().unwrap_or("?"),
            layout.as_deref().unwrap_or("?"),
            bytes(c.bytes),
        ),
        other => format!("ok: {} ({other:?})\n", c.dir.display()),
    }
}

/// `tenplan export`'s summary.
pub fn exported(e: &ExportOutcome) -> String {
    let x = &e.exported;
    let line = format!(
        "exported {} ({}) to {} ({}): {} tensors, {} in {} file{}, config.json {}; {:.2} s\n",
        e.ckpt.display(),
        e.model,
        e.out.display(),
        e.format,
        x.tensors,
        bytes(x.data_bytes),
        x.files.len(),
        if x.files.len() == 1 { "" } else { "s" },
        if x.original_config {
            "as imported"
        } else {
            "generated from the model"
        },
        e.seconds
    );
    line + &left_out(&e.excluded)
}

/// `tenplan diff`'s report.
pub fn diffed(d: &Diffed) -> String {
    let mut text = String::new();
    for x in d.different.iter().take(20) {
        let _ = writeln!(text, "differs: {}: {}", x.name, x.what);
    }
    if d.different.len() > 20 {
        let _ = writeln!(text, "... and {} more (--json lists all)", d.different.len() - 20);
    }
    if let Some(f) = &d.first_difference {
        let _ = writeln!(
            text,
            "first difference: {} at element {:?}: {} vs {} (bytes, little-endian){}",
            f.tensor,
            f.index,
            f.a,
            f.b,
            match (&d.first_difference_in_a, &d.first_difference_in_b) {
                (Some(x), Some(y)) => format!("; {x} of {} vs {y} of {}", d.a.display(), d.b.display()),
                _ => String::new(),
            }
        );
    }
    for (side, list) in [(&d.a, &d.only_a), (&d.b, &d.only_b)] {
        if !list.is_empty() {
            let _ = writeln!(
                text,
                "only in {}: {} entr{} ({}{})",
                side.display(),
                list.len(),
                if list.len() == 1 { "y" } else { "ies" },
                list.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
                if list.len() > 3 { ", ..." } else { "" }
            );
        }
    }
    if !d.left_out.is_empty() {
        let _ = writeln!(
            text,
            "left out of the comparison on purpose (--weights-only): {} entr{} ({}{})",
            d.left_out.len(),
            if d.left_out.len() == 1 { "y" } else { "ies" },
            d.left_out.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if d.left_out.len() > 3 { ", ..." } else { "" }
        );
    }
    let _ = writeln!(
        text,
        "{}: {} ({}) and {} ({}): {} entries equal, {} differ, {} + {} on one side only; {} digested in {:.2} s",
        if d.identical { "identical" } else { "different" },
        d.a.display(),
        d.a_kind,
        d.b.display(),
        d.b_kind,
        d.same,
        d.different.len(),
        d.only_a.len(),
        d.only_b.len(),
        bytes(d.bytes),
        d.seconds
    );
    text
}

/// The one line `diff` fails with when the two sides differ.
pub fn differ_line(d: &Diffed) -> String {
    let at = d
        .first_difference
        .as_ref()
        .map(|f| format!(", first at {} {:?}", f.tensor, f.index))
        .unwrap_or_default();
    format!(
        "{} and {} differ: {} tensors differ{at}, {} + {} on one side only",
        d.a.display(),
        d.b.display(),
        d.different.len(),
        d.only_a.len(),
        d.only_b.len()
    )
}

#[cfg(test)]
mod tests {
    //! Snapshots of what people read, made from fixed outcomes (a table
    //! that changes shows up in review as a changed `.snap` file).

    use std::path::PathBuf;

    use tenplan_application::{Conversion, Timings};
    use tenplan_formats::diff::{Difference, FirstDifference};
    use tenplan_planner::BroadcastFloor;
    use tenplan_ptc::{DType, DatasetFields};

    use super::*;

    fn report(planner: &str, makespan_s: f64, bound_s: f64, verified: bool) -> PlanReport {
        PlanReport {
            planner: planner.into(),
            bytes_total: 517_184,
            bytes_moved: 427_296,
            bytes_cross_node: 138_112,
            max_load_s: 0.00514,
            bottleneck: "message issue of device 0".into(),
            makespan_s,
            lower_bound_s: bound_s,
            lower_bound_reason: "2029 target pieces can only be sent by 8 devices, one message per 2e-5 s".into(),
            gap: makespan_s / bound_s - 1.0,
            planning_time_s: 0.0085,
            verified,
            verdict: "verified: 2029 copies and 20 fills write 2029 target pieces, 194568 elements, each exactly once"
                .into(),
            copies: 2029,
            fills: 20,
            rounds: 1,
            timings: Timings::default(),
            peak_memory_bytes: None,
        }
    }

    #[test]
    fn a_plan_report() {
        insta::assert_snapshot!(plan_report(&report("lp", 0.00514, 0.00508, true)));
        let mut staged = report("central", 0.031, 0.00508, false);
        staged.rounds = 12;
        staged.verdict = "rejected: tensor `w` element 3 is never written".into();
        insta::assert_snapshot!("a_staged_rejected_plan_report", plan_report(&staged));
    }

    #[test]
    fn a_mip_line() {
        let m = MipReport {
            makespan_s: 0.0123,
            lower_bound_s: 0.0119,
            gap: 0.0336,
            optimal: false,
            binaries: 412,
        };
        insta::assert_snapshot!(mip_line(&m));
    }

    #[test]
    fn the_models_table() {
        let models: Vec<ModelSummary> = ["gpt-tiny", "llama-tiny", "mixtral-tiny", "gpt3-1.3b", "deepseek-v3"]
            .iter()
            .map(|m| tenplan_application::describe_model(tenplan_models::find(m).unwrap()))
            .collect();
        insta::assert_snapshot!(models_table(&models));
    }

    #[test]
    fn a_sync_table() {
        let r = SyncComparison {
            model: "llama-tiny".into(),
            from: "tp=1,pp=4,dp=1".into(),
            to: "tp=8,dp=3,devices=8-31".into(),
            cluster: "dgx-h100-rail:4".into(),
            dtype: "bf16".into(),
            bytes: 22_050,
            conversion: Some(Conversion {
                from: DType::F32,
                to: DType::BF16,
                lossy: true,
            }),
            rows: vec![
                report("lp", 0.00091, 0.00032, true),
                report("broadcast", 0.0021, 0.00032, true),
            ],
            broadcast_floor: BroadcastFloor {
                seconds: 1.01e-5,
                bytes: 22_050,
                reason: "NIC ingress of node 1".into(),
            },
        };
        insta::assert_snapshot!(sync_table(&r));
    }

    #[test]
    fn a_switch_table() {
        use tenplan_application::{Session, SwitchRequest, SwitchState};
        let req = SwitchRequest {
            model: tenplan_models::find("gpt-tiny").unwrap().clone(),
            cluster: tenplan_ptc::Cluster::parse("1x4").unwrap(),
            configs: ["tp=4", "tp=2,dp=2", "dp=4"]
                .iter()
                .map(|c| c.parse().unwrap())
                .collect(),
            state: SwitchState::Params,
            planner: "lp".parse().unwrap(),
            memory_budget: None,
        };
        let session = Session::new();
        let schedule = session.switch(&req).unwrap();
        insta::assert_snapshot!(switch_table(&SwitchSummary {
            model: "gpt-tiny",
            cluster: "1x4",
            state: "params",
            planner: "lp",
            schedule: &schedule,
            planned: session.cached_switches(),
            planning_time_s: 0.25,
            lookup_ns: 80.0,
        }));
    }

    #[test]
    fn a_dataset_table() {
        let state = DatasetState::new(DatasetFields {
            dataset_size: 100,
            seed: 7,
            consumed: 40,
            global_batch: 8,
        })
        .unwrap();
        let share = state.share(3, 1).unwrap();
        let batches = state.micro_batches(3, 1, 2, 2).unwrap();
        insta::assert_snapshot!(data_table(&state, 3, 1, share, &batches));
    }

    #[test]
    fn checkpoint_summaries() {
        let resharded = Resharded {
            src: PathBuf::from("ckpt/a"),
            src_format: "PyTorch DCP",
            out: PathBuf::from("ckpt/b"),
            format: Format::Tenplan,
            to: "tp=4,dp=2".into(),
            model: Some("llama-tiny".into()),
            planner: "lp".into(),
            copies: 412,
            tensors: 27,
            other_entries: 0,
            bytes_read: 1_048_576,
            data_bytes: 1_048_576,
            file_bytes: 1_060_000,
            files: 8,
            excluded: vec![
                "optim.state.w.exp_avg".into(),
                "optim.state.w.exp_avg_sq".into(),
                "optim.state.w.step".into(),
                "optim.param_groups.0.lr".into(),
            ],
            plan_seconds: 0.012,
            execute_seconds: 0.02,
            seconds: 0.04,
        };
        insta::assert_snapshot!("reshard_summary", super::resharded(&resharded));
        let checked = tenplan_application::Checked {
            dir: PathBuf::from("ckpt/b"),
            ok: true,
            kind: CheckedKind::Tenplan {
                model: Some("llama-tiny".into()),
                layout: Some("tp=4,dp=2".into()),
                files: 8,
                tensors: 41,
            },
            bytes: 1_048_576,
            seconds: 0.01,
        };
        insta::assert_snapshot!("check_summary_tenplan", super::checked(&checked));
        let dcp = tenplan_application::Checked {
            kind: CheckedKind::Dcp {
                ranks: 4,
                files: 5,
                tensors: 63,
                chunks: 252,
                other_entries: vec!["optim.param_groups.0.lr".into()],
            },
            ..checked
        };
        insta::assert_snapshot!("check_summary_dcp", super::checked(&dcp));
        let megatron = tenplan_application::Checked {
            kind: CheckedKind::Megatron {
                ranks: 4,
                tp: Some(2),
                pp: Some(2),
                ep: Some(1),
                transformer_impl: Some(tenplan_formats::dcp::TransformerImpl::TransformerEngine),
                files: 4,
                tensors: 9,
                chunks: 29,
                other_entries: vec!["decoder.layers.self_attention.linear_qkv._extra_state/shard_0.0_2.2".into()],
                common_entries: vec!["common.pt:optimizer".into()],
                optimizer: Some(tenplan_models::DistributedOptimizerFormat::FullyReshardable),
            },
            ..dcp
        };
        insta::assert_snapshot!("check_summary_megatron", super::checked(&megatron));
    }

    #[test]
    fn a_diff_report() {
        let d = Diffed {
            a: PathBuf::from("a"),
            b: PathBuf::from("b"),
            a_kind: "PyTorch DCP checkpoint",
            b_kind: "Hugging Face model",
            identical: false,
            same: 40,
            different: vec![Difference {
                name: "layers.0.attn.wq".into(),
                what: "contents".into(),
            }],
            first_difference: Some(FirstDifference {
                tensor: "layers.0.attn.wq".into(),
                index: vec![3, 7],
                a: "3f80".into(),
                b: "4000".into(),
            }),
            first_difference_in_a: Some("box [0..8, 0..16]".into()),
            first_difference_in_b: Some("`model.layers.0.self_attn.q_proj.weight` row 3".into()),
            only_a: vec!["optim.state.w.exp_avg".into()],
            only_b: vec![],
            left_out: vec![],
            bytes: 2_000_000,
            seconds: 0.05,
        };
        insta::assert_snapshot!(diffed(&d));
        insta::assert_snapshot!("the_line_diff_fails_with", differ_line(&d));
    }
}
