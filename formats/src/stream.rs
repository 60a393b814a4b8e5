//! Streaming writes of many files: each file is a header and then items
//! filled in parallel, batch by batch, while the previous batch is written.
//! Memory stays at two batches whatever the size of the files, and every
//! file appears under its name only once complete (temporary name, fsync,
//! rename).

use std::fs::{self, File};
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use rayon::prelude::*;

use crate::{Error, Result};

/// Bytes filled per batch: large enough to keep the cores and the disk busy,
/// small enough that two batches are a small part of any machine's memory.
pub(crate) const BATCH_BYTES: usize = 64 << 20;

/// One file to write: its header bytes, then its items' bytes in order.
pub(crate) struct OutFile<T> {
    /// The file's name in the directory.
    pub name: String,
    /// Bytes before the first item.
    pub header: Vec<u8>,
    /// Work items and the number of bytes each fills.
    pub items: Vec<(T, usize)>,
}

impl<T> OutFile<T> {
    /// The file's size.
    pub fn bytes(&self) -> u64 {
        self.header.len() as u64 + self.items.iter().map(|(_, n)| *n as u64).sum::<u64>()
    }
}

/// A batch: consecutive items of one file.
struct Job {
    file: usize,
    items: Range<usize>,
    first: bool,
    last: bool,
}

fn jobs<T>(files: &[OutFile<T>]) -> Vec<Job> {
    let mut out = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let mut start = 0;
        let mut bytes = f.header.len();
        let mut first = true;
        for (i, (_, n)) in f.items.iter().enumerate() {
            if i > start && bytes + n > BATCH_BYTES {
                out.push(Job {
                    file: fi,
                    items: start..i,
                    first,
                    last: false,
                });
                first = false;
                start = i;
                bytes = 0;
            }
            bytes += n;
        }
        out.push(Job {
            file: fi,
            items: start..f.items.len(),
            first,
            last: true,
        });
    }
    out
}

/// Write every file into `dir`. `fill(item, bytes)` writes one item's bytes;
/// it is called in parallel on the items of a batch. `progress` gets the byte
/// count of every filled item.
pub(crate) fn write_files<T: Sync>(
    dir: &Path,
    files: &[OutFile<T>],
    fill: &(dyn Fn(&T, &mut [u8]) -> Result<()> + Sync),
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let mut open: Option<File> = None;
    let mut pending: Option<(&Job, Vec<u8>)> = None;
    let mut spare: Vec<u8> = Vec::new();
    let jobs = jobs(files);
    for job in &jobs {
        let f = &files[job.file];
        let mut buf = std::mem::take(&mut spare);
        let head = if job.first { f.header.as_slice() } else { &[] };
        let len = head.len() + f.items[job.items.clone()].iter().map(|(_, n)| n).sum::<usize>();
        buf.clear();
        // Zeroed, so nothing of an earlier batch can reach a file.
        buf.resize(len, 0);
        let (written, filled) = rayon::join(
            || match pending.take() {
                Some((done, bytes)) => emit(dir, files, done, &bytes, &mut open).map(|()| bytes),
                None => Ok(Vec::new()),
            },
            || {
                buf[..head.len()].copy_from_slice(head);
                fill_batch(&f.items[job.items.clone()], &mut buf[head.len()..], fill, progress).map(|()| buf)
            },
        );
        spare = written?;
        pending = Some((job, filled?));
    }
    if let Some((done, bytes)) = pending {
        emit(dir, files, done, &bytes, &mut open)?;
    }
    Ok(())
}

fn fill_batch<T: Sync>(
    items: &[(T, usize)],
    mut out: &mut [u8],
    fill: &(dyn Fn(&T, &mut [u8]) -> Result<()> + Sync),
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let mut work = Vec::with_capacity(items.len());
    for (item, n) in items {
        let (here, rest) = out.split_at_mut(*n);
        work.push((item, here));
        out = rest;
    }
    work.into_par_iter().try_for_each(|(item, bytes)| {
        fill(item, bytes)?;
        progress(bytes.len() as u64);
        Ok(())
    })
}

/// Write one filled batch: open the file's temporary name on its first
/// batch, sync and rename it after its last.
fn emit<T>(dir: &Path, files: &[OutFile<T>], job: &Job, bytes: &[u8], open: &mut Option<File>) -> Result<()> {
    let name = &files[job.file].name;
    let tmp = dir.join(format!(".{name}.tmp"));
    if job.first {
        *open = Some(File::create(&tmp).map_err(Error::io("create", &tmp))?);
    }
    let file = open.as_mut().expect("a file is open from its first batch to its last");
    file.write_all(bytes).map_err(Error::io("write", &tmp))?;
    if job.last {
        file.sync_all().map_err(Error::io("sync", &tmp))?;
        *open = None;
        fs::rename(&tmp, dir.join(name)).map_err(Error::io("rename", &tmp))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_hold_header_then_items_in_order_across_batches() {
        let dir = std::env::temp_dir().join(format!("tenplan-stream-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // Items of 24 MiB: three per batch at most, so files span batches.
        let big = 24 << 20;
        let files: Vec<OutFile<u8>> = vec![
            OutFile {
                name: "a".into(),
                header: b"head".to_vec(),
                items: (0..7u8).map(|i| (i, big)).collect(),
            },
            OutFile {
                name: "empty".into(),
                header: Vec::new(),
                items: Vec::new(),
            },
            OutFile {
                name: "b".into(),
                header: b"h".to_vec(),
                items: vec![(9, 3), (10, 0), (11, 5)],
            },
        ];
        assert!(jobs(&files).len() >= 5);
        let seen = std::sync::atomic::AtomicU64::new(0);
        write_files(
            &dir,
            &files,
            &|&i, out| {
                out.fill(i);
                Ok(())
            },
            &|n| {
                seen.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            },
        )
        .unwrap();
        let a = fs::read(dir.join("a")).unwrap();
        assert_eq!(a.len() as u64, files[0].bytes());
        assert_eq!(&a[..4], b"head");
        for i in 0..7 {
            let at = 4 + i * big;
            assert!(a[at..at + big].iter().all(|&x| x == i as u8));
        }
        assert!(fs::read(dir.join("empty")).unwrap().is_empty());
        assert_eq!(fs::read(dir.join("b")).unwrap(), b"h\x09\x09\x09\x0b\x0b\x0b\x0b\x0b");
        assert_eq!(seen.into_inner(), 7 * big as u64 + 8);
        // No temporary file is left.
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b", "empty"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_item_stops_the_write_before_the_file_is_named() {
        let dir = std::env::temp_dir().join(format!("tenplan-stream-fail-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let files = vec![OutFile {
            name: "x".into(),
            header: Vec::new(),
            items: vec![(0u8, 4), (1, 4)],
        }];
        let r = write_files(
            &dir,
            &files,
            &|&i, _| {
                if i == 1 {
                    Err(Error::file("x", "bad item"))
                } else {
                    Ok(())
                }
            },
            &|_| {},
        );
        assert!(r.is_err());
        assert!(!dir.join("x").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
