//! An FSDP2 job's whole state moved by tenplan and resumed, against
//! PyTorch DCP's own load-time reshard, with real torch: a 4-rank FSDP2
//! AdamW checkpoint written by `dcp.save` is resharded to 2 ranks, to a
//! 2x2 HSDP mesh and to FSDP2 over tensor parallelism on a 2x2 mesh (split
//! as transformers' plan for the model says); new jobs load the output with
//! plain `dcp.load` and `set_state_dict` (model and optimizer) and train on
//! with the same losses, bit for bit, as jobs that load the original
//! checkpoint, and tenplan's output is cut into the chunks each job's own
//! `dcp.save` writes (tests/fsdp2/resume.py).

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn an_fsdp2_adamw_job_resumes_from_tenplans_reshard_as_from_dcps() {
    let Some(py) = common::python() else { return };
    let work = std::env::temp_dir().join(format!("tenplan-fsdp2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fsdp2/resume.py");
    let o = Command::new(py)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_tenplan"))
        .arg(&work)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    for run in ["fsdp2-2", "hsdp-2x2", "fsdp2-tp-2x2"] {
        let r = &v["runs"][run];
        assert_eq!(r["bit_identical"], true, "{run}: {r}");
        assert_eq!(r["same_entries"], true, "{run}: {r}");
        assert_eq!(r["same_chunks_as_the_jobs_own_save"], true, "{run}: {r}");
        // Every optimizer entry reached the output: moments, steps, param_groups.
        assert!(r["tenplan"]["other_entries"].as_u64().unwrap() > 0, "{r}");
        assert!(r["tenplan"]["excluded"].as_array().unwrap().is_empty(), "{r}");
    }
    // Under tp=2 the projections and their moments are split four ways.
    assert_eq!(v["runs"]["fsdp2-tp-2x2"]["most_chunks_of_an_entry"], 4, "{v}");
    std::fs::remove_dir_all(&work).unwrap();
}
