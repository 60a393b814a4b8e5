//! Reconfiguration problems as users pose them: a model's state moving
//! between two parallel configurations on a cluster ([`ModelMove`]), or a
//! problem file; each checked against the cluster and this machine's memory
//! before any layout is built.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::str::FromStr;

use tenplan_models::{ModelSpec, ModelState, ParallelConfig, StateKind};
use tenplan_ptc::limits::{available_memory, BYTES_PER_PIECE};
use tenplan_ptc::{Cluster, Problem};

use crate::units::bytes;
use crate::{Error, Result};

/// A parallel configuration as it was given: parsed, and spelled as the
/// user wrote it, which messages, reports and manifests keep. Two
/// spellings of one configuration are equal (and one cache key).
#[derive(Clone, Debug)]
pub struct Config {
    parsed: ParallelConfig,
    text: String,
}

impl Config {
    /// The configuration.
    pub fn parsed(&self) -> &ParallelConfig {
        &self.parsed
    }

    /// As it was given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for Config {
    type Err = tenplan_models::Error;

    fn from_str(s: &str) -> Result<Config, Self::Err> {
        Ok(Config {
            parsed: s.parse()?,
            text: s.to_string(),
        })
    }
}

impl From<ParallelConfig> for Config {
    fn from(parsed: ParallelConfig) -> Config {
        Config {
            text: parsed.to_string(),
            parsed,
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for Config {
    fn eq(&self, o: &Config) -> bool {
        self.parsed == o.parsed
    }
}

impl Eq for Config {}

impl Hash for Config {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.parsed.hash(h);
    }
}

/// A cluster as a cache key: hashed by its name and size, compared whole,
/// so two clusters that share a name never share an answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ClusterKey(pub(crate) Cluster);

// A cluster's capacities are finite (checked when it is built), so
// equality is an equivalence.
impl Eq for ClusterKey {}

impl Hash for ClusterKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.name().hash(h);
        self.0.num_devices().hash(h);
        self.0.dead().hash(h);
    }
}

/// A model's state moving from one parallel configuration to another on
/// a cluster (dead devices included): the question `tenplan plan --model`
/// and a scheduler's `cost` ask.
#[derive(Clone, Debug)]
pub struct ModelMove {
    /// The model.
    pub model: ModelSpec,
    /// The part of its state that moves.
    pub state: StateKind,
    /// The configuration it is in.
    pub from: Config,
    /// The configuration it must end in.
    pub to: Config,
    /// The cluster, with its dead devices.
    pub cluster: Cluster,
}

impl PartialEq for ModelMove {
    fn eq(&self, o: &ModelMove) -> bool {
        self.from == o.from
            && self.to == o.to
            && self.state == o.state
            && self.model == o.model
            && self.cluster == o.cluster
    }
}

impl Eq for ModelMove {}

impl Hash for ModelMove {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.model.name.hash(h);
        self.state.hash(h);
        self.from.hash(h);
        self.to.hash(h);
        ClusterKey(self.cluster.clone()).hash(h);
    }
}

impl ModelMove {
    /// The problem: both configurations checked against the cluster and
    /// this machine's memory (named `source layout` and `target layout` in
    /// errors), then their layouts built.
    pub fn problem(&self) -> Result<Problem> {
        let state = ModelState::new(&self.model, self.state);
        let side = |side: &'static str| move |source| Error::Side { side, source };
        state
            .check_plannable(self.from.parsed(), &self.cluster)
            .map_err(side("source"))?;
        state
            .check_plannable(self.to.parsed(), &self.cluster)
            .map_err(side("target"))?;
        let from = state.layout(self.from.parsed()).map_err(side("source"))?;
        let to = state.layout(self.to.parsed()).map_err(side("target"))?;
        Ok(Problem::new(from, to, self.cluster.clone())?)
    }
}

/// Largest plan, problem, job or peers file read (1 GiB): parsing a JSON
/// document takes several times its size in memory.
pub const MAX_INPUT_BYTES: u64 = 1 << 30;

/// Read a text file a user names, refusing one over [`MAX_INPUT_BYTES`]
/// before reading it.
pub fn read_input(path: &Path) -> Result<String> {
    let io = |e: std::io::Error| Error::request(format!("cannot read {}: {e}", path.display()));
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_INPUT_BYTES {
        return Err(Error::request(format!(
            "{}: {} is larger than the {} limit on input files",
            path.display(),
            bytes(len),
            bytes(MAX_INPUT_BYTES)
        )));
    }
    std::fs::read_to_string(path).map_err(io)
}

/// A problem file (docs/problem-format.md), refused when planning it would
/// need more memory than this machine has available.
pub fn read_problem(path: &Path) -> Result<Problem> {
    let text = read_input(path)?;
    let named = |e: Error| Error::request(format!("{}: {e}", path.display()));
    let problem = Problem::from_json(&text).map_err(|e| named(e.into()))?;
    check_problem_memory(&problem).map_err(named)?;
    Ok(problem)
}

/// A plan file (docs/plan-format.md).
pub fn read_plan(path: &Path) -> Result<tenplan_ptc::Plan> {
    let text = read_input(path)?;
    tenplan_ptc::Plan::from_json(&text).map_err(|e| Error::request(format!("{}: {e}", path.display())))
}

/// Refuse a problem whose planning would need more memory than this
/// machine has available: the pieces its devices hold, every replica
/// counted, at [`BYTES_PER_PIECE`] each.
pub fn check_problem_memory(problem: &Problem) -> Result<()> {
    let pieces = problem
        .source()
        .pieces_held()
        .saturating_add(problem.target().pieces_held());
    let need = pieces.saturating_mul(BYTES_PER_PIECE);
    if let Some(have) = available_memory() {
        if need > have {
            return Err(Error::request(format!(
                "the problem would need about {} of memory to plan ({pieces} pieces held by its devices at {} each), more than the {} this machine has available",
                bytes(need),
                bytes(BYTES_PER_PIECE),
                bytes(have)
            )));
        }
    }
    Ok(())
}
