//! The plan: the copies and zero-fills that turn the source state into the target state.

use serde::{Deserialize, Serialize};

use crate::problem::check_header;
use crate::{DeviceId, Error, Problem, Region, Result, TensorId};

/// The `format` tag of a plan file.
pub const PLAN_FORMAT: &str = "tenplan-plan";
/// The version of the plan format this crate writes and reads.
pub const PLAN_VERSION: u32 = 1;

/// Copy the elements of `region` of `tensor` from device `src` (which holds
/// them in the source layout) to device `dst`, optionally relayed through
/// the devices of `via`, in order. On `dst` the elements land in buffer `buffer` (an index into
/// the buffers of `dst`'s target shard), in the target piece that starts at
/// element `offset` of that buffer: element `e` of the region goes to
/// `offset + row-major position of e in that piece's box`.
///
/// A copy may be a multicast: `dst` forwards the data it receives to each
/// device of `fanout` as well, which writes it in its own piece, pipelined
/// (chunk by chunk, as it arrives). Under [`crate::Forwarding::Node`] (the
/// default) the fanout devices sit on `dst`'s node and `src` does not: the
/// data crosses the network once for several devices of one node. Under
/// [`crate::Forwarding::Cluster`] they may sit anywhere: `dst` passes the
/// data on over the network too (a two-level broadcast tree).
///
/// A relay may keep what passes through it: a forward marked
/// [`Forward::in_passing`] names a device of `via`, which writes the data
/// in its piece as it relays it, with no hop of its own. A chain through
/// many devices that each keep a part of what they relay (a pipelined
/// broadcast, as NCCL's ring performs it) is one copy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxCopy {
    /// Device read from.
    pub src: DeviceId,
    /// Device written to.
    pub dst: DeviceId,
    /// Relays: the data goes to these devices in order and is forwarded from
    /// the last one (empty: sent directly).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub via: Vec<DeviceId>,
    /// The tensor.
    pub tensor: TensorId,
    /// The box copied.
    #[serde(rename = "box")]
    pub region: Region,
    /// Destination buffer, as an index into the destination shard's buffers.
    pub buffer: u32,
    /// Offset of the destination piece in that buffer.
    pub offset: u64,
    /// Add into the destination instead of overwriting it: the copy carries
    /// one addend of a partial tensor (see [`crate::Buffer::partial`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reduce: bool,
    /// Staging round: copies of round `r` start once every copy of the
    /// earlier rounds has landed (a barrier), so that the receive buffers in
    /// flight fit a memory budget. Rounds are scheduling only; they never
    /// change what a plan writes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: u32,
    /// Further destinations: `dst` forwards the box to each of them (over
    /// the intra-node link, or the network where the problem allows it;
    /// empty: `dst` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fanout: Vec<Forward>,
}

/// One more destination of a multicast copy: the box also lands on device
/// `dst`, in buffer `buffer`, in the target piece at element `offset`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forward {
    /// Device written to.
    pub dst: DeviceId,
    /// Destination buffer, as an index into the device's target shard's buffers.
    pub buffer: u32,
    /// Offset of the destination piece in that buffer.
    pub offset: u64,
    /// The device is a relay of the copy (in `via`) and writes the data as
    /// it passes through, instead of receiving it from the copy's `dst`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_passing: bool,
}

impl Forward {
    /// A forward from the copy's destination to `dst`.
    pub fn new(dst: DeviceId, buffer: u32, offset: u64) -> Forward {
        Forward {
            dst,
            buffer,
            offset,
            in_passing: false,
        }
    }
}

fn is_zero(r: &u32) -> bool {
    *r == 0
}

/// Write zeros to elements `[offset, offset + len)` of a buffer of `device`
/// (padding, which has no source).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fill {
    /// Device written to.
    pub device: DeviceId,
    /// Buffer, as an index into the device's target shard's buffers.
    pub buffer: u32,
    /// First element.
    pub offset: u64,
    /// Number of elements.
    pub len: u64,
}

/// The pace of one stream: every copy from `src` to `dst` (through `via`)
/// is sent at no more than `bytes_per_s`. A planner that knows its makespan
/// `T` paces each stream at its bytes / `T`, so that no resource is ever
/// oversubscribed and every stream ends at `T` instead of leaving the outcome
/// to fair sharing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pace {
    /// Sender.
    pub src: DeviceId,
    /// Relays, in order (empty: direct).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub via: Vec<DeviceId>,
    /// Receiver.
    pub dst: DeviceId,
    /// Devices the receiver forwards to (multicast copies; empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fanout: Vec<DeviceId>,
    /// Rate limit in bytes per second.
    pub bytes_per_s: f64,
}

impl Pace {
    /// The stream this pace limits.
    pub fn stream(&self) -> StreamKey {
        StreamKey {
            src: self.src,
            via: self.via.clone(),
            dst: self.dst,
            fanout: self.fanout.clone(),
        }
    }
}

/// A plan together with the problem it solves, so that a plan file is all
/// that `verify` and `simulate` need. The fields are plain data: a plan
/// proves nothing until the checker in `tenplan-proofs` has accepted it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Name of the planner that produced it.
    pub planner: String,
    /// What it solves.
    pub problem: Problem,
    /// The copies, in the planner's order.
    pub copies: Vec<BoxCopy>,
    /// The zero-fills.
    pub fills: Vec<Fill>,
    /// Optional stream paces (a schedule); streams without one share links fairly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paces: Vec<Pace>,
}

#[derive(Serialize)]
struct PlanRef<'a> {
    format: &'static str,
    version: u32,
    #[serde(flatten)]
    plan: &'a Plan,
}

#[derive(Deserialize)]
struct PlanHeader {
    format: String,
    version: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    #[allow(dead_code)]
    format: String,
    #[allow(dead_code)]
    version: u32,
    planner: String,
    problem: Problem,
    copies: Vec<BoxCopy>,
    fills: Vec<Fill>,
    #[serde(default)]
    paces: Vec<Pace>,
}

impl BoxCopy {
    /// The devices the data visits: `src`, the relays, `dst`, with repeated
    /// consecutive devices (a relay equal to its neighbour) removed.
    pub fn route(&self) -> Vec<DeviceId> {
        let mut r = vec![self.src];
        for &d in self.via.iter().chain(std::iter::once(&self.dst)) {
            if r.last() != Some(&d) {
                r.push(d);
            }
        }
        r
    }

    /// True when the box never leaves its source device: no relay, no
    /// forward and no destination other than `src` (a copy relayed through
    /// another device back to its source is not local).
    pub fn is_local(&self) -> bool {
        self.dst == self.src && self.via.iter().all(|&v| v == self.src) && self.forwarded().all(|f| f.dst == self.src)
    }

    /// The stream this copy travels on: sender, relays, receiver, and the
    /// devices the receiver forwards to.
    pub fn stream(&self) -> StreamKey {
        StreamKey::of(self.src, &self.via, self.dst, self.forwarded().map(|f| f.dst))
    }

    /// Every place the copy writes: `dst` first, then the fanout.
    pub fn writes(&self) -> impl Iterator<Item = Forward> + '_ {
        std::iter::once(Forward::new(self.dst, self.buffer, self.offset)).chain(self.fanout.iter().cloned())
    }

    /// The forwards that `dst` sends on (a hop each): the fanout less the
    /// relays that write in passing.
    pub fn forwarded(&self) -> impl Iterator<Item = &Forward> + '_ {
        self.fanout.iter().filter(|f| !f.in_passing)
    }

    /// The copy as one unicast copy per destination: itself without fanout,
    /// then, for each forward, a copy relayed through `dst` (or, for a
    /// relay that writes in passing, the route up to that relay). What
    /// lands where is the same; only the sharing of the common hops is lost.
    pub fn unicast(&self) -> impl Iterator<Item = BoxCopy> + '_ {
        self.writes().enumerate().map(move |(k, w)| {
            let mut via = self.via.clone();
            if w.in_passing {
                let at = self.via.iter().position(|&d| d == w.dst).unwrap_or(self.via.len());
                via.truncate(at);
            } else if k > 0 {
                via.push(self.dst);
            }
            BoxCopy {
                src: self.src,
                dst: w.dst,
                via,
                tensor: self.tensor,
                region: self.region.clone(),
                buffer: w.buffer,
                offset: w.offset,
                reduce: self.reduce,
                round: self.round,
                fanout: Vec::new(),
            }
        })
    }
}

/// A stream: the copies from one sender to one receiver through the same
/// relays, forwarded to the same devices, travel in order over one channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// Sender.
    pub src: DeviceId,
    /// Relays, in order.
    pub via: Vec<DeviceId>,
    /// Receiver.
    pub dst: DeviceId,
    /// Devices the receiver forwards to.
    pub fanout: Vec<DeviceId>,
}

impl StreamKey {
    /// The stream of a copy from `src` through `via` to `dst`, forwarded to
    /// `fanout`: relays equal to a neighbour on the route are dropped, as in
    /// [`BoxCopy::route`].
    pub fn of(src: DeviceId, via: &[DeviceId], dst: DeviceId, fanout: impl IntoIterator<Item = DeviceId>) -> Self {
        // Most copies are direct: no route to build.
        let mut relays = Vec::new();
        if !via.is_empty() {
            let mut last = src;
            for &d in via {
                if d != last {
                    relays.push(d);
                    last = d;
                }
            }
            // The last relay is the destination itself.
            if relays.last() == Some(&dst) {
                relays.pop();
            }
        }
        StreamKey {
            src,
            via: relays,
            dst,
            fanout: fanout.into_iter().collect(),
        }
    }
}

impl Plan {
    /// The plan file (JSON, deterministic: same plan, same bytes).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&PlanRef {
            format: PLAN_FORMAT,
            version: PLAN_VERSION,
            plan: self,
        })
        .expect("plans always serialise")
    }

    /// Parse a plan file, checking its format tag and version first.
    pub fn from_json(text: &str) -> Result<Plan> {
        let bad = |e: serde_json::Error| Error::Format {
            what: format!("not a valid plan file: {e}"),
        };
        let header: PlanHeader = serde_json::from_str(text).map_err(bad)?;
        check_header(&header.format, header.version, PLAN_FORMAT, PLAN_VERSION)?;
        let f: PlanFile = serde_json::from_str(text).map_err(bad)?;
        let plan = Plan {
            planner: f.planner,
            problem: f.problem,
            copies: f.copies,
            fills: f.fills,
            paces: f.paces,
        };
        plan.validate_indices()?;
        Ok(plan)
    }

    /// Check that every index and length of the plan is in range: tensors,
    /// devices, destination buffers, boxes inside their tensors and pieces
    /// inside their buffers, paces of positive finite rates between existing
    /// devices. Cheap (linear in the plan) and independent of whether the
    /// plan is *correct* (the checker in `tenplan-proofs` proves that), so
    /// code that costs or simulates a plan before checking it never indexes
    /// out of range. [`Plan::from_json`] calls it.
    pub fn validate_indices(&self) -> Result<()> {
        let problem = &self.problem;
        let tensors = problem.tensors();
        let target = problem.target();
        let devices = problem.cluster().num_devices();
        let bad = |what: String| Err(Error::Format { what });
        let device = |d: DeviceId, what: &str| -> Result<()> {
            if d >= devices {
                return Err(Error::Format {
                    what: format!("{what} names device {d}, but the cluster has {devices} devices"),
                });
            }
            Ok(())
        };
        // The destination piece: buffer index and extent inside the target buffer.
        let place = |d: DeviceId, buffer: u32, offset: u64, len: u64, what: &str| -> Result<()> {
            let Some(shard) = target.shard_of(d) else {
                return Err(Error::Format {
                    what: format!("{what} writes device {d}, which holds no target shard"),
                });
            };
            let Some(buf) = shard.buffers.get(buffer as usize) else {
                return Err(Error::Format {
                    what: format!(
                        "{what} writes buffer {buffer} of device {d}, whose shard `{}` has {} buffers",
                        shard.name,
                        shard.buffers.len()
                    ),
                });
            };
            if offset.checked_add(len).is_none_or(|end| end > buf.len) {
                return Err(Error::Format {
                    what: format!(
                        "{what} writes elements {offset}+{len} of buffer `{}` on device {d}, which has {}",
                        buf.name, buf.len
                    ),
                });
            }
            Ok(())
        };
        for (i, c) in self.copies.iter().enumerate() {
            let what = format!("copy {i}");
            let Some(spec) = tensors.get(c.tensor as usize) else {
                return bad(format!(
                    "{what} names tensor {}, but there are {}",
                    c.tensor,
                    tensors.len()
                ));
            };
            if c.region.is_empty() || !c.region.fits(&spec.shape) {
                return bad(format!(
                    "{what}: box {:?} is empty or outside tensor `{}` of shape {:?}",
                    c.region, spec.name, spec.shape
                ));
            }
            for &d in std::iter::once(&c.src).chain(&c.via).chain(std::iter::once(&c.dst)) {
                device(d, &what)?;
            }
            let volume = c.region.volume();
            for w in c.writes() {
                device(w.dst, &what)?;
                place(w.dst, w.buffer, w.offset, volume, &what)?;
            }
        }
        for (i, f) in self.fills.iter().enumerate() {
            let what = format!("fill {i}");
            device(f.device, &what)?;
            place(f.device, f.buffer, f.offset, f.len, &what)?;
        }
        for (i, p) in self.paces.iter().enumerate() {
            let what = format!("pace {i}");
            for &d in std::iter::once(&p.src)
                .chain(&p.via)
                .chain(std::iter::once(&p.dst))
                .chain(&p.fanout)
            {
                device(d, &what)?;
            }
            if !(p.bytes_per_s.is_finite() && p.bytes_per_s > 0.0) {
                return bad(format!(
                    "{what}: rate {} bytes/s must be positive and finite",
                    p.bytes_per_s
                ));
            }
        }
        Ok(())
    }

    /// Bytes moved by the copies (a relayed copy counts once).
    pub fn bytes(&self) -> u64 {
        let tensors = self.problem.tensors();
        self.copies
            .iter()
            .map(|c| c.region.volume() * tensors[c.tensor as usize].dtype.size())
            .sum()
    }
}
