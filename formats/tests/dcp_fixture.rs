//! The DCP reader on a checkpoint real torch wrote (fuzz/seeds/dcp, made by
//! tests/dcp/make_seed.py: `w`, 5 x 4 bf16 in two uneven row shards; `b`,
//! 3 f32 replicated and stored once; `step`, not a tensor), without Python.

use std::path::{Path, PathBuf};

use tenplan_formats::dcp::{read_all, Dcp};
use tenplan_ptc::DType;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/dcp")
}

fn bf16(x: f32) -> [u8; 2] {
    let b = x.to_bits();
    assert_eq!(b & 0xffff, 0, "exact in bf16");
    ((b >> 16) as u16).to_le_bytes()
}

#[test]
fn reads_what_torch_saved() {
    let d = Dcp::open(&fixture()).unwrap();
    assert_eq!(d.ranks(), 2);
    assert_eq!(d.others(), ["step"]);
    let w = d.tensors().iter().find(|t| t.name == "w").unwrap();
    assert_eq!((w.dtype, w.shape.as_slice()), (DType::BF16, &[5u64, 4][..]));
    // torch.chunk's rule: 3 rows, then 2.
    let mut rows: Vec<_> = w.chunks.iter().map(|c| c.region.range(0)).collect();
    rows.sort_by_key(|r| r.start);
    assert_eq!(rows, [0..3, 3..5]);
    for c in &w.chunks {
        let want: Vec<u8> = c.region.points().flat_map(|p| bf16((p[0] * 4 + p[1]) as f32)).collect();
        assert_eq!(d.chunk_bytes(c), &want[..]);
    }
    let b = d.tensors().iter().find(|t| t.name == "b").unwrap();
    assert_eq!((b.dtype, b.chunks.len()), (DType::F32, 1));
    let want: Vec<u8> = [0.5f32, -1.0, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(d.chunk_bytes(&b.chunks[0]), &want[..]);
    assert_eq!(read_all(&d), 5 * 4 * 2 + 3 * 4);
}

#[test]
fn damaged_copies_are_refused_with_the_file_named() {
    let dir = std::env::temp_dir().join(format!("tenplan-dcp-fixture-{}", std::process::id()));
    let copy = |name: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for e in std::fs::read_dir(fixture()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
        }
        d
    };
    // Every truncation of a data file or of the metadata is an error.
    for file in ["__1_0.distcp", ".metadata"] {
        let d = copy(&format!("cut-{file}"));
        let full = std::fs::read(d.join(file)).unwrap();
        for len in (0..full.len()).step_by(37) {
            std::fs::write(d.join(file), &full[..len]).unwrap();
            let e = Dcp::open(&d).unwrap_err().to_string();
            assert!(e.contains(file), "{file} cut at {len}: {e}");
        }
    }
    // A flipped byte in the archive of a chunk is caught or changes only data.
    let d = copy("flip");
    let full = std::fs::read(d.join("__0_0.distcp")).unwrap();
    for at in 0..full.len() {
        let mut b = full.clone();
        b[at] ^= 0x55;
        std::fs::write(d.join("__0_0.distcp"), &b).unwrap();
        // Never a panic; an error names the file.
        if let Err(e) = Dcp::open(&d) {
            assert!(e.to_string().contains("__0_0.distcp"), "{e}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
