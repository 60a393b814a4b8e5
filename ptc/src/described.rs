//! Layouts as a group of ranks describes itself: each rank lists the boxes
//! of the tensors it holds (a torch state dict's local shards, a Megatron
//! job's sharded tensors), and the group's layout follows. Every rank of a
//! job builds the same layout from everyone's lists, so this runs once per
//! rank over the whole group's boxes: thousands of ranks times thousands of
//! tensors.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{Buffer, DType, DeviceId, Error, Layout, Region, Result, Shard, TensorId, TensorSpec};

/// One box of a tensor that a rank holds: the tensor's name, element type
/// and global shape, the box, and the buffer holding it (the tensor's name
/// when `None`; a rank holding two boxes of one tensor names them apart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBox {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its global shape.
    pub shape: Vec<u64>,
    /// The box of it the rank holds (an empty one holds nothing).
    pub region: Region,
    /// The buffer holding the box.
    pub buffer: Option<String>,
    /// The rank holds an addend of the box, not its value (a DTensor's
    /// `Partial` placement): the tensor's value is the sum of every
    /// holder's addend ([`Buffer::partial`]).
    pub partial: bool,
}

/// One rank of a group: its device and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankHolding {
    /// The device the rank runs on.
    pub device: DeviceId,
    /// Its boxes, each a buffer of its own.
    pub boxes: Vec<HeldBox>,
}

impl Layout {
    /// The layout of a group whose rank `r` holds `ranks[r]`: one shard per
    /// rank (`rank{r}`, on its device), one buffer per non-empty box. The
    /// tensors are numbered in `order` when given (every name described,
    /// once: two layouts of one problem must number them alike), else as
    /// they first appear. Ranks must agree on every tensor's shape and
    /// element type, and together cover every tensor ([`Layout::new`]'s
    /// checks); a tensor is held as addends on every rank that holds it or
    /// on none.
    pub fn from_rank_holdings(ranks: &[RankHolding], order: Option<&[String]>) -> Result<Layout> {
        let mut index: HashMap<&str, TensorId> = HashMap::new();
        let mut tensors: Vec<TensorSpec> = Vec::new();
        for (rank, holding) in ranks.iter().enumerate() {
            for b in &holding.boxes {
                match index.get(b.name.as_str()) {
                    None => {
                        index.insert(&b.name, tensors.len() as TensorId);
                        tensors.push(TensorSpec::new(b.name.clone(), b.dtype, b.shape.clone()));
                    }
                    Some(&t) => {
                        let known = &tensors[t as usize];
                        if known.shape != b.shape || known.dtype != b.dtype {
                            return Err(Error::DescribedDifferently {
                                tensor: b.name.clone(),
                                rank,
                                shape: b.shape.clone(),
                                dtype: b.dtype,
                                other_shape: known.shape.clone(),
                                other_dtype: known.dtype,
                            });
                        }
                    }
                }
            }
        }
        if let Some(order) = order {
            let mut given: Vec<&str> = order.iter().map(String::as_str).collect();
            let mut seen: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            given.sort_unstable();
            seen.sort_unstable();
            if given != seen {
                return Err(Error::OrderNamesOtherTensors);
            }
            let spec: HashMap<&str, &TensorSpec> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
            let ordered: Vec<TensorSpec> = order.iter().map(|n| spec[n.as_str()].clone()).collect();
            index = order
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_str(), i as TensorId))
                .collect();
            tensors = ordered;
        }
        let shards = ranks
            .iter()
            .enumerate()
            .map(|(rank, holding)| Shard {
                name: format!("rank{rank}"),
                devices: vec![holding.device],
                buffers: holding
                    .boxes
                    .iter()
                    .filter(|b| !b.region.is_empty())
                    .map(|b| {
                        let name = b.buffer.as_deref().unwrap_or(&b.name);
                        Buffer {
                            partial: b.partial,
                            ..Buffer::of_box(name, b.dtype, index[b.name.as_str()], b.region.clone())
                        }
                    })
                    .collect(),
            })
            .collect();
        Layout::new(Arc::from(tensors), shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(name: &str, shape: &[u64], rows: std::ops::Range<u64>) -> HeldBox {
        let region = Region::new(std::iter::once(rows).chain(shape[1..].iter().map(|&n| 0..n))).unwrap();
        HeldBox {
            name: name.into(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            region,
            buffer: None,
            partial: false,
        }
    }

    #[test]
    fn ranks_boxes_become_one_shard_each() {
        let ranks = vec![
            RankHolding {
                device: 4,
                boxes: vec![held("w", &[5, 2], 0..3), held("b", &[2], 0..2)],
            },
            RankHolding {
                device: 7,
                boxes: vec![held("w", &[5, 2], 3..5), held("b", &[2], 0..2), held("e", &[3], 0..0)],
            },
            RankHolding {
                device: 9,
                boxes: vec![held("e", &[3], 0..3)],
            },
        ];
        let layout = Layout::from_rank_holdings(&ranks, None).unwrap();
        let names: Vec<&str> = layout.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["w", "b", "e"]);
        assert_eq!(layout.devices().collect::<Vec<_>>(), [4, 7, 9]);
        // The empty box of `e` on rank 1 holds nothing.
        assert_eq!(layout.shard_of(7).unwrap().buffers.len(), 2);
        assert_eq!(layout.sub_tensors(0).len(), 2);
        assert_eq!(layout.sub_tensors(1)[0].holders, [4, 7]);

        let order: Vec<String> = ["e", "b", "w"].map(String::from).to_vec();
        let layout = Layout::from_rank_holdings(&ranks, Some(&order)).unwrap();
        let names: Vec<&str> = layout.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["e", "b", "w"]);
        assert_eq!(layout.shard_of(4).unwrap().buffers[0].pieces[0].tensor, 2);
    }

    #[test]
    fn disagreement_and_a_wrong_order_are_refused() {
        let two = |b: HeldBox| {
            vec![
                RankHolding {
                    device: 0,
                    boxes: vec![held("w", &[4, 2], 0..4)],
                },
                RankHolding {
                    device: 1,
                    boxes: vec![b],
                },
            ]
        };
        let err = Layout::from_rank_holdings(&two(held("w", &[4, 3], 0..4)), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor `w`: rank 1 has shape [4, 3] f32, another rank [4, 2] f32"
        );
        let order = vec!["w".to_string(), "v".to_string()];
        let err = Layout::from_rank_holdings(&two(held("w", &[4, 2], 0..4)), Some(&order)).unwrap_err();
        assert_eq!(err.to_string(), "`order` names other tensors than the descriptions");
        // Rows 2..4 of `v` are held by no rank.
        let err = Layout::from_rank_holdings(&two(held("v", &[4], 0..2)), None).unwrap_err();
        assert!(matches!(err, Error::IncompleteCover { .. }), "{err}");
    }

    #[test]
    fn addends_become_partial_buffers() {
        let addend = |rows| HeldBox {
            partial: true,
            ..held("g", &[4, 2], rows)
        };
        // Two ranks each hold an addend of rows 0..2, two of rows 2..4.
        let ranks: Vec<RankHolding> = [0..2, 0..2, 2..4, 2..4]
            .into_iter()
            .enumerate()
            .map(|(d, rows)| RankHolding {
                device: d as DeviceId,
                boxes: vec![addend(rows)],
            })
            .collect();
        let layout = Layout::from_rank_holdings(&ranks, None).unwrap();
        assert!(layout.is_partial(0));
        assert!(layout.shard_of(3).unwrap().buffers[0].partial);
        // One rank holding the value where the others hold addends.
        let mut mixed = ranks;
        mixed[3].boxes[0].partial = false;
        let err = Layout::from_rank_holdings(&mixed, None).unwrap_err();
        assert!(matches!(err, Error::MixedPartial { .. }), "{err}");
    }
}
