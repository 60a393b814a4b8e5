//! The CUDA kernels' own code (executor/kernels/box_copy.cu), compiled for
//! the host by its C++ compiler and run one thread at a time
//! (executor/kernels/emulate.cpp): `box_reduce` must add exactly as the host
//! executor adds (ptc's `DType::add_assign`, bit for bit, every element type,
//! every half and bfloat16 value), and `box_copy` must copy exactly, at every
//! alignment. A GPU runs the PTX of the same source (tests/backends.rs).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use tenplan_proofs::SplitMix64;
use tenplan_ptc::DType;

/// The emulator, built once per test run.
fn emulator() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let kernels = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let out = std::env::temp_dir().join(format!("tenplan-kernel-emulator-{}", std::process::id()));
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let status = Command::new(&cxx)
            .args(["-O1", "-std=c++17", "-Wall", "-Werror", "-I"])
            .arg(&kernels)
            .arg(kernels.join("emulate.cpp"))
            .arg("-o")
            .arg(&out)
            .status()
            .unwrap_or_else(|e| panic!("no C++ compiler `{cxx}` to build the kernel emulator: {e}"));
        assert!(status.success(), "the kernel emulator did not build");
        out
    })
}

/// One item: (source offset, destination offset, width, rows, source
/// pitch, destination pitch), in bytes.
type Item = [u64; 6];

/// Run one launch of `kernel` over `items` on the emulator; returns the
/// destination bytes.
fn launch(kernel: &str, dtype: u32, src: &[u8], dst: &[u8], items: &[Item]) -> Vec<u8> {
    let mut input = Vec::new();
    for n in [src.len() as u64, dst.len() as u64, items.len() as u64] {
        input.extend(n.to_le_bytes());
    }
    input.extend(src);
    input.extend(dst);
    input.extend(items.iter().flatten().flat_map(|w| w.to_le_bytes()));
    let mut child = Command::new(emulator())
        .args([kernel, &dtype.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the emulator runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("input written");
    let out = child.wait_with_output().expect("the emulator finishes");
    assert!(out.status.success(), "the emulator failed");
    assert_eq!(out.stdout.len(), dst.len());
    out.stdout
}

/// What the items do on the host: `dst += src` (reduce) or `dst = src`.
fn on_host(dtype: Option<DType>, src: &[u8], dst: &mut [u8], items: &[Item]) {
    for &[s, d, w, rows, sp, dp] in items {
        for r in 0..rows {
            let (f, t, w) = ((s + r * sp) as usize, (d + r * dp) as usize, w as usize);
            match dtype {
                Some(dtype) => dtype.add_assign(&mut dst[t..t + w], &src[f..f + w]),
                None => dst[t..t + w].copy_from_slice(&src[f..f + w]),
            }
        }
    }
}

/// Panics naming the first byte where the kernel and the host differ.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}: byte {i} is {:#04x}, the host wrote {:#04x}", got[i], want[i]);
    }
}

fn random_bytes(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

/// The kernel's number for each type (kernels/box_copy.cu), as cuda.rs
/// passes it.
const TYPES: [(DType, u32); 7] = [
    (DType::F64, 0),
    (DType::F32, 1),
    (DType::F16, 2),
    (DType::BF16, 3),
    (DType::I64, 4),
    (DType::I32, 5),
    (DType::U8, 6),
];

/// Items of several shapes over two buffers, in elements of `e` bytes:
/// wide rows (threads split a row), narrow ones (rows split among
/// threads), pitched on both sides, each writing its own destination bytes.
fn shapes(e: u64) -> (usize, usize, Vec<Item>) {
    // (width, rows, source pitch, destination pitch) in elements.
    let forms = [
        (1000, 3, 1003, 1010),
        (1, 700, 3, 2),
        (7, 300, 9, 8),
        (256, 5, 256, 256),
        (4096, 1, 4096, 4096),
    ];
    let (mut s, mut d) = (0, 0);
    let mut items = Vec::new();
    for (w, rows, sp, dp) in forms {
        items.push([s * e, d * e, w * e, rows, sp * e, dp * e]);
        s += sp * rows + 5;
        d += dp * rows + 3;
    }
    ((s * e) as usize, (d * e) as usize, items)
}

#[test]
fn box_reduce_adds_as_the_host_does_for_every_type() {
    let mut rng = SplitMix64::new(11);
    for (dtype, code) in TYPES {
        let (src_len, dst_len, items) = shapes(dtype.size());
        let src = random_bytes(&mut rng, src_len);
        let dst = random_bytes(&mut rng, dst_len);
        let mut want = dst.clone();
        on_host(Some(dtype), &src, &mut want, &items);
        assert_same(&launch("reduce", code, &src, &dst, &items), &want, &format!("{dtype}"));
    }
}

/// Every half and every bfloat16 value as an addend, against values from
/// every class (zeros, subnormals, normals, infinities, NaNs), in both
/// orders: the kernel's integer conversions round as ptc's do.
#[test]
fn box_reduce_rounds_every_half_and_bfloat16_value_as_the_host() {
    let mut rng = SplitMix64::new(5);
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
    for (dtype, code) in [(DType::F16, 2), (DType::BF16, 3)] {
        for round in 0..4 {
            let other: Vec<u8> = match round {
                0 => all.clone(),
                1 => (0..=u16::MAX).rev().flat_map(|v| v.to_le_bytes()).collect(),
                _ => random_bytes(&mut rng, all.len()),
            };
            let n = all.len() as u64;
            let items = [[0, 0, n, 1, n, n]];
            for (src, dst) in [(&all, &other), (&other, &all)] {
                let mut want = dst.clone();
                on_host(Some(dtype), src, &mut want, &items);
                let got = launch("reduce", code, src, dst, &items);
                if let Some(i) = (0..got.len() / 2).find(|&i| got[2 * i..2 * i + 2] != want[2 * i..2 * i + 2]) {
                    let v = |b: &[u8]| u16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
                    panic!(
                        "{dtype}: {:#06x} + {:#06x} gave {:#06x}, the host {:#06x}",
                        v(dst),
                        v(src),
                        v(&got),
                        v(&want)
                    );
                }
            }
        }
    }
}

#[test]
fn box_copy_copies_at_every_alignment() {
    let mut rng = SplitMix64::new(3);
    // Byte shapes whose offsets, widths and pitches allow 16-, 8-, 4-, 2-
    // and 1-byte loads.
    for align in [16, 8, 4, 2, 1] {
        let (src_len, dst_len, mut items) = shapes(align);
        for it in &mut items {
            it[0] += align;
        }
        let src = random_bytes(&mut rng, src_len + align as usize);
        let dst = random_bytes(&mut rng, dst_len);
        let mut want = dst.clone();
        on_host(None, &src, &mut want, &items);
        assert_same(
            &launch("copy", 0, &src, &dst, &items),
            &want,
            &format!("{align}-byte alignment"),
        );
    }
}
