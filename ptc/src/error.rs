//! Errors of the PTC types: every way a layout, cluster or problem can be invalid.

use crate::{DType, DeviceId, Region};

/// Why a PTC value could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A dtype name that is not known.
    #[error("unknown dtype `{name}` (expected one of f64, f32, f16, bf16, i64, i32, u8)")]
    UnknownDType {
        /// The name given.
        name: String,
    },
    /// A range with `lo > hi`.
    #[error("range {lo}:{hi} on dimension {dim} is inverted")]
    InvalidRange {
        /// Dimension.
        dim: usize,
        /// Lower end.
        lo: u64,
        /// Upper end.
        hi: u64,
    },
    /// Two tensors share a name.
    #[error("tensor `{name}` is declared twice")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A tensor with no dimensions or a zero-sized one.
    #[error("tensor `{name}` has shape {shape:?}: every tensor needs at least one dimension and no zero extents")]
    BadShape {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A piece names a tensor index that does not exist.
    #[error("shard `{shard}` buffer `{buffer}`: piece refers to tensor #{tensor}, but there are {count} tensors")]
    UnknownTensor {
        /// Shard name.
        shard: String,
        /// Buffer name.
        buffer: String,
        /// The index given.
        tensor: u32,
        /// Number of tensors.
        count: usize,
    },
    /// A piece's box does not lie inside its tensor or is empty.
    #[error("tensor `{tensor}`: box {region} is empty or outside its shape {shape:?} (shard `{shard}`)")]
    BoxOutOfBounds {
        /// Tensor name.
        tensor: String,
        /// The box.
        region: Box<Region>,
        /// The tensor's shape.
        shape: Vec<u64>,
        /// Shard name.
        shard: String,
    },
    /// A piece's dtype does not match its buffer.
    #[error(
        "shard `{shard}` buffer `{buffer}` is {buffer_dtype} but holds a piece of `{tensor}`, which is {tensor_dtype}"
    )]
    DTypeMismatch {
        /// Shard name.
        shard: String,
        /// Buffer name.
        buffer: String,
        /// Buffer dtype.
        buffer_dtype: crate::DType,
        /// Tensor name.
        tensor: String,
        /// Tensor dtype.
        tensor_dtype: crate::DType,
    },
    /// Pieces overlap inside a buffer, or run past its end.
    #[error(
        "shard `{shard}` buffer `{buffer}` (length {len}): pieces overlap or run past the end near element {offset}"
    )]
    BufferOverlap {
        /// Shard name.
        shard: String,
        /// Buffer name.
        buffer: String,
        /// Buffer length.
        len: u64,
        /// Where the problem is.
        offset: u64,
    },
    /// A shard has no devices, repeats a device, or a device holds two shards.
    #[error("device {device} is listed twice (shard `{shard}`): a device holds at most one shard of a layout")]
    DeviceReused {
        /// Device.
        device: DeviceId,
        /// Shard name.
        shard: String,
    },
    /// A shard with no devices.
    #[error("shard `{shard}` is allocated to no device")]
    UnallocatedShard {
        /// Shard name.
        shard: String,
    },
    /// Two buffers of a shard share a name.
    #[error("shard `{shard}` has two buffers named `{buffer}`")]
    DuplicateBuffer {
        /// Shard name.
        shard: String,
        /// Buffer name.
        buffer: String,
    },
    /// One shard holds two boxes of a tensor that overlap without being
    /// the same box (replicas on other shards may cut a tensor differently;
    /// one shard holds each element once).
    #[error("shard `{shard}`: tensor `{tensor}`: boxes {a} and {b} overlap (a shard holds each element of a tensor at most once)")]
    OverlappingBoxes {
        /// Shard name.
        shard: String,
        /// Tensor name.
        tensor: String,
        /// One box.
        a: Box<Region>,
        /// The other.
        b: Box<Region>,
    },
    /// The sub-tensors of a tensor do not cover it.
    #[error("tensor `{tensor}`: its pieces cover {covered} of {total} elements (every element must be held)")]
    IncompleteCover {
        /// Tensor name.
        tensor: String,
        /// Elements covered.
        covered: u64,
        /// Elements in the tensor.
        total: u64,
    },
    /// Two ranks of a group describe one tensor with different shapes or
    /// element types.
    #[error("tensor `{tensor}`: rank {rank} has shape {shape:?} {dtype}, another rank {other_shape:?} {other_dtype}")]
    DescribedDifferently {
        /// Tensor name.
        tensor: String,
        /// The rank whose description disagrees with an earlier one.
        rank: usize,
        /// Its shape.
        shape: Vec<u64>,
        /// Its element type.
        dtype: DType,
        /// The shape an earlier rank gave.
        other_shape: Vec<u64>,
        /// The element type an earlier rank gave.
        other_dtype: DType,
    },
    /// The order given for a group's tensors is not a permutation of the
    /// tensors the ranks describe.
    #[error("`order` names other tensors than the descriptions")]
    OrderNamesOtherTensors,
    /// A cluster parameter is out of range.
    #[error("invalid cluster: {what}")]
    InvalidCluster {
        /// What is wrong.
        what: String,
    },
    /// A cluster description that cannot be parsed.
    #[error("unknown cluster `{spec}` (expected NODESxGPUS such as 4x4, or a preset: {presets})")]
    UnknownCluster {
        /// What was given.
        spec: String,
        /// Known presets.
        presets: String,
    },
    /// A layout places a shard on a device the cluster does not have.
    #[error("{which} layout uses device {device}, but the cluster has {count} devices")]
    DeviceOutOfRange {
        /// `source` or `target`.
        which: &'static str,
        /// Device.
        device: DeviceId,
        /// Number of devices.
        count: u32,
    },
    /// The target layout places a shard on a dead device.
    #[error("target layout places shard `{shard}` on dead device {device}")]
    TargetOnDeadDevice {
        /// Shard name.
        shard: String,
        /// Device.
        device: DeviceId,
    },
    /// A tensor is partial in some buffers and not in others.
    #[error("tensor `{tensor}` is held as partial sums in some buffers and whole in others")]
    MixedPartial {
        /// Tensor name.
        tensor: String,
    },
    /// A target layout holds partial sums: targets hold reduced values.
    #[error("the target layout holds tensor `{tensor}` as partial sums; a target holds reduced values")]
    PartialTarget {
        /// Tensor name.
        tensor: String,
    },
    /// The two layouts describe different tensors: what differs first, and
    /// how many tensors differ.
    #[error("source and target layouts describe different tensors: {first}{}", if *count > 1 { format!(" (and {} more)", count - 1) } else { String::new() })]
    TensorsDiffer {
        /// The first difference: a tensor on one side only, or one whose
        /// element type or shape differs.
        first: String,
        /// How many tensors differ.
        count: usize,
    },
    /// A size beyond one of the sane limits of [`crate::limits`].
    #[error("{what} = {value} exceeds the limit of {max}")]
    Limit {
        /// What is counted.
        what: &'static str,
        /// The value given (saturated at `u64::MAX`).
        value: u64,
        /// The limit.
        max: u64,
    },
    /// A problem or plan file's header is wrong.
    #[error("{what}")]
    Format {
        /// What is wrong.
        what: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
