//! `torch.save` archives of single tensors, as DCP's default writer stores
//! each chunk inside its `.distcp` files: a zip of stored (uncompressed)
//! entries — `data.pkl` (the pickled call that rebuilds the tensor from its
//! storage), `byteorder`, `version` and the storage's bytes, `data/0`, last
//! and aligned to 64 bytes. The bytes around the data are made here; the
//! data is written between them by the caller, and its CRC-32 set into the
//! two places that hold it once it is known ([`TensorArchive::crc_at`]).
//! Entries over 4 GiB use ZIP64 records.

use tenplan_ptc::DType;

use crate::pickle_writer::PickleWriter;

/// The archive's top directory, as `torch.save` names it.
const ROOT: &str = "archive";
/// Where the storage's bytes start, relative to the archive: a multiple of
/// this (torch's `.storage_alignment`).
const ALIGN: u64 = 64;
/// An extra field's id for padding (torch's own, "FB").
const PAD_ID: u16 = 0x4246;
/// ZIP64's extended information extra field.
const ZIP64_ID: u16 = 0x0001;
/// 1980-01-01, the earliest DOS date (zip entries carry no meaningful time).
const DOS_DATE: u16 = (1 << 5) | 1;

/// The storage class of an element type, as `torch.save` pickles it.
pub(crate) fn storage_class(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "FloatStorage",
        DType::F16 => "HalfStorage",
        DType::BF16 => "BFloat16Storage",
        DType::F64 => "DoubleStorage",
        DType::I64 => "LongStorage",
        DType::I32 => "IntStorage",
        DType::U8 => "ByteStorage",
        _ => return None,
    })
}

/// A tensor's archive: what comes before its data, the data's length, and
/// what comes after.
#[derive(Clone, Debug)]
pub(crate) struct TensorArchive {
    /// Local headers and small entries, then `data/0`'s local header.
    pub prefix: Vec<u8>,
    /// Bytes of the tensor's data.
    pub data_len: u64,
    /// The central directory and its end records.
    pub suffix: Vec<u8>,
    /// Offsets, from the archive's start, of the two CRC-32 fields of
    /// `data/0` (its local header, its central directory entry), zero until
    /// the data's CRC is written there.
    pub crc_at: [u64; 2],
}

/// A zip entry's record as the central directory needs it.
struct Entry {
    name: String,
    crc: u32,
    size: u64,
    offset: u64,
}

fn u16le(out: &mut Vec<u8>, x: u16) {
    out.extend(x.to_le_bytes());
}

fn u32le(out: &mut Vec<u8>, x: u32) {
    out.extend(x.to_le_bytes());
}

fn u64le(out: &mut Vec<u8>, x: u64) {
    out.extend(x.to_le_bytes());
}

/// A 32-bit field, or the ZIP64 marker where the value does not fit.
fn field32(x: u64) -> u32 {
    u32::try_from(x).ok().filter(|&v| v != u32::MAX).unwrap_or(u32::MAX)
}

/// A local file header: the entry's name, its sizes (ZIP64 in an extra
/// field when they do not fit 32 bits), and `pad` bytes of padding.
fn local_header(out: &mut Vec<u8>, name: &str, crc: u32, size: u64, pad: u16) {
    let big = field32(size) == u32::MAX;
    u32le(out, 0x0403_4b50);
    u16le(out, if big { 45 } else { 20 });
    u16le(out, 0); // flags
    u16le(out, 0); // stored
    u16le(out, 0); // time
    u16le(out, DOS_DATE);
    u32le(out, crc);
    u32le(out, field32(size));
    u32le(out, field32(size));
    u16le(out, name.len() as u16);
    let extra = if big { 20 } else { 0 } + if pad > 0 { 4 + pad } else { 0 };
    u16le(out, extra);
    out.extend(name.as_bytes());
    if big {
        u16le(out, ZIP64_ID);
        u16le(out, 16);
        u64le(out, size);
        u64le(out, size);
    }
    if pad > 0 {
        u16le(out, PAD_ID);
        u16le(out, pad);
        out.extend(std::iter::repeat_n(0u8, pad as usize));
    }
}

/// Length of a local header with no padding.
fn local_header_len(name: &str, size: u64) -> u64 {
    30 + name.len() as u64 + if field32(size) == u32::MAX { 20 } else { 0 }
}

/// A small entry, whole: its local header and bytes.
fn small_entry(out: &mut Vec<u8>, entries: &mut Vec<Entry>, name: String, data: &[u8]) {
    let crc = crc32fast::hash(data);
    let offset = out.len() as u64;
    local_header(out, &name, crc, data.len() as u64, 0);
    out.extend(data);
    entries.push(Entry {
        name,
        crc,
        size: data.len() as u64,
        offset,
    });
}

/// `data.pkl`: `torch._utils._rebuild_tensor_v2` of a contiguous tensor
/// of `shape` over storage `0` on the CPU.
fn data_pkl(class: &str, shape: &[u64]) -> Vec<u8> {
    let numel: u64 = shape.iter().product();
    let mut strides = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let mut w = PickleWriter::new(2);
    w.global("torch._utils", "_rebuild_tensor_v2").mark();
    w.mark()
        .str("storage")
        .global("torch", class)
        .str("0")
        .str("cpu")
        .int(numel as i64)
        .tuple();
    w.persistent();
    w.int(0).int_tuple(shape).int_tuple(&strides).bool(false);
    w.global("collections", "OrderedDict").mark().tuple().reduce();
    w.tuple().reduce();
    w.finish()
}

impl TensorArchive {
    /// The whole archive of a small tensor of `dtype` and `shape` whose
    /// elements are `data` (row-major), its CRCs filled in; `None` for an
    /// element type `torch.save` has no storage class for here, or data of
    /// another length.
    pub fn whole(dtype: DType, shape: &[u64], data: &[u8]) -> Option<Vec<u8>> {
        let a = TensorArchive::new(dtype, shape)?;
        if a.data_len != data.len() as u64 {
            return None;
        }
        let mut out = a.prefix;
        out.extend(data);
        out.extend(a.suffix);
        let crc = crc32fast::hash(data).to_le_bytes();
        for at in a.crc_at {
            out[at as usize..at as usize + 4].copy_from_slice(&crc);
        }
        Some(out)
    }

    /// The archive of a contiguous tensor of `dtype` and `shape` (empty for
    /// a 0-d tensor); `None` for an element type `torch.save` has no
    /// storage class for here.
    pub fn new(dtype: DType, shape: &[u64]) -> Option<TensorArchive> {
        let class = storage_class(dtype)?;
        let data_len = shape.iter().product::<u64>() * dtype.size();
        let mut prefix = Vec::new();
        let mut entries = Vec::new();
        small_entry(
            &mut prefix,
            &mut entries,
            format!("{ROOT}/data.pkl"),
            &data_pkl(class, shape),
        );
        small_entry(&mut prefix, &mut entries, format!("{ROOT}/byteorder"), b"little");
        small_entry(&mut prefix, &mut entries, format!("{ROOT}/version"), b"3\n");
        // data/0 last, its bytes aligned.
        let name = format!("{ROOT}/data/0");
        let offset = prefix.len() as u64;
        let bare = offset + local_header_len(&name, data_len);
        let pad = match bare % ALIGN {
            0 => 0,
            r => {
                // A padding field needs 4 bytes of its own.
                let mut p = ALIGN - r;
                if p < 4 {
                    p += ALIGN;
                }
                p - 4
            }
        };
        let local_crc = offset + 14;
        local_header(&mut prefix, &name, 0, data_len, pad as u16);
        debug_assert_eq!(prefix.len() as u64 % ALIGN, 0);
        entries.push(Entry {
            name,
            crc: 0,
            size: data_len,
            offset,
        });
        // The central directory.
        let cd_start = prefix.len() as u64 + data_len;
        let mut suffix = Vec::new();
        let mut central_crc = 0;
        for e in &entries {
            let big = field32(e.size) == u32::MAX || field32(e.offset) == u32::MAX;
            if e.name.ends_with("/data/0") {
                central_crc = cd_start + suffix.len() as u64 + 16;
            }
            u32le(&mut suffix, 0x0201_4b50);
            u16le(&mut suffix, 45); // made by
            u16le(&mut suffix, if big { 45 } else { 20 });
            u16le(&mut suffix, 0);
            u16le(&mut suffix, 0);
            u16le(&mut suffix, 0);
            u16le(&mut suffix, DOS_DATE);
            u32le(&mut suffix, e.crc);
            u32le(&mut suffix, field32(e.size));
            u32le(&mut suffix, field32(e.size));
            u16le(&mut suffix, e.name.len() as u16);
            u16le(&mut suffix, if big { 28 } else { 0 });
            u16le(&mut suffix, 0); // comment
            u16le(&mut suffix, 0); // disk
            u16le(&mut suffix, 0); // internal attributes
            u32le(&mut suffix, 0); // external attributes
            u32le(&mut suffix, field32(e.offset));
            suffix.extend(e.name.as_bytes());
            if big {
                u16le(&mut suffix, ZIP64_ID);
                u16le(&mut suffix, 24);
                u64le(&mut suffix, e.size);
                u64le(&mut suffix, e.size);
                u64le(&mut suffix, e.offset);
            }
        }
        let cd_len = suffix.len() as u64;
        let n = entries.len() as u64;
        if field32(cd_start) == u32::MAX {
            // ZIP64 end of central directory record, and its locator.
            let record = cd_start + cd_len;
            u32le(&mut suffix, 0x0606_4b50);
            u64le(&mut suffix, 44);
            u16le(&mut suffix, 45);
            u16le(&mut suffix, 45);
            u32le(&mut suffix, 0);
            u32le(&mut suffix, 0);
            u64le(&mut suffix, n);
            u64le(&mut suffix, n);
            u64le(&mut suffix, cd_len);
            u64le(&mut suffix, cd_start);
            u32le(&mut suffix, 0x0706_4b50);
            u32le(&mut suffix, 0);
            u64le(&mut suffix, record);
            u32le(&mut suffix, 1);
        }
        u32le(&mut suffix, 0x0605_4b50);
        u16le(&mut suffix, 0);
        u16le(&mut suffix, 0);
        u16le(&mut suffix, n as u16);
        u16le(&mut suffix, n as u16);
        u32le(&mut suffix, field32(cd_len));
        u32le(&mut suffix, field32(cd_start));
        u16le(&mut suffix, 0);
        Some(TensorArchive {
            prefix,
            data_len,
            suffix,
            crc_at: [local_crc, central_crc],
        })
    }

    /// The archive's length.
    pub fn len(&self) -> u64 {
        self.prefix.len() as u64 + self.data_len + self.suffix.len() as u64
    }

    /// The whole archive of `data` (small tensors, tests).
    #[cfg(test)]
    pub fn with_data(&self, data: &[u8]) -> Vec<u8> {
        let mut out = self.prefix.clone();
        out.extend(data);
        out.extend(&self.suffix);
        let crc = crc32fast::hash(data).to_le_bytes();
        for at in self.crc_at {
            out[at as usize..at as usize + 4].copy_from_slice(&crc);
        }
        out
    }
}

/// A `torch.save` archive of an object that holds no tensor, given as its
/// pickle (protocol 2): `data.pkl`, `byteorder` and `version`, stored.
pub(crate) fn object_archive(pkl: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in [
        ("data.pkl", pkl),
        ("byteorder", b"little".as_slice()),
        ("version", b"3\n"),
    ] {
        zip.start_file(format!("{ROOT}/{name}"), stored)
            .and_then(|_| zip.write_all(bytes).map_err(Into::into))
            .expect("writing to memory does not fail");
    }
    zip.finish().expect("writing to memory does not fail").into_inner()
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Read};

    use super::*;

    #[test]
    fn an_object_archive_holds_its_pickle() {
        let mut w = PickleWriter::new(2);
        w.empty_dict();
        let bytes = object_archive(&w.finish());
        let v = crate::dcp::megatron::common_keys(&bytes).unwrap();
        assert!(v.is_empty());
    }

    #[test]
    fn archives_are_zips_whose_data_is_aligned_and_checked() {
        for shape in [vec![2u64, 3], vec![], vec![5], vec![1, 1, 7]] {
            let a = TensorArchive::new(DType::F32, &shape).unwrap();
            assert_eq!(a.prefix.len() % 64, 0, "{shape:?}");
            let n: u64 = shape.iter().product();
            let data: Vec<u8> = (0..n as u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
            let bytes = a.with_data(&data);
            assert_eq!(bytes.len() as u64, a.len());
            // Read by a zip reader that checks every CRC.
            let mut z = zip::ZipArchive::new(Cursor::new(&bytes)).unwrap();
            let mut back = Vec::new();
            z.by_name("archive/data/0").unwrap().read_to_end(&mut back).unwrap();
            assert_eq!(back, data);
            let mut order = String::new();
            z.by_name("archive/byteorder")
                .unwrap()
                .read_to_string(&mut order)
                .unwrap();
            assert_eq!(order, "little");
            let mut pkl = Vec::new();
            z.by_name("archive/data.pkl").unwrap().read_to_end(&mut pkl).unwrap();
            let v = crate::pickle::load(&pkl).unwrap();
            let o = v.as_object().unwrap();
            assert_eq!(o.class_name().as_deref(), Some("torch._utils._rebuild_tensor_v2"));
        }
    }
}
