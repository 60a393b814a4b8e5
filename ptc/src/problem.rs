//! A reconfiguration problem: move a job's state from one layout to another.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Buffer, Cluster, Error, JobState, Layout, Piece, Result, Shard, TensorSpec};

/// The `format` tag of a problem file.
pub const PROBLEM_FORMAT: &str = "tenplan-problem";
/// The version of the problem format this crate writes and reads.
pub const PROBLEM_VERSION: u32 = 1;

/// The input of every planner: the job's tensors, the source layout (which
/// may sit partly on dead devices), the target layout, and the cluster.
///
/// Invariants (checked by [`Problem::new`]): both layouts describe the same
/// tensors; every device they use exists in the cluster; no target shard is
/// on a dead device. Whether every needed element still has a live holder is
/// for the planner to report: "no plan exists" is an answer, not a bad input.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    source: Layout,
    target: Layout,
    cluster: Cluster,
    job: JobState,
    forwarding: Forwarding,
}

/// Where the destination of a multicast copy may forward what it receives
/// (see [`crate::BoxCopy::fanout`]): part of the question, since it widens
/// what a plan may do and so lowers what bounds every plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Forwarding {
    /// To devices of its own node, over the intra-node links (reshards:
    /// the `lp` planner's certified bound assumes it).
    #[default]
    Node,
    /// To any live device, over the network too: devices that need the
    /// same data pass it on to each other, as the replicas of an inference
    /// engine do when they broadcast a weight sync among themselves.
    Cluster,
}

/// What tells two lists of tensors apart, tensor by tensor by name.
fn tensors_differ(source: &[TensorSpec], target: &[TensorSpec]) -> Error {
    use std::collections::BTreeMap;
    let by_name = |ts: &[TensorSpec]| -> BTreeMap<String, (usize, String)> {
        ts.iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), (i, format!("{} {:?}", t.dtype, t.shape))))
            .collect()
    };
    let (s, t) = (by_name(source), by_name(target));
    let mut diffs = Vec::new();
    for (name, (i, what)) in &s {
        match t.get(name) {
            None => diffs.push(format!("tensor `{name}` is in the source only")),
            Some((_, other)) if other != what => diffs.push(format!(
                "tensor `{name}` is {what} in the source, {other} in the target"
            )),
            Some((j, _)) if i != j => diffs.push(format!(
                "tensor `{name}` is tensor {i} of the source, {j} of the target"
            )),
            Some(_) => {}
        }
    }
    diffs.extend(
        t.keys()
            .filter(|n| !s.contains_key(*n))
            .map(|n| format!("tensor `{n}` is in the target only")),
    );
    if diffs.is_empty() {
        diffs.push(format!(
            "{} tensors in the source, {} in the target (a name given twice)",
            source.len(),
            target.len()
        ));
    }
    Error::TensorsDiffer {
        count: diffs.len(),
        first: diffs.swap_remove(0),
    }
}

impl Problem {
    /// Build and validate a problem.
    pub fn new(source: Layout, target: Layout, cluster: Cluster) -> Result<Problem> {
        if source.tensors() != target.tensors() {
            return Err(tensors_differ(source.tensors(), target.tensors()));
        }
        let n = cluster.num_devices();
        for (which, layout) in [("source", &source), ("target", &target)] {
            if let Some(device) = layout.devices().find(|&d| d >= n) {
                return Err(Error::DeviceOutOfRange {
                    which,
                    device,
                    count: n,
                });
            }
        }
        if let Some(t) = (0..target.tensors().len() as u32).find(|&t| target.is_partial(t)) {
            return Err(Error::PartialTarget {
                tensor: target.tensors()[t as usize].name.clone(),
            });
        }
        if let Some(store) = cluster.storage_device() {
            if let Some(shard) = target.shards().iter().find(|s| s.devices.contains(&store)) {
                return Err(Error::TargetOnDeadDevice {
                    shard: shard.name.clone(),
                    device: store,
                });
            }
        }
        for shard in target.shards() {
            if let Some(&device) = shard.devices.iter().find(|&&d| !cluster.is_live(d)) {
                return Err(Error::TargetOnDeadDevice {
                    shard: shard.name.clone(),
                    device,
                });
            }
        }
        Ok(Problem {
            source,
            target,
            cluster,
            job: JobState::default(),
            forwarding: Forwarding::Node,
        })
    }

    /// The same problem carrying the job's dataset and RNG state, which do
    /// not depend on the layout and are handed over unchanged.
    pub fn with_job(mut self, job: JobState) -> Problem {
        self.job = job;
        self
    }

    /// The same problem with multicast copies allowed to forward as far as
    /// `forwarding` says.
    pub fn with_forwarding(mut self, forwarding: Forwarding) -> Problem {
        self.forwarding = forwarding;
        self
    }

    /// Where a multicast copy's destination may forward to.
    pub fn forwarding(&self) -> Forwarding {
        self.forwarding
    }

    /// The job's dataset and RNG state.
    pub fn job(&self) -> &JobState {
        &self.job
    }

    /// The tensors.
    pub fn tensors(&self) -> &Arc<[TensorSpec]> {
        self.source.tensors()
    }

    /// The layout the state is in now.
    pub fn source(&self) -> &Layout {
        &self.source
    }

    /// The layout the state must end in.
    pub fn target(&self) -> &Layout {
        &self.target
    }

    /// The cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The same problem with the job's last checkpoint on a store the plan
    /// may read from (a source of its own bandwidth: see
    /// [`crate::ClusterData::storage`]): the store holds every distinct box
    /// of the source layout, so state whose every holder is dead can still
    /// be recovered. Tensors held as partial sums are not on the store (a
    /// checkpoint holds reduced values). Assumes the checkpoint holds the
    /// state of the same step as the live devices.
    pub fn with_storage(&self) -> Result<Problem> {
        if self.cluster.storage_device().is_some() {
            return Ok(self.clone());
        }
        let cluster = self.cluster.with_storage();
        let store = cluster.storage_device().expect("just added");
        let tensors = self.source.tensors();
        let mut buffers = Vec::new();
        for (t, spec) in tensors.iter().enumerate() {
            if self.source.is_partial(t as u32) {
                continue;
            }
            let mut pieces = Vec::new();
            let mut len = 0;
            for s in self.source.sub_tensors(t as u32) {
                pieces.push(Piece {
                    tensor: t as u32,
                    region: s.region.clone(),
                    offset: len,
                });
                len += s.region.volume();
            }
            buffers.push(Buffer {
                name: spec.name.clone(),
                dtype: spec.dtype,
                len,
                pieces,
                partial: false,
            });
        }
        let mut shards = self.source.shards().to_vec();
        shards.push(Shard {
            name: "storage".into(),
            devices: vec![store],
            buffers,
        });
        let source = Layout::new(tensors.clone(), shards)?;
        Ok(Problem::new(source, self.target.clone(), cluster)?
            .with_job(self.job)
            .with_forwarding(self.forwarding))
    }

    /// The same problem (its job state and forwarding kept) with another
    /// target layout of the same tensors: a placement that relabels the
    /// target's devices, for example.
    pub fn with_target(&self, target: Layout) -> Result<Problem> {
        Ok(Problem::new(self.source.clone(), target, self.cluster.clone())?
            .with_job(self.job)
            .with_forwarding(self.forwarding))
    }

    /// The same problem on a cluster with other dead devices or links.
    pub fn with_cluster(&self, cluster: Cluster) -> Result<Problem> {
        Ok(Problem::new(self.source.clone(), self.target.clone(), cluster)?
            .with_job(self.job)
            .with_forwarding(self.forwarding))
    }

    /// Parse a problem file (JSON), checking its format tag and version.
    pub fn from_json(text: &str) -> Result<Problem> {
        serde_json::from_str(text).map_err(|e| Error::Format {
            what: format!("not a valid problem file: {e}"),
        })
    }

    /// The problem as a JSON document (deterministic).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("problems always serialise")
    }
}

#[derive(Serialize)]
struct ShardsRef<'a> {
    shards: &'a [Shard],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Shards {
    shards: Vec<Shard>,
}

#[derive(Serialize)]
struct ProblemRef<'a> {
    format: &'static str,
    version: u32,
    tensors: &'a [TensorSpec],
    source: ShardsRef<'a>,
    target: ShardsRef<'a>,
    cluster: &'a Cluster,
    #[serde(skip_serializing_if = "is_empty_job")]
    job: &'a JobState,
    #[serde(skip_serializing_if = "is_node")]
    forwarding: Forwarding,
}

fn is_node(f: &Forwarding) -> bool {
    *f == Forwarding::Node
}

fn is_empty_job(j: &&JobState) -> bool {
    **j == JobState::default()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProblemFile {
    format: String,
    version: u32,
    tensors: Vec<TensorSpec>,
    source: Shards,
    target: Shards,
    cluster: Cluster,
    #[serde(default)]
    job: JobState,
    #[serde(default)]
    forwarding: Forwarding,
}

impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        ProblemRef {
            format: PROBLEM_FORMAT,
            version: PROBLEM_VERSION,
            tensors: self.tensors(),
            source: ShardsRef {
                shards: self.source.shards(),
            },
            target: ShardsRef {
                shards: self.target.shards(),
            },
            cluster: &self.cluster,
            job: &self.job,
            forwarding: self.forwarding,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Problem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Problem, D::Error> {
        let f = ProblemFile::deserialize(d)?;
        Problem::try_from(f).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<ProblemFile> for Problem {
    type Error = Error;
    fn try_from(f: ProblemFile) -> Result<Problem> {
        check_header(&f.format, f.version, PROBLEM_FORMAT, PROBLEM_VERSION)?;
        let tensors: Arc<[TensorSpec]> = f.tensors.into();
        let source = Layout::new(tensors.clone(), f.source.shards).map_err(|e| in_layout("source", e))?;
        let target = Layout::new(tensors, f.target.shards).map_err(|e| in_layout("target", e))?;
        Ok(Problem::new(source, target, f.cluster)?
            .with_job(f.job)
            .with_forwarding(f.forwarding))
    }
}

fn in_layout(which: &str, e: Error) -> Error {
    Error::Format {
        what: format!("{which} layout: {e}"),
    }
}

/// Check a file's `format` tag and `version`.
pub(crate) fn check_header(format: &str, version: u32, want: &str, want_version: u32) -> Result<()> {
    if format != want {
        return Err(Error::Format {
            what: format!("format is `{format}`, expected `{want}`"),
        });
    }
    if version != want_version {
        return Err(Error::Format {
            what: format!("{want} version {version} is not supported (this build reads version {want_version})"),
        });
    }
    Ok(())
}
