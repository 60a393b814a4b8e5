//! Logical tensors.

use serde::{Deserialize, Serialize};

use crate::DType;

/// Index of a tensor in a problem's tensor list.
pub type TensorId = u32;

/// A logical tensor of the job: its name, element type and global shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Unique name, such as `decoder.layers.0.mlp.linear_fc1.weight`.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Global shape.
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// A tensor spec.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<u64>>) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.into(),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.numel() * self.dtype.size()
    }
}
