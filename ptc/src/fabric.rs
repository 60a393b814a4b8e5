//! Fabrics: the scale-out network above the NICs, as a tree of switches
//! whose links carry capacities (rail and leaf switches, spine tiers with
//! their oversubscription), and the topology file that describes a whole
//! cluster as a graph of named elements.
//!
//! A cluster without a fabric has a non-blocking network: a copy between
//! nodes loads the sender's NIC egress and the receiver's NIC ingress and
//! nothing else. With a fabric, it also loads every switch link on the tree
//! path between the two NICs: up from the sender's switch to the lowest
//! common ancestor, then down to the receiver's. Within a switch traffic is
//! non-blocking, so parallel spine planes (ECMP) are one switch whose link
//! to its parent carries their sum.

use std::collections::{BTreeMap, BTreeSet};

use petgraph::graph::{DiGraph, NodeIndex};
use serde::{Deserialize, Serialize};

use crate::cluster::{Bandwidths, ClusterData};
use crate::{DeviceId, Error, Result};

/// One switch of a fabric and the link to its parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchData {
    /// Name for reports.
    pub name: String,
    /// The switch above it; `None` for the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u32>,
    /// Capacity of the link to the parent, upwards, in bytes per second
    /// (0 for the root, which has no such link).
    #[serde(default)]
    pub up: f64,
    /// Capacity of the link from the parent, downwards.
    #[serde(default)]
    pub down: f64,
}

/// A fabric as stored in a cluster: switches (parents before or after their
/// children, any order) and the switch each NIC attaches to.
///
/// Invariants (checked by [`crate::Cluster::new`]): exactly one root, every
/// parent exists, following parents never loops, every non-root link has
/// positive finite capacities, one switch per compute NIC, and every NIC's
/// switch exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricData {
    /// The switches.
    pub switches: Vec<SwitchData>,
    /// The switch each compute NIC attaches to, in global NIC order.
    pub nics: Vec<u32>,
    /// The switch a checkpoint store attaches to (the root when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<u32>,
}

/// A validated fabric with what routing needs: each switch's depth.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Tree {
    parent: Vec<Option<u32>>,
    depth: Vec<u32>,
    root: u32,
}

/// A switch link a route crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FabricLink {
    /// From a switch up to its parent.
    Up(u32),
    /// From its parent down to a switch.
    Down(u32),
}

impl Tree {
    /// Check a fabric for `nics` compute NICs and index it.
    pub(crate) fn new(f: &FabricData, nics: u64) -> Result<Tree> {
        let bad = |what: String| Err(Error::InvalidCluster { what });
        let n = f.switches.len();
        crate::limits::check("switches of a fabric", n as u64, u64::from(crate::limits::MAX_DEVICES))?;
        if n == 0 {
            return bad("a fabric needs at least one switch".into());
        }
        let mut graph: DiGraph<u32, ()> = DiGraph::with_capacity(n, n);
        let ids: Vec<NodeIndex> = (0..n as u32).map(|i| graph.add_node(i)).collect();
        let mut roots = Vec::new();
        for (i, s) in f.switches.iter().enumerate() {
            match s.parent {
                None => roots.push(i),
                Some(p) if p as usize >= n => {
                    return bad(format!(
                        "switch `{}` names parent {p}, but there are {n} switches",
                        s.name
                    ))
                }
                Some(p) => {
                    for (dir, v) in [("up", s.up), ("down", s.down)] {
                        if !(v.is_finite() && v > 0.0) {
                            return bad(format!(
                                "switch `{}`: capacity {dir} = {v} must be positive and finite",
                                s.name
                            ));
                        }
                    }
                    graph.add_edge(ids[i], ids[p as usize], ());
                }
            }
        }
        let order = petgraph::algo::toposort(&graph, None).map_err(|cycle| Error::InvalidCluster {
            what: format!(
                "switch `{}` is its own ancestor: the fabric must be a tree",
                f.switches[graph[cycle.node_id()] as usize].name
            ),
        })?;
        match roots[..] {
            [_] => {}
            [] => return bad("no switch is the root (every switch has a parent)".into()),
            [a, b, ..] => {
                return bad(format!(
                    "switches `{}` and `{}` both have no parent: the fabric must be one tree",
                    f.switches[a].name, f.switches[b].name
                ))
            }
        }
        // Children come before parents in topological order: walk it
        // backwards so that every parent's depth is known first.
        let mut depth = vec![0u32; n];
        for &v in order.iter().rev() {
            let i = graph[v] as usize;
            if let Some(p) = f.switches[i].parent {
                depth[i] = depth[p as usize] + 1;
            }
        }
        if f.nics.len() as u64 != nics {
            return bad(format!(
                "the fabric attaches {} NICs, but the cluster has {nics}",
                f.nics.len()
            ));
        }
        if let Some((k, &s)) = f
            .nics
            .iter()
            .chain(f.storage.iter())
            .enumerate()
            .find(|(_, &s)| s as usize >= n)
        {
            return bad(format!("NIC {k} attaches to switch {s}, but there are {n} switches"));
        }
        Ok(Tree {
            parent: f.switches.iter().map(|s| s.parent).collect(),
            depth,
            root: roots[0] as u32,
        })
    }

    /// The switch links between switches `a` and `b`: up from `a` to their
    /// lowest common ancestor, then down to `b`.
    pub(crate) fn path(&self, a: u32, b: u32, out: &mut Vec<FabricLink>) {
        // The walk climbs from both ends: the links down, met from below,
        // come in reverse.
        let mut down = Vec::new();
        self.walk(a, b, |l| match l {
            FabricLink::Up(_) => out.push(l),
            FabricLink::Down(_) => down.push(l),
        });
        out.extend(down.into_iter().rev());
    }

    /// Every switch link between switches `a` and `b`, in no set order.
    pub(crate) fn walk(&self, mut a: u32, mut b: u32, mut f: impl FnMut(FabricLink)) {
        while a != b {
            if self.depth[a as usize] >= self.depth[b as usize] {
                f(FabricLink::Up(a));
                a = self.parent[a as usize].expect("a switch below another has a parent");
            } else {
                f(FabricLink::Down(b));
                b = self.parent[b as usize].expect("a switch below another has a parent");
            }
        }
    }

    /// The root switch.
    pub(crate) fn root(&self) -> u32 {
        self.root
    }

    /// The parent of a switch.
    pub(crate) fn parent(&self, s: u32) -> Option<u32> {
        self.parent[s as usize]
    }
}

/// The format tag of a topology file.
pub const TOPOLOGY_FORMAT: &str = "tenplan-topology";

/// A cluster described as a graph of named elements, as written in a
/// topology file (JSON). Nodes are NVLink domains (one server, or a
/// multi-node NVL72-style rack): their devices reach each other over
/// NVLink and the rest of the cluster through the node's NICs. NICs are
/// named `NODE/nicK`, devices `NODE/gpuK`; device `k` of a node sends
/// through NIC `k · nics / gpus`. Links go from a NIC or a switch up to a
/// switch and must form one tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Always [`TOPOLOGY_FORMAT`].
    pub format: String,
    /// A name for reports.
    pub name: String,
    /// Per-device and per-NIC rates (bytes per second, per direction).
    pub bandwidth: Bandwidths,
    /// Fixed cost of every message, in seconds.
    pub latency_s: f64,
    /// The nodes, in device order (node-major numbering).
    pub nodes: Vec<NodeSpec>,
    /// The switches (none: a non-blocking network).
    #[serde(default)]
    pub switches: Vec<SwitchSpec>,
    /// Links from NICs and switches up to switches.
    #[serde(default)]
    pub links: Vec<LinkSpec>,
    /// Dead devices, by name (`NODE/gpuK`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dead: Vec<String>,
    /// The switch a checkpoint store attaches to (the root when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
}

/// A node (NVLink domain) of a [`Topology`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Its name (NICs and devices are named after it).
    pub name: String,
    /// Devices.
    pub gpus: u32,
    /// NICs.
    pub nics: u32,
}

/// A switch of a [`Topology`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    /// Its name.
    pub name: String,
    /// Downlink capacity over uplink capacity, when its uplink gives no
    /// capacity: the uplink carries the sum of the links below it divided
    /// by this ratio (1 for a non-blocking fat tree, 2 for 2:1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversubscription: Option<f64>,
}

/// A link of a [`Topology`], from an element up to a switch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// The lower end: a NIC (`NODE/nicK`) or a switch.
    pub from: String,
    /// The switch above it.
    pub to: String,
    /// Bytes per second upwards (and downwards unless `down` is given); a
    /// NIC's link runs at the NIC's rate and gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<f64>,
    /// Bytes per second downwards, where it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<f64>,
}

/// A switch's link up to its parent, as a topology file gives it.
#[derive(Clone, Copy, Debug)]
struct Uplink {
    parent: u32,
    capacity: Option<f64>,
    down: Option<f64>,
}

/// An element a link names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Nic(u32),
    Switch(u32),
}

impl Topology {
    /// Parse a topology file's text.
    pub fn from_json(text: &str) -> Result<Topology> {
        let t: Topology = serde_json::from_str(text).map_err(|e| Error::Format {
            what: format!("topology file: {e}"),
        })?;
        if t.format != TOPOLOGY_FORMAT {
            return Err(Error::Format {
                what: format!("topology file: format `{}`, expected `{TOPOLOGY_FORMAT}`", t.format),
            });
        }
        Ok(t)
    }

    /// The cluster this topology describes; every error names the element.
    pub fn to_cluster_data(&self) -> Result<ClusterData> {
        let Some(first) = self.nodes.first() else {
            return invalid("a topology needs at least one node".into());
        };
        crate::limits::check(
            "nodes of a topology",
            self.nodes.len() as u64,
            u64::from(crate::limits::MAX_DEVICES),
        )?;
        let mut names: BTreeSet<&str> = BTreeSet::new();
        let mut node_of: BTreeMap<&str, u32> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if (n.gpus, n.nics) != (first.gpus, first.nics) {
                return invalid(format!(
                    "node `{}` has {} devices and {} NICs, but node `{}` has {} and {}: nodes must be alike",
                    n.name, n.gpus, n.nics, first.name, first.gpus, first.nics
                ));
            }
            if n.name.contains('/') || !names.insert(&n.name) {
                return invalid(format!("node name `{}` is used twice or contains `/`", n.name));
            }
            node_of.insert(&n.name, i as u32);
        }
        let (gpus, nics) = (first.gpus, first.nics);
        let mut switch_of: BTreeMap<&str, u32> = BTreeMap::new();
        for (i, s) in self.switches.iter().enumerate() {
            if s.name.contains('/') || !names.insert(&s.name) {
                return invalid(format!("switch name `{}` is used twice or contains `/`", s.name));
            }
            if let Some(r) = s.oversubscription {
                if !(r.is_finite() && r > 0.0) {
                    return invalid(format!(
                        "switch `{}`: oversubscription {r} must be positive and finite",
                        s.name
                    ));
                }
            }
            switch_of.insert(&s.name, i as u32);
        }
        // `NODE/nicK` or `NODE/gpuK`, checked against the node's counts.
        let member = |name: &str, kind: &str, count: u32| -> Result<Option<u32>> {
            let Some((node, local)) = name.split_once('/') else {
                return Ok(None);
            };
            let Some(&n) = node_of.get(node) else {
                return invalid(format!(
                    "`{name}` names node `{node}`, which the topology does not have"
                ));
            };
            let Some(k) = local.strip_prefix(kind).and_then(|k| k.parse::<u32>().ok()) else {
                return Ok(None);
            };
            if k >= count {
                return invalid(format!(
                    "`{name}`: node `{node}` has {count} {kind}s ({kind}0..{kind}{})",
                    count.saturating_sub(1)
                ));
            }
            Ok(Some(n * count + k))
        };
        let end = |name: &str, link: &str| -> Result<End> {
            if let Some(&s) = switch_of.get(name) {
                return Ok(End::Switch(s));
            }
            if let Some(nic) = member(name, "nic", nics)? {
                return Ok(End::Nic(nic));
            }
            if member(name, "gpu", gpus)?.is_some() {
                return invalid(format!(
                    "link {link}: devices reach the network through their node's NICs; link a NIC instead of `{name}`"
                ));
            }
            invalid(format!(
                "link {link}: `{name}` is neither a switch nor a NIC (a dangling link)"
            ))
        };
        let total_nics = self.nodes.len() as u64 * u64::from(nics);
        crate::limits::check("NICs of a topology", total_nics, u64::from(crate::limits::MAX_DEVICES))?;
        let mut nic_switch: Vec<Option<u32>> = vec![None; total_nics as usize];
        let mut up: Vec<Option<Uplink>> = vec![None; self.switches.len()];
        for l in &self.links {
            let label = format!("{} -> {}", l.from, l.to);
            let to = match end(&l.to, &label)? {
                End::Switch(s) => s,
                End::Nic(_) => return invalid(format!("link {label}: `{}` is a NIC; links go up to switches", l.to)),
            };
            for (what, v) in [("capacity", l.capacity), ("down", l.down)] {
                if let Some(v) = v {
                    if !(v.is_finite() && v > 0.0) {
                        return invalid(format!("link {label}: {what} {v} must be positive and finite"));
                    }
                }
            }
            match end(&l.from, &label)? {
                End::Nic(k) => {
                    if l.capacity.is_some() || l.down.is_some() {
                        return invalid(format!(
                            "link {label}: a NIC's link runs at the NIC's rate (bandwidth.nic); give it no capacity"
                        ));
                    }
                    if let Some(prev) = nic_switch[k as usize].replace(to) {
                        return invalid(format!(
                            "NIC `{}` links to both `{}` and `{}`: a NIC has one uplink",
                            l.from, self.switches[prev as usize].name, l.to
                        ));
                    }
                }
                End::Switch(s) => {
                    if s == to {
                        return invalid(format!("link {label}: a switch cannot link to itself"));
                    }
                    let link = Uplink {
                        parent: to,
                        capacity: l.capacity,
                        down: l.down,
                    };
                    if let Some(Uplink { parent: prev, .. }) = up[s as usize].replace(link) {
                        return invalid(format!(
                            "switch `{}` links up to both `{}` and `{}`: tenplan routes over a tree \
                             (make parallel spine planes one switch with their summed capacity)",
                            l.from, self.switches[prev as usize].name, l.to
                        ));
                    }
                }
            }
        }
        let fabric = if self.switches.is_empty() {
            None
        } else {
            let nic_switch = nic_switch
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    s.ok_or_else(|| Error::InvalidCluster {
                        what: format!(
                            "NIC `{}/nic{}` has no link to a switch",
                            self.nodes[k / nics as usize].name,
                            k % nics as usize
                        ),
                    })
                })
                .collect::<Result<Vec<u32>>>()?;
            Some(self.fabric(&up, nic_switch)?)
        };
        let mut dead = BTreeSet::new();
        for d in &self.dead {
            match member(d, "gpu", gpus)? {
                Some(id) => dead.insert(id as DeviceId),
                None => {
                    return invalid(format!(
                        "dead device `{d}` is not a device of any node (expected NODE/gpuK)"
                    ))
                }
            };
        }
        let storage = match &self.storage {
            None => None,
            Some(s) => match switch_of.get(s.as_str()) {
                Some(&s) => Some(s),
                None => return invalid(format!("storage attaches to `{s}`, which is not a switch")),
            },
        };
        let fabric = fabric.map(|mut f| {
            f.storage = storage;
            f
        });
        Ok(ClusterData {
            name: self.name.clone(),
            nodes: self.nodes.len() as u32,
            gpus_per_node: gpus,
            nics_per_node: nics,
            bandwidth: self.bandwidth.clone(),
            latency_s: self.latency_s,
            dead,
            storage: false,
            fabric,
        })
    }

    /// The switches with their parents and link capacities; an uplink with
    /// no capacity takes its switch's oversubscription of the links below.
    fn fabric(&self, up: &[Option<Uplink>], nics: Vec<u32>) -> Result<FabricData> {
        let n = self.switches.len();
        let nic_rate = self.bandwidth.nic;
        // Capacity below each switch, children before parents: resolved by
        // repeated passes over the ones still open (trees are shallow; a
        // cycle leaves some open and is reported by the tree check).
        let mut below = vec![0.0f64; n];
        for &s in &nics {
            below[s as usize] += nic_rate;
        }
        let mut caps: Vec<Option<(f64, f64)>> = vec![None; n];
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (s, u) in up.iter().enumerate() {
            if let Some(u) = u {
                children[u.parent as usize].push(s as u32);
            }
        }
        let mut open: Vec<usize> = (0..n).filter(|&s| up[s].is_some()).collect();
        while !open.is_empty() {
            let before = open.len();
            open.retain(|&s| {
                if children[s].iter().any(|&c| caps[c as usize].is_none()) {
                    return true;
                }
                let Uplink { capacity, down, .. } = up[s].expect("open switches have uplinks");
                let sum = below[s]
                    + children[s]
                        .iter()
                        .map(|&c| caps[c as usize].map_or(0.0, |c| c.1))
                        .sum::<f64>();
                let ratio = self.switches[s].oversubscription;
                let upc = capacity.or(ratio.map(|r| sum / r));
                caps[s] = upc.map(|u| (u, down.unwrap_or(u)));
                false
            });
            if open.len() == before {
                break;
            }
        }
        let mut switches = Vec::with_capacity(n);
        for (s, spec) in self.switches.iter().enumerate() {
            let parent = up[s].map(|u| u.parent);
            let (u, d) = match (parent, caps[s]) {
                (None, _) => (0.0, 0.0),
                (Some(_), Some(c)) => c,
                (Some(p), None) if open_has_cycle(up, s) => {
                    return Err(Error::InvalidCluster {
                        what: format!(
                            "switch `{}` is its own ancestor (through `{}`): the fabric must be a tree",
                            spec.name, self.switches[p as usize].name
                        ),
                    })
                }
                (Some(p), None) => {
                    return Err(Error::InvalidCluster {
                        what: format!(
                            "link {} -> {}: give a capacity, or an oversubscription for switch `{}`",
                            spec.name, self.switches[p as usize].name, spec.name
                        ),
                    })
                }
            };
            if parent.is_some() && !(u > 0.0 && d > 0.0) {
                return Err(Error::InvalidCluster {
                    what: format!(
                        "switch `{}`: its uplink's capacity comes to {u} (nothing below it?); give one",
                        spec.name
                    ),
                });
            }
            switches.push(SwitchData {
                name: spec.name.clone(),
                parent,
                up: u,
                down: d,
            });
        }
        Ok(FabricData {
            switches,
            nics,
            storage: None,
        })
    }

    /// The topology file of a cluster: its nodes, switches and links by name.
    pub fn of(data: &ClusterData) -> Topology {
        let nodes: Vec<NodeSpec> = (0..data.nodes)
            .map(|n| NodeSpec {
                name: format!("node{n}"),
                gpus: data.gpus_per_node,
                nics: data.nics_per_node,
            })
            .collect();
        let (mut switches, mut links) = (Vec::new(), Vec::new());
        let mut storage = None;
        if let Some(f) = &data.fabric {
            switches = f
                .switches
                .iter()
                .map(|s| SwitchSpec {
                    name: s.name.clone(),
                    oversubscription: None,
                })
                .collect();
            for s in &f.switches {
                if let Some(p) = s.parent {
                    links.push(LinkSpec {
                        from: s.name.clone(),
                        to: f.switches[p as usize].name.clone(),
                        capacity: Some(s.up),
                        down: (s.down != s.up).then_some(s.down),
                    });
                }
            }
            let per = data.nics_per_node as usize;
            for (k, &s) in f.nics.iter().enumerate() {
                links.push(LinkSpec {
                    from: format!("node{}/nic{}", k / per, k % per),
                    to: f.switches[s as usize].name.clone(),
                    capacity: None,
                    down: None,
                });
            }
            storage = f.storage.map(|s| f.switches[s as usize].name.clone());
        }
        let g = data.gpus_per_node;
        Topology {
            format: TOPOLOGY_FORMAT.into(),
            name: data.name.clone(),
            bandwidth: data.bandwidth.clone(),
            latency_s: data.latency_s,
            nodes,
            switches,
            links,
            dead: data
                .dead
                .iter()
                .map(|&d| format!("node{}/gpu{}", d / g, d % g))
                .collect(),
            storage,
        }
    }
}

fn invalid<T>(what: String) -> Result<T> {
    Err(Error::InvalidCluster { what })
}

/// Whether following uplinks from switch `s` comes back to it.
fn open_has_cycle(up: &[Option<Uplink>], s: usize) -> bool {
    let mut at = s;
    for _ in 0..up.len() {
        match up[at] {
            Some(u) if u.parent as usize == s => return true,
            Some(u) => at = u.parent as usize,
            None => return false,
        }
    }
    true
}

/// A rail-optimized fabric (NVIDIA's DGX SuperPOD design): nodes come in
/// scalable units of `unit` nodes; NIC `r` of every node of a unit links to
/// the unit's rail switch `r`; the rail switches link to one spine (its
/// planes summed), each uplink carrying the rail switch's downlinks over
/// `oversubscription`.
pub fn rail_optimized(nodes: u32, nics_per_node: u32, nic: f64, unit: u32, oversubscription: f64) -> FabricData {
    let units = nodes.div_ceil(unit);
    let mut switches = vec![SwitchData {
        name: "spine".into(),
        parent: None,
        up: 0.0,
        down: 0.0,
    }];
    for u in 0..units {
        let members = unit.min(nodes - u * unit);
        for r in 0..nics_per_node {
            let cap = f64::from(members) * nic / oversubscription;
            switches.push(SwitchData {
                name: format!("su{u}-rail{r}"),
                parent: Some(0),
                up: cap,
                down: cap,
            });
        }
    }
    let nics = (0..nodes)
        .flat_map(|n| (0..nics_per_node).map(move |r| 1 + (n / unit) * nics_per_node + r))
        .collect();
    FabricData {
        switches,
        nics,
        storage: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(text: &str) -> Result<ClusterData> {
        let data = Topology::from_json(text)?.to_cluster_data()?;
        crate::Cluster::new(data.clone())?;
        Ok(data)
    }

    const HEAD: &str = r#""format": "tenplan-topology", "name": "t", "latency_s": 1e-5,
        "bandwidth": {"intra_node": 4.5e11, "nic": 5e10, "host_link": 6.4e10, "storage": 2.5e10, "device_memory": 1.6e12},
        "nodes": [{"name": "a", "gpus": 2, "nics": 2}, {"name": "b", "gpus": 2, "nics": 2}]"#;

    fn with(rest: &str) -> String {
        format!("{{{HEAD}, {rest}}}")
    }

    const GOOD: &str = r#""switches": [{"name": "spine"}, {"name": "l0", "oversubscription": 2}, {"name": "l1"}],
        "links": [{"from": "l0", "to": "spine"}, {"from": "l1", "to": "spine", "capacity": 1e11, "down": 5e10},
                  {"from": "a/nic0", "to": "l0"}, {"from": "b/nic0", "to": "l0"},
                  {"from": "a/nic1", "to": "l1"}, {"from": "b/nic1", "to": "l1"}]"#;

    #[test]
    fn reads_a_tree_and_prices_oversubscription() {
        let c = topo(&with(GOOD)).unwrap();
        let f = c.fabric.as_ref().unwrap();
        assert_eq!(f.nics, vec![1, 2, 1, 2]);
        assert_eq!((f.switches[1].up, f.switches[1].down), (5e10, 5e10));
        assert_eq!((f.switches[2].up, f.switches[2].down), (1e11, 5e10));
        // The file written back reads as the same cluster.
        let again = Topology::of(&c).to_cluster_data().unwrap();
        assert_eq!(again.fabric, c.fabric);
        let tree = Tree::new(f, 4).unwrap();
        let mut p = Vec::new();
        tree.path(1, 2, &mut p);
        assert_eq!(p, vec![FabricLink::Up(1), FabricLink::Down(2)]);
        p.clear();
        tree.path(1, 1, &mut p);
        assert!(p.is_empty());
    }

    #[test]
    fn paths_climb_to_the_lowest_common_ancestor() {
        // root 0; 1, 2 under 0; 3 under 1; 4 under 3; 5 under 2.
        let parents = [None, Some(0), Some(0), Some(1), Some(3), Some(2)];
        let f = FabricData {
            switches: parents
                .iter()
                .enumerate()
                .map(|(i, &parent)| SwitchData {
                    name: format!("s{i}"),
                    parent,
                    up: 1.0,
                    down: 1.0,
                })
                .collect(),
            nics: vec![],
            storage: None,
        };
        let t = Tree::new(&f, 0).unwrap();
        let mut p = Vec::new();
        t.path(4, 5, &mut p);
        use FabricLink::*;
        assert_eq!(p, vec![Up(4), Up(3), Up(1), Down(2), Down(5)]);
        p.clear();
        t.path(5, 3, &mut p);
        assert_eq!(p, vec![Up(5), Up(2), Down(1), Down(3)]);
        p.clear();
        t.path(4, 1, &mut p);
        assert_eq!(p, vec![Up(4), Up(3)]);
        p.clear();
        t.path(0, 4, &mut p);
        assert_eq!(p, vec![Down(1), Down(3), Down(4)]);
    }

    #[test]
    fn bad_topologies_name_the_element() {
        let cases = [
            (
                GOOD.replace(r#""to": "l0"}, {"from": "b/nic0""#, r#""to": "l9"}, {"from": "b/nic0""#),
                "`l9` is neither a switch nor a NIC",
            ),
            (GOOD.replace("1e11", "0"), "capacity 0 must be positive"),
            (GOOD.replace("1e11", "-5"), "capacity -5 must be positive"),
            (
                GOOD.replace(
                    r#"{"from": "l0", "to": "spine"}"#,
                    r#"{"from": "l0", "to": "l1"}, {"from": "spine", "to": "l0", "capacity": 1}"#,
                ),
                "its own ancestor",
            ),
            (
                GOOD.replace(r#""from": "b/nic1""#, r#""from": "c/nic1""#),
                "names node `c`",
            ),
            (
                GOOD.replace(r#""from": "b/nic1""#, r#""from": "b/nic7""#),
                "node `b` has 2 nics",
            ),
            (
                GOOD.replace(r#""from": "b/nic1""#, r#""from": "b/gpu1""#),
                "through their node's NICs",
            ),
            (
                GOOD.replace(r#", {"from": "b/nic1", "to": "l1"}"#, ""),
                "NIC `b/nic1` has no link",
            ),
            (
                GOOD.replace(r#"{"name": "l1"}"#, r#"{"name": "l1"}, {"name": "x"}"#),
                "both have no parent",
            ),
            (format!(r#"{GOOD}, "dead": ["c/gpu0"]"#), "names node `c`"),
            (format!(r#"{GOOD}, "dead": ["a/gpu5"]"#), "node `a` has 2 gpus"),
            (format!(r#"{GOOD}, "dead": ["a"]"#), "not a device of any node"),
            (
                GOOD.replace(r#"{"name": "l0", "oversubscription": 2}"#, r#"{"name": "l0"}"#),
                "give a capacity",
            ),
        ];
        for (rest, want) in cases {
            let e = topo(&with(&rest)).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
        let e = topo(&with(GOOD).replace(r#""gpus": 2, "nics": 2}]"#, r#""gpus": 4, "nics": 2}]"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodes must be alike"), "{e}");
        let e = Topology::from_json(&with(GOOD).replace("tenplan-topology", "x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected `tenplan-topology`"), "{e}");
    }

    #[test]
    fn rail_optimized_units_and_ratios() {
        let f = rail_optimized(5, 2, 1.0, 2, 2.0);
        // 3 units of 2, 2, 1 nodes; 2 rails each.
        assert_eq!(f.switches.len(), 7);
        assert_eq!(f.nics, vec![1, 2, 1, 2, 3, 4, 3, 4, 5, 6]);
        assert_eq!(f.switches[1].up, 1.0);
        assert_eq!(f.switches[5].up, 0.5);
        Tree::new(&f, 10).unwrap();
    }
}
