//! `tenplan-fuzz`: a mutation fuzzer of every parser of outside input, on the
//! stable toolchain.
//!
//! Each target starts from valid seeds that tenplan itself produces (plans,
//! problems, a checkpoint's manifest and safetensors files, Hugging Face
//! weights and indexes, job states, layout and cluster
//! strings, byte counts; the DCP targets a checkpoint real torch wrote,
//! fuzz/seeds/dcp) and mutates them: bytes (flips, interesting
//! values, inserts, deletions, splices), numbers (boundary values: 0, −1,
//! 2³², 2⁶², 2⁶⁴, 1e308, …) and, where the input is JSON, its structure
//! (values replaced, keys deleted or added, array elements duplicated or
//! dropped). Choices are drawn with [`arbitrary::Unstructured`] from a
//! seeded generator, so a run is reproducible from its seed. An input whose
//! outcome (the error message, numbers blanked) is new joins the corpus.
//!
//! Every input must give an error or a valid value: a panic is a crash, and
//! an input running longer than `--hang` seconds is a hang. Both are saved
//! under `OUT/crashes/TARGET/` and make the run exit non-zero.
//!
//! ```text
//! cargo run -p tenplan-fuzz -- all --seconds 600          # ten minutes per target
//! cargo run -p tenplan-fuzz -- plan --seconds 60 --seed 7
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod targets;

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arbitrary::Unstructured;

use crate::targets::Target;

/// Boundary numbers that parsers and size checks must survive.
const INTERESTING: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "7",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "1048576",
    "1048577",
    "9007199254740993",
    "4611686018427387904",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-1e308",
    "1e-300",
    "0.5",
    "-0",
    "1.5",
    "3.0",
];

/// Tokens of the string formats (layouts, clusters, byte counts).
const TOKENS: &[&str] = &[
    "tp=",
    "pp=",
    "dp=",
    "ep=",
    "zero=",
    "devices=",
    "split=",
    ",",
    "=",
    "-",
    ":",
    "x",
    "dgx-h100",
    "tenplex-onprem",
    "GiB",
    "MB",
    "e",
    ".",
    " ",
];

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).flat_map(|_| self.next().to_le_bytes()).take(n).collect()
    }
}

/// Apply one to four random mutations to `input`.
fn mutate(input: &[u8], corpus: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let entropy = rng.bytes(256);
    let mut u = Unstructured::new(&entropy);
    let mut out = input.to_vec();
    let rounds = u.int_in_range(1..=4u8).unwrap_or(1);
    for _ in 0..rounds {
        let op = u.int_in_range(0..=9u8).unwrap_or(0);
        out = match op {
            0..=2 => mutate_json(&out, &mut u).unwrap_or_else(|| mutate_number(&out, &mut u)),
            3 | 4 => mutate_number(&out, &mut u),
            5 => mutate_bytes(&out, &mut u),
            6 => {
                let other = &corpus[u.choose_index(corpus.len()).unwrap_or(0)];
                splice(&out, other, &mut u)
            }
            7 => {
                let mut v = out;
                let at = u.choose_index(v.len() + 1).unwrap_or(0);
                let tok = TOKENS[u.choose_index(TOKENS.len()).unwrap_or(0)];
                v.splice(at..at, tok.bytes());
                v
            }
            _ => mutate_bytes(&out, &mut u),
        };
    }
    out
}

fn mutate_bytes(input: &[u8], u: &mut Unstructured<'_>) -> Vec<u8> {
    let mut v = input.to_vec();
    let at = u.choose_index(v.len().max(1)).unwrap_or(0).min(v.len());
    match u.int_in_range(0..=5u8).unwrap_or(0) {
        0 if !v.is_empty() && at < v.len() => v[at] ^= 1 << u.int_in_range(0..=7u8).unwrap_or(0),
        1 if at < v.len() => v[at] = *u.choose(&[0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'[', b'-']).unwrap_or(&0),
        2 => {
            let n = u.int_in_range(1..=16usize).unwrap_or(1);
            let junk: Vec<u8> = (0..n).map(|_| u.arbitrary::<u8>().unwrap_or(0)).collect();
            v.splice(at..at, junk);
        }
        3 => {
            let n = u.int_in_range(1..=64usize).unwrap_or(1);
            v.drain(at..(at + n).min(v.len()));
        }
        4 => {
            let n = u.int_in_range(1..=64usize).unwrap_or(1);
            let piece = v[at..(at + n).min(v.len())].to_vec();
            v.splice(at..at, piece);
        }
        _ => v.truncate(at),
    }
    v
}

/// Replace one run of digits (with its sign, fraction and exponent) by a boundary value.
fn mutate_number(input: &[u8], u: &mut Unstructured<'_>) -> Vec<u8> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < input.len() {
        if input[i].is_ascii_digit() {
            let start = if i > 0 && input[i - 1] == b'-' { i - 1 } else { i };
            let mut j = i;
            while j < input.len() && (input[j].is_ascii_digit() || matches!(input[j], b'.' | b'e' | b'E' | b'+')) {
                j += 1;
            }
            runs.push(start..j);
            i = j;
        } else {
            i += 1;
        }
    }
    let Ok(r) = u.choose(&runs) else {
        return mutate_bytes(input, u);
    };
    let with = INTERESTING[u.choose_index(INTERESTING.len()).unwrap_or(0)];
    let mut v = input.to_vec();
    v.splice(r.clone(), with.bytes());
    v
}

fn splice(a: &[u8], b: &[u8], u: &mut Unstructured<'_>) -> Vec<u8> {
    let i = u.choose_index(a.len() + 1).unwrap_or(0);
    let j = u.choose_index(b.len() + 1).unwrap_or(0);
    let mut v = a[..i].to_vec();
    v.extend_from_slice(&b[j..]);
    v
}

/// Mutate the structure of a JSON document; `None` when it is not JSON.
fn mutate_json(input: &[u8], u: &mut Unstructured<'_>) -> Option<Vec<u8>> {
    let mut doc: serde_json::Value = serde_json::from_slice(input).ok()?;
    let mut count = 0usize;
    count_nodes(&doc, &mut count);
    let target = u.choose_index(count).ok()?;
    let mut seen = 0usize;
    let donor = {
        let pick = u.choose_index(count).ok()?;
        let mut k = 0usize;
        find_node(&doc, pick, &mut k)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    };
    let op = u.int_in_range(0..=6u8).ok()?;
    let scalar = interesting_value(u);
    edit(
        &mut doc,
        target,
        &mut seen,
        &mut |v: &mut serde_json::Value| match (op, v) {
            (0 | 1, v) => *v = scalar.clone(),
            (2, serde_json::Value::Object(m)) => {
                if let Some(k) = m.keys().next().cloned() {
                    m.remove(&k);
                }
            }
            (3, serde_json::Value::Object(m)) => {
                m.insert("unexpected_field".into(), serde_json::Value::from(1));
            }
            (4, serde_json::Value::Array(a)) if !a.is_empty() => {
                let x = a[a.len() / 2].clone();
                a.push(x);
            }
            (5, serde_json::Value::Array(a)) => {
                a.pop();
            }
            (_, v) => *v = donor.clone(),
        },
    );
    Some(serde_json::to_vec(&doc).expect("values serialise"))
}

fn interesting_value(u: &mut Unstructured<'_>) -> serde_json::Value {
    let n = INTERESTING[u.choose_index(INTERESTING.len()).unwrap_or(0)];
    match u.int_in_range(0..=5u8).unwrap_or(0) {
        0..=2 => serde_json::from_str(n).unwrap_or(serde_json::Value::Null),
        3 => serde_json::Value::String(n.into()),
        4 => serde_json::Value::Null,
        _ => serde_json::json!([]),
    }
}

fn count_nodes(v: &serde_json::Value, n: &mut usize) {
    *n += 1;
    match v {
        serde_json::Value::Array(a) => a.iter().for_each(|x| count_nodes(x, n)),
        serde_json::Value::Object(m) => m.values().for_each(|x| count_nodes(x, n)),
        _ => {}
    }
}

fn find_node<'a>(v: &'a serde_json::Value, target: usize, k: &mut usize) -> Option<&'a serde_json::Value> {
    if *k == target {
        return Some(v);
    }
    *k += 1;
    match v {
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_node(x, target, k)),
        serde_json::Value::Object(m) => m.values().find_map(|x| find_node(x, target, k)),
        _ => None,
    }
}

fn edit(v: &mut serde_json::Value, target: usize, k: &mut usize, f: &mut dyn FnMut(&mut serde_json::Value)) -> bool {
    if *k == target {
        f(v);
        return true;
    }
    *k += 1;
    match v {
        serde_json::Value::Array(a) => a.iter_mut().any(|x| edit(x, target, k, f)),
        serde_json::Value::Object(m) => m.values_mut().any(|x| edit(x, target, k, f)),
        _ => false,
    }
}

/// What makes an input new: the words of its outcome (the error message),
/// leaving out numbers and every word the input itself holds (an input
/// echoed back in an error would make every input look new).
fn signature(input: &[u8], outcome: &str) -> String {
    let input = String::from_utf8_lossy(input);
    let words: Vec<&str> = outcome
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| w.len() >= 3 && !input.contains(w))
        .take(24)
        .collect();
    words.join(" ")
}

/// What one target's run found.
struct Stats {
    target: &'static str,
    execs: u64,
    seconds: f64,
    corpus: usize,
    outcomes: usize,
    crashes: u64,
    slowest_s: f64,
}

fn save(dir: &Path, kind: &str, input: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let h = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{kind}-{h:016x}"));
    let _ = std::fs::write(&path, input);
    path
}

fn fuzz(target: &Target, seconds: f64, seed: u64, hang_s: f64, out: &Path) -> Stats {
    let crashes_dir = out.join("crashes").join(target.name);
    let mut rng = Rng(seed ^ target.name.bytes().fold(0, |h, b| h * 31 + b as u64));
    let mut corpus: Vec<Vec<u8>> = target.seeds.clone();
    let mut outcomes: HashSet<String> = HashSet::new();
    let current: Arc<Mutex<(Instant, Vec<u8>, bool)>> = Arc::new(Mutex::new((Instant::now(), Vec::new(), false)));
    // The watchdog: an input that runs past the hang limit is saved and the
    // process stops (a hung input cannot be interrupted from inside).
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (current, done, dir, name) = (current.clone(), done.clone(), crashes_dir.clone(), target.name);
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let c = current.lock().unwrap_or_else(|e| e.into_inner());
                if c.2 && c.0.elapsed().as_secs_f64() > hang_s {
                    let path = save(&dir, "hang", &c.1);
                    eprintln!("{name}: HANG over {hang_s} s: input saved to {}", path.display());
                    std::process::exit(3);
                }
            }
        });
    }
    let start = Instant::now();
    let (mut execs, mut crashes, mut slowest) = (0u64, 0u64, 0f64);
    let mut run = |input: &[u8], corpus: &mut Vec<Vec<u8>>, execs: &mut u64| {
        {
            let mut c = current.lock().unwrap_or_else(|e| e.into_inner());
            *c = (Instant::now(), input.to_vec(), true);
        }
        let t = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
        let took = t.elapsed().as_secs_f64();
        current.lock().unwrap_or_else(|e| e.into_inner()).2 = false;
        *execs += 1;
        slowest = slowest.max(took);
        match result {
            Ok(outcome) => {
                let sig = signature(input, &outcome);
                if std::env::var_os("TENPLAN_FUZZ_SHOW").is_some() && !outcomes.contains(&sig) {
                    eprintln!("new outcome: {sig}");
                }
                if outcomes.len() < 100_000 && outcomes.insert(sig) && corpus.len() < 4096 {
                    corpus.push(input.to_vec());
                }
            }
            Err(_) => {
                crashes += 1;
                let path = save(&crashes_dir, "crash", input);
                eprintln!("{}: CRASH (panic): input saved to {}", target.name, path.display());
            }
        }
    };
    for s in target.seeds.clone() {
        run(&s, &mut corpus, &mut execs);
    }
    while start.elapsed().as_secs_f64() < seconds {
        let parent = corpus[(rng.next() % corpus.len() as u64) as usize].clone();
        let child = mutate(&parent, &corpus, &mut rng);
        run(&child, &mut corpus, &mut execs);
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    Stats {
        target: target.name,
        execs,
        seconds: start.elapsed().as_secs_f64(),
        corpus: corpus.len(),
        outcomes: outcomes.len(),
        crashes,
        slowest_s: slowest,
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: tenplan-fuzz TARGET|all [--seconds N] [--seed S] [--hang SECONDS] [--out DIR]\ntargets: {}",
        targets::NAMES.join(", ")
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(which) = args.first().cloned() else { usage() };
    let (mut seconds, mut seed, mut hang, mut out) = (10.0f64, 1u64, 20.0f64, PathBuf::from("target/fuzz"));
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--seconds" => seconds = v.parse().unwrap_or_else(|_| usage()),
            "--seed" => seed = v.parse().unwrap_or_else(|_| usage()),
            "--hang" => hang = v.parse().unwrap_or_else(|_| usage()),
            "--out" => out = PathBuf::from(v),
            _ => usage(),
        }
    }
    let names: Vec<&str> = if which == "all" {
        targets::NAMES.to_vec()
    } else if targets::NAMES.contains(&which.as_str()) {
        vec![targets::NAMES[targets::NAMES.iter().position(|n| *n == which).unwrap_or(0)]]
    } else {
        usage()
    };
    // Panics are expected to be caught and counted: keep their messages short.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    let mut all = Vec::new();
    for name in names {
        let target = targets::make(name, &out.join("work").join(name));
        let s = fuzz(&target, seconds, seed, hang, &out);
        println!(
            "{:<12} {:>9} execs in {:>6.1} s ({:>7.0}/s), corpus {:>5}, outcomes {:>5}, slowest {:.3} s, crashes {}",
            s.target,
            s.execs,
            s.seconds,
            s.execs as f64 / s.seconds,
            s.corpus,
            s.outcomes,
            s.slowest_s,
            s.crashes
        );
        all.push(s);
    }
    let crashes: u64 = all.iter().map(|s| s.crashes).sum();
    let total: u64 = all.iter().map(|s| s.execs).sum();
    println!("{total} executions, {crashes} crashes");
    if crashes > 0 {
        std::process::exit(1);
    }
}
