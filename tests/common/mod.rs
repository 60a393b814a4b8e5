//! Helpers shared by the integration tests that run real software.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// A Python with torch, transformers and safetensors: `TENPLAN_PYTHON`, or
/// the virtual environment scripts/setup.sh makes. Without one a test says
/// so and passes, except under CI (`CI=true`), where it fails.
// A skipped test says why on stderr.
#[allow(clippy::print_stderr)]
pub fn python() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("TENPLAN_PYTHON").map(PathBuf::from),
        std::env::var_os("TENPLAN_VENV").map(|v| PathBuf::from(v).join("bin/python")),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tenplan/venv/bin/python")),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import torch, transformers, safetensors"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "CI needs a Python with torch and transformers (scripts/setup.sh makes one)"
        );
        eprintln!("skipped: no Python with torch and transformers (run scripts/setup.sh or set TENPLAN_PYTHON)");
    }
    found
}

/// [`python`], when it also imports `modules` (`import ...` syntax);
/// without them a test passes, except under CI, where it fails naming
/// `what` is missing.
pub fn python_with(modules: &str, what: &str) -> Option<PathBuf> {
    let py = python()?;
    let have = Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("CI").is_err(),
            "CI needs {what} in the Python environment (scripts/setup.sh installs it)"
        );
        return None;
    }
    Some(py)
}

/// Run the tenplan binary.
pub fn tenplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenplan")).args(args).output().unwrap()
}

/// The output of a command that must succeed.
pub fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The error output of a command that must fail.
pub fn err(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "expected a failure: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}
