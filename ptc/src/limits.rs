//! Sane limits on every size an input can name, checked before any work
//! that grows with it starts.
//!
//! Each limit sits far above what any real job needs (the largest training
//! runs of 2025 used 16,384–100,000 GPUs; the largest tensors of a 1T-parameter
//! model hold a few 10⁹ elements) and far below what would exhaust a
//! machine's memory or overflow a 64-bit count, so an input over one is a
//! mistake or an attack, never a job.

use crate::{Error, Result};

/// Most devices a cluster may have (the store's slot included): 2²⁰ =
/// 1,048,576, 64× the 16,384 GPUs of Llama 3 405B's training run.
pub const MAX_DEVICES: u32 = 1 << 20;

/// Most elements one logical tensor may have: 2⁴⁸ ≈ 2.8·10¹⁴ (the largest
/// tensors of today's models hold under 10¹⁰).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 48;

/// Most bytes one device buffer may have: 1 TiB, more than any accelerator's
/// or host's memory per device.
pub const MAX_BUFFER_BYTES: u64 = 1 << 40;

/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 16;

/// Most pieces the devices of a layout may hold, a shard's pieces counted
/// once per device holding it: 2²⁶ ≈ 67 million (the training state of
/// GPT-3 175B on 16,384 GPUs, tp=8 pp=16 dp=128, holds under 5 million).
pub const MAX_PIECES: u64 = 1 << 26;

/// Most bytes a staging or memory budget may name: 1 PiB.
pub const MAX_BUDGET_BYTES: u64 = 1 << 50;

/// Longest solver time limit, in seconds: one week.
pub const MAX_TIME_LIMIT_S: f64 = 7.0 * 24.0 * 3600.0;

/// Check that `value` (what `what` names) is at most `max`.
pub fn check(what: &'static str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(Error::Limit { what, value, max });
    }
    Ok(())
}

/// Parse a byte count such as `2GiB`, `512MB`, `1.5e9` or `1048576` into
/// bytes, refusing anything that is not a positive number of bytes of
/// at most [`MAX_BUDGET_BYTES`] (a fraction of a byte rounds down).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let bad = |why: String| Error::Format {
        what: format!("bad byte count `{s}`: {why}"),
    };
    let t = s.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        other => {
            return Err(bad(format!(
                "unknown unit `{other}` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            )))
        }
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| bad("expected a number followed by an optional unit such as GiB".into()))?;
    let b = n * scale;
    if !b.is_finite() || b < 1.0 {
        return Err(bad("must be at least one byte".into()));
    }
    if b > MAX_BUDGET_BYTES as f64 {
        // Named as written: a saturated integer would misquote `1e30GiB`.
        return Err(bad(format!("exceeds the limit of 1 PiB ({MAX_BUDGET_BYTES} bytes)")));
    }
    // A fraction of a byte (`1.3KiB`) rounds down.
    Ok(b as u64)
}

/// Check a solver time limit: finite, positive, at most [`MAX_TIME_LIMIT_S`].
pub fn check_time_limit(seconds: f64) -> Result<()> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIME_LIMIT_S) {
        return Err(Error::Format {
            what: format!("time limit {seconds} s must be a positive number of seconds of at most {MAX_TIME_LIMIT_S}"),
        });
    }
    Ok(())
}

/// Memory the kernel says is available (Linux `MemAvailable`), if known.
/// Checks that refuse problems too large for this machine read it.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Memory per device piece that building, planning, checking and
/// simulating a problem takes, measured on `tenplan plan --json` (peak
/// resident memory over the two layouts' pieces): LLaMA-3 70B, 4,096 GPUs,
/// dp 64→48 with `tenplex`: 3.0 GB for 2.0 million (1.5 KB each); GPT-3 175B
/// ZeRO-1, 1,024 GPUs, dp 8→6 with `lp`: 0.21 GB for 0.32 million (0.66 KB
/// each). 2 KiB covers both without refusing problems that would fit.
pub const BYTES_PER_PIECE: u64 = 2048;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("1.5e9").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("512 MB").unwrap(), 512_000_000);
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        for bad in [
            "",
            "0",
            "-1",
            "nan",
            "inf",
            "1e30GiB",
            "18446744073709551616",
            "2XB",
            "0.5",
            "1e300",
            "GiB",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn time_limits() {
        assert!(check_time_limit(10.0).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e12] {
            assert!(check_time_limit(bad).is_err(), "{bad}");
        }
    }
}
