//! Quantities as people read them.

/// Bytes in human units (decimal).
pub fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.2} kB", b / 1e3)
    } else {
        format!("{b} B")
    }
}

/// Seconds in human units.
pub fn seconds(s: f64) -> String {
    if !s.is_finite() {
        "n/a".into()
    } else if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(22_050), "22.05 kB");
        assert_eq!(bytes(1_420_000_000), "1.42 GB");
        assert_eq!(seconds(0.00091), "910.0 µs");
        assert_eq!(seconds(0.0112), "11.20 ms");
        assert_eq!(seconds(3.8491), "3.849 s");
        assert_eq!(seconds(f64::NAN), "n/a");
    }
}
