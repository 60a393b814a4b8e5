//! Errors of model layouts: invalid parallel configurations, named by their numbers.

/// Why a model or a parallel layout could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No model of that name.
    #[error("unknown model `{name}` (known: {known})")]
    UnknownModel {
        /// The name given.
        name: String,
        /// The known names.
        known: String,
    },
    /// A layout string that cannot be parsed.
    #[error("malformed layout `{input}`: {why}")]
    ParseLayout {
        /// The string.
        input: String,
        /// What is wrong.
        why: String,
    },
    /// A layout a model's tensors cannot take.
    #[error("layout `{layout}` does not fit {model}: {why}")]
    DoesNotFit {
        /// The layout.
        layout: String,
        /// The model (its family and config class).
        model: String,
        /// What cannot be split or placed.
        why: String,
    },
    /// A Hugging Face `config.json` that cannot describe a model.
    #[error("{file}{sep}{why}", sep = if file.is_empty() { "" } else { ": " })]
    Config {
        /// The file (empty for a config given as text).
        file: String,
        /// What is wrong, naming the field.
        why: String,
    },
    /// Planning a layout would need more memory than this machine has
    /// available; found before the layout is built.
    #[error(
        "layout {layout} of {model} would need about {:.2} GB of memory to plan ({pieces} pieces at {} bytes each), more than the {:.2} GB this machine has available",
        *need as f64 / 1e9,
        tenplan_ptc::limits::BYTES_PER_PIECE,
        *available as f64 / 1e9
    )]
    TooLarge {
        /// The layout.
        layout: String,
        /// Model.
        model: String,
        /// Estimated pieces its devices hold.
        pieces: u64,
        /// Estimated bytes.
        need: u64,
        /// Bytes available.
        available: u64,
    },
    /// A parallel degree of zero.
    #[error("{what} must be at least 1")]
    ZeroDegree {
        /// `tp`, `pp`, `dp`, `ep`, or a mesh dimension.
        what: &'static str,
    },
    /// The tensor-parallel degree does not divide the attention heads.
    #[error("tp={tp} does not divide the {heads} attention heads (num_attention_heads) of {model}")]
    TpHeads {
        /// Model.
        model: String,
        /// Tensor-parallel degree.
        tp: u32,
        /// Heads.
        heads: u32,
    },
    /// A serving (inference-engine) layout that cannot be built.
    #[error("serving layout of {model}: {what}")]
    Serving {
        /// Model.
        model: String,
        /// What is wrong.
        what: String,
    },
    /// The tensor-parallel degree does not divide the query groups.
    #[error("tp={tp} does not divide the {groups} query groups (num_key_value_heads) of {model}")]
    TpGroups {
        /// Model.
        model: String,
        /// Tensor-parallel degree.
        tp: u32,
        /// Query groups.
        groups: u32,
    },
    /// The tensor-parallel degree does not divide a split dimension.
    #[error("tp={tp} does not divide dimension {dim} (= {size}) of `{tensor}`")]
    TpDim {
        /// Tensor.
        tensor: String,
        /// Tensor-parallel degree.
        tp: u32,
        /// Dimension.
        dim: usize,
        /// Its size.
        size: u64,
    },
    /// More pipeline stages than layers.
    #[error("pp={pp} is larger than the {layers} layers of {model}")]
    PpLayers {
        /// Model.
        model: String,
        /// Pipeline-parallel degree.
        pp: u32,
        /// Layers.
        layers: u32,
    },
    /// Layers do not split evenly and no explicit split was given.
    #[error("pp={pp} does not divide the {layers} layers of {model}; give an explicit split such as split={example}")]
    PpUneven {
        /// Model.
        model: String,
        /// Pipeline-parallel degree.
        pp: u32,
        /// Layers.
        layers: u32,
        /// A valid split to suggest.
        example: String,
    },
    /// An explicit layer split that does not fit.
    #[error("split {split:?} must have pp={pp} positive entries adding up to the {layers} layers")]
    BadSplit {
        /// The split.
        split: Vec<u32>,
        /// Pipeline-parallel degree.
        pp: u32,
        /// Layers.
        layers: u32,
    },
    /// The device list does not match tp·pp·dp.
    #[error("tp={tp} x pp={pp} x dp={dp} = {needed} ranks, but {given} devices were given")]
    DeviceCount {
        /// Tensor-parallel degree.
        tp: u32,
        /// Pipeline-parallel degree.
        pp: u32,
        /// Data-parallel degree.
        dp: u32,
        /// tp·pp·dp.
        needed: u64,
        /// Devices given.
        given: u64,
    },
    /// A state kind that is not `training`, `weights+grads` or `weights:DTYPE`.
    #[error("unknown state `{name}` (expected training, weights+grads or weights:DTYPE)")]
    UnknownState {
        /// What was given.
        name: String,
    },
    /// A configuration needs more devices than the cluster has.
    #[error("layout {layout} needs devices 0..{ranks}, but cluster {cluster} has {devices} devices")]
    ClusterTooSmall {
        /// The configuration.
        layout: String,
        /// Devices it needs (ranks, or the highest device named plus one).
        ranks: u64,
        /// The cluster's name.
        cluster: String,
        /// Its compute devices.
        devices: u64,
    },
    /// Expert parallelism that does not divide the experts.
    #[error("ep={ep} does not divide the {experts} experts of {model}")]
    EpExperts {
        /// Model.
        model: String,
        /// Expert-parallel degree.
        ep: u32,
        /// Experts.
        experts: u32,
    },
    /// Expert parallelism that does not divide data parallelism.
    #[error("ep={ep} does not divide dp={dp} (expert parallelism is carved out of data parallelism)")]
    EpDp {
        /// Expert-parallel degree.
        ep: u32,
        /// Data-parallel degree.
        dp: u32,
    },
    /// Expert parallelism on a dense model.
    #[error("ep={ep} asked for, but {model} has no experts")]
    EpDense {
        /// Model.
        model: String,
        /// Expert-parallel degree.
        ep: u32,
    },
    /// An unsupported ZeRO stage.
    #[error("zero={zero} is not supported (0: optimizer state follows the parameters; 1: distributed optimizer)")]
    Zero {
        /// The stage.
        zero: u32,
    },
    /// ZeRO asked for of a state without a training state's optimizer.
    #[error("zero=1 shards a training state's optimizer into flat buffers, but the state is `{state}`")]
    ZeroWithoutOptimizer {
        /// The state's kind.
        state: String,
    },
    /// The layout came out invalid (a bug in this crate if it ever happens).
    #[error(transparent)]
    Ptc(#[from] tenplan_ptc::Error),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
