//! Clusters: nodes of devices, the links between them, and which devices are dead.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::fabric::{rail_optimized, FabricData, FabricLink, Topology, Tree};
use crate::{Error, Result};

/// Global device id. Devices are numbered node-major: device `d` is local
/// device `d % gpus_per_node` of node `d / gpus_per_node`.
pub type DeviceId = u32;

/// Link capacities of a cluster, in bytes per second and per direction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bandwidths {
    /// Each device's intra-node send and receive rate (NVLink, NVSwitch or PCIe peer).
    pub intra_node: f64,
    /// Each NIC's egress and ingress rate.
    pub nic: f64,
    /// Each device's host link (PCIe to host memory).
    pub host_link: f64,
    /// Each node's storage read rate (checkpoint sources).
    pub storage: f64,
    /// A device's copy rate within its own memory (a local copy reads and writes).
    pub device_memory: f64,
}

/// A cluster: `nodes` nodes of `gpus_per_node` devices and `nics_per_node`
/// NICs each, link capacities, per-message latency, and dead devices.
///
/// Invariants (checked by [`Cluster::new`] and on deserialisation): at least
/// one node, device and NIC per node; every capacity positive and finite;
/// latency finite and non-negative; every dead device exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ClusterData", into = "ClusterData")]
pub struct Cluster {
    data: ClusterData,
    /// The fabric indexed for routing, when there is one.
    tree: Option<Arc<Tree>>,
}

/// The plain fields of a [`Cluster`], as written in problem and plan files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterData {
    /// A name for reports (preset name or `NODESxGPUS`).
    pub name: String,
    /// Number of nodes.
    pub nodes: u32,
    /// Devices per node.
    pub gpus_per_node: u32,
    /// NICs per node; local device `i` uses NIC `i * nics_per_node / gpus_per_node`.
    pub nics_per_node: u32,
    /// Link capacities.
    pub bandwidth: Bandwidths,
    /// Fixed cost of every message, in seconds.
    pub latency_s: f64,
    /// Dead devices.
    #[serde(default)]
    pub dead: BTreeSet<DeviceId>,
    /// A checkpoint store the job's state can be read from: one more node
    /// whose first device is the store (the node's other slots are empty),
    /// read through one link of `bandwidth.storage` per compute node in
    /// aggregate, into the compute nodes' NICs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub storage: bool,
    /// The switches above the NICs and their links (none: a non-blocking
    /// network). See [`crate::fabric`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricData>,
}

/// A preset's rail-optimized fabric (see [`crate::rail_optimized`]).
pub struct RailFabric {
    /// Nodes per scalable unit (one rail switch per NIC index and unit).
    pub unit: u32,
    /// Rail switch downlinks over uplinks.
    pub oversubscription: f64,
}

/// One named cluster preset.
pub struct Preset {
    /// Name used with `--cluster`.
    pub name: &'static str,
    /// Nodes in the default size.
    pub nodes: u32,
    /// Devices per node.
    pub gpus_per_node: u32,
    /// NICs per node.
    pub nics_per_node: u32,
    /// Capacities.
    pub bandwidth: fn() -> Bandwidths,
    /// Message latency in seconds.
    pub latency_s: f64,
    /// Where the numbers come from.
    pub source: &'static str,
    /// The fabric above the NICs (`None`: a non-blocking network).
    pub fabric: Option<RailFabric>,
}

const GB: f64 = 1e9;

/// The named presets.
///
/// `tenplex-onprem` is the testbed of the Tenplex paper's evaluation
/// (Wagenländer et al., SOSP'24, §6): 4 servers with 4 NVIDIA RTX A6000 each,
/// joined by 100 Gb/s InfiniBand, GPUs attached by PCIe 4.0 x16. Rates are the
/// nominal rates of those parts: 12.5 GB/s per NIC direction, about 25 GB/s of
/// usable PCIe 4.0 x16 per direction, 768 GB/s of GDDR6 (a copy reads and
/// writes: 384 GB/s), NVMe storage at 3 GB/s.
///
/// `dgx-h100` is an NVIDIA DGX H100 node (DGX H100 user guide): 8 H100 SXM on
/// NVSwitch with 900 GB/s of NVLink 4 per GPU (450 GB/s per direction), 8
/// ConnectX-7 NICs at 400 Gb/s (50 GB/s per direction), PCIe Gen5 x16 host
/// links (64 GB/s), 3.35 TB/s of HBM3 (1.675 TB/s copy rate), and 25 GB/s of
/// storage reads per node (a typical parallel file-system client).
///
/// `dgx-h100-rail` and `dgx-h100-rail-2to1` are the same nodes on the
/// rail-optimized compute fabric of NVIDIA's DGX SuperPOD: scalable units
/// of 32 nodes, NIC `r` of each node on the unit's rail switch `r`, rail
/// switches on one spine (its planes summed) at 1:1 or 2:1
/// oversubscription. Traffic between NICs of one rail switch stays off the
/// spine; everything else crosses two rail-switch uplinks.
///
/// `gb200-nvl72` is a rack of the GB200 NVL72 (NVIDIA GB200 NVL72
/// datasheet): one NVLink domain of 72 Blackwell GPUs (NVLink 5, 1.8 TB/s
/// per GPU, 900 GB/s per direction), one ConnectX-7 400 Gb/s NIC per GPU,
/// NVLink-C2C to the Grace CPUs (225 GB/s per GPU and direction), 8 TB/s of
/// HBM3e (4 TB/s copy rate), 25 GB/s of storage reads per compute tray (18
/// per rack); racks in units of 8 on a rail-optimized fabric (one rail per
/// GPU position), 1:1.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "tenplex-onprem",
        nodes: 4,
        gpus_per_node: 4,
        nics_per_node: 1,
        bandwidth: || Bandwidths {
            intra_node: 25.0 * GB,
            nic: 12.5 * GB,
            host_link: 25.0 * GB,
            storage: 3.0 * GB,
            device_memory: 384.0 * GB,
        },
        latency_s: 20e-6,
        source: "Tenplex (SOSP'24) §6 testbed: 4 hosts x 4 RTX A6000, 100 Gb/s InfiniBand, PCIe 4.0",
        fabric: None,
    },
    Preset {
        name: "dgx-h100",
        nodes: 1,
        gpus_per_node: 8,
        nics_per_node: 8,
        bandwidth: dgx_h100,
        latency_s: 10e-6,
        source: "NVIDIA DGX H100: NVSwitch NVLink 4 (900 GB/s/GPU), 8x ConnectX-7 400 Gb/s, PCIe Gen5",
        fabric: None,
    },
    Preset {
        name: "dgx-h100-rail",
        nodes: 32,
        gpus_per_node: 8,
        nics_per_node: 8,
        bandwidth: dgx_h100,
        latency_s: 10e-6,
        source: "DGX H100 SuperPOD compute fabric: rail-optimized, 32 nodes per unit, 1:1 spine",
        fabric: Some(RailFabric {
            unit: 32,
            oversubscription: 1.0,
        }),
    },
    Preset {
        name: "dgx-h100-rail-2to1",
        nodes: 32,
        gpus_per_node: 8,
        nics_per_node: 8,
        bandwidth: dgx_h100,
        latency_s: 10e-6,
        source: "DGX H100, rail-optimized, 32 nodes per unit, spine oversubscribed 2:1",
        fabric: Some(RailFabric {
            unit: 32,
            oversubscription: 2.0,
        }),
    },
    Preset {
        name: "gb200-nvl72",
        nodes: 8,
        gpus_per_node: 72,
        nics_per_node: 72,
        bandwidth: || Bandwidths {
            intra_node: 900.0 * GB,
            nic: 50.0 * GB,
            host_link: 225.0 * GB,
            storage: 18.0 * 25.0 * GB,
            device_memory: 4000.0 * GB,
        },
        latency_s: 10e-6,
        source: "GB200 NVL72 racks (72 GPUs on NVLink 5, 1.8 TB/s/GPU; a ConnectX-7 400 Gb/s per GPU; \
                 NVLink-C2C to Grace; 8 TB/s HBM3e), rail-optimized, 8 racks per unit, 1:1 spine",
        fabric: Some(RailFabric {
            unit: 8,
            oversubscription: 1.0,
        }),
    },
];

fn dgx_h100() -> Bandwidths {
    Bandwidths {
        intra_node: 450.0 * GB,
        nic: 50.0 * GB,
        host_link: 64.0 * GB,
        storage: 25.0 * GB,
        device_memory: 1675.0 * GB,
    }
}

impl Cluster {
    /// Build and validate a cluster.
    pub fn new(data: ClusterData) -> Result<Cluster> {
        let bad = |what: String| Err(Error::InvalidCluster { what });
        if data.nodes == 0 || data.gpus_per_node == 0 || data.nics_per_node == 0 {
            return bad(format!(
                "{} nodes x {} devices with {} NICs per node: each must be at least 1",
                data.nodes, data.gpus_per_node, data.nics_per_node
            ));
        }
        // The store's node counts: it adds a node's worth of slots.
        let slots = (u64::from(data.nodes) + u64::from(data.storage)) * u64::from(data.gpus_per_node);
        crate::limits::check("devices of a cluster", slots, u64::from(crate::limits::MAX_DEVICES))?;

        let b = &data.bandwidth;
        for (name, v) in [
            ("intra_node", b.intra_node),
            ("nic", b.nic),
            ("host_link", b.host_link),
            ("storage", b.storage),
            ("device_memory", b.device_memory),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("bandwidth {name} = {v} must be positive and finite"));
            }
        }
        if !(data.latency_s.is_finite() && data.latency_s >= 0.0) {
            return bad(format!("latency {} must be finite and non-negative", data.latency_s));
        }
        let n = data.nodes * data.gpus_per_node;
        if let Some(&d) = data.dead.iter().find(|&&d| d >= n) {
            return bad(format!("dead device {d} does not exist ({n} devices)"));
        }
        let nics = u64::from(data.nodes) * u64::from(data.nics_per_node);
        crate::limits::check("NICs of a cluster", nics, u64::from(crate::limits::MAX_DEVICES))?;
        let tree = match &data.fabric {
            Some(f) => Some(Arc::new(Tree::new(f, nics)?)),
            None => None,
        };
        Ok(Cluster { data, tree })
    }

    /// The cluster a topology file describes.
    pub fn from_topology(t: &Topology) -> Result<Cluster> {
        Cluster::new(t.to_cluster_data()?)
    }

    /// A cluster from a `--cluster` argument: a topology file (a path
    /// ending in `.json`, see [`Topology`]), or what [`Cluster::parse`] reads.
    pub fn open(spec: &str) -> Result<Cluster> {
        if spec.ends_with(".json") {
            let text = std::fs::read_to_string(spec).map_err(|e| Error::Format {
                what: format!("topology file {spec}: {e}"),
            })?;
            return Cluster::from_topology(&Topology::from_json(&text)?).map_err(|e| Error::Format {
                what: format!("topology file {spec}: {e}"),
            });
        }
        Cluster::parse(spec)
    }

    /// A cluster from a command-line description: `NODESxGPUS` (with the
    /// `tenplex-onprem` link rates), a preset name, or `PRESET:NODES`.
    pub fn parse(spec: &str) -> Result<Cluster> {
        let unknown = || Error::UnknownCluster {
            spec: spec.to_string(),
            presets: PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
        };
        let (name, nodes) = match spec.split_once(':') {
            Some((n, k)) => (n, Some(parse_count(k, "nodes").map_err(|e| e.unwrap_or_else(unknown))?)),
            None => (spec, None),
        };
        if let Some(p) = PRESETS.iter().find(|p| p.name == name) {
            return Cluster::from_preset(p, nodes.unwrap_or(p.nodes), p.gpus_per_node);
        }
        if nodes.is_none() {
            if let Some((a, b)) = spec.split_once('x') {
                let (nodes, gpus) = (parse_count(a, "nodes"), parse_count(b, "devices per node"));
                match (nodes, gpus) {
                    (Ok(nodes), Ok(gpus)) => return Cluster::from_preset(&PRESETS[0], nodes, gpus),
                    (Err(Some(e)), _) | (_, Err(Some(e))) => return Err(e),
                    _ => {}
                }
            }
        }
        Err(unknown())
    }

    fn from_preset(p: &Preset, nodes: u32, gpus_per_node: u32) -> Result<Cluster> {
        let name = if nodes == p.nodes && gpus_per_node == p.gpus_per_node {
            p.name.to_string()
        } else if gpus_per_node == p.gpus_per_node {
            format!("{}:{nodes}", p.name)
        } else {
            format!("{nodes}x{gpus_per_node}")
        };
        Cluster::new(ClusterData {
            name,
            nodes,
            gpus_per_node,
            nics_per_node: p.nics_per_node.min(gpus_per_node.max(1)),
            bandwidth: (p.bandwidth)(),
            latency_s: p.latency_s,
            dead: BTreeSet::new(),
            storage: false,
            fabric: p
                .fabric
                .as_ref()
                .filter(|_| gpus_per_node == p.gpus_per_node)
                .map(|f| rail_optimized(nodes, p.nics_per_node, (p.bandwidth)().nic, f.unit, f.oversubscription)),
        })
    }

    /// The same cluster with a checkpoint store (see [`ClusterData::storage`]).
    pub fn with_storage(&self) -> Cluster {
        let mut data = self.data.clone();
        data.storage = true;
        Cluster {
            data,
            tree: self.tree.clone(),
        }
    }

    /// The checkpoint store's device, if the cluster has one.
    pub fn storage_device(&self) -> Option<DeviceId> {
        self.data.storage.then(|| self.data.nodes * self.data.gpus_per_node)
    }

    /// The checkpoint store's NIC, if the cluster has one.
    pub fn storage_nic(&self) -> Option<u32> {
        self.data.storage.then(|| self.data.nodes * self.data.nics_per_node)
    }

    /// Number of compute nodes (the store's node excluded).
    pub fn compute_nodes(&self) -> u32 {
        self.data.nodes
    }

    /// The same cluster with more dead devices.
    pub fn with_dead(&self, dead: impl IntoIterator<Item = DeviceId>) -> Result<Cluster> {
        let mut data = self.data.clone();
        data.dead.extend(dead);
        Cluster::new(data)
    }

    /// The plain fields.
    pub fn data(&self) -> &ClusterData {
        &self.data
    }

    /// Name for reports.
    pub fn name(&self) -> &str {
        &self.data.name
    }

    /// Number of nodes, the store's node included.
    pub fn nodes(&self) -> u32 {
        self.data.nodes + u32::from(self.data.storage)
    }

    /// Devices per node.
    pub fn gpus_per_node(&self) -> u32 {
        self.data.gpus_per_node
    }

    /// NICs per node.
    pub fn nics_per_node(&self) -> u32 {
        self.data.nics_per_node
    }

    /// Total number of device slots, the store's node included (its slots
    /// other than the store are never live).
    pub fn num_devices(&self) -> u32 {
        self.nodes() * self.data.gpus_per_node
    }

    /// Link capacities.
    pub fn bandwidth(&self) -> &Bandwidths {
        &self.data.bandwidth
    }

    /// Per-message latency in seconds.
    pub fn latency_s(&self) -> f64 {
        self.data.latency_s
    }

    /// Dead devices.
    pub fn dead(&self) -> &BTreeSet<DeviceId> {
        &self.data.dead
    }

    /// The node of a device.
    pub fn node_of(&self, d: DeviceId) -> u32 {
        d / self.data.gpus_per_node
    }

    /// The global index of the NIC a device sends and receives through.
    pub fn nic_of(&self, d: DeviceId) -> u32 {
        let local = u64::from(d % self.data.gpus_per_node);
        // In u64: local · nics may pass u32 even when the NIC index does not.
        let within = local * u64::from(self.data.nics_per_node) / u64::from(self.data.gpus_per_node);
        self.node_of(d) * self.data.nics_per_node + within as u32
    }

    /// Whether the network above the NICs has switch links that can
    /// congest (a fabric); without one it is non-blocking.
    pub fn has_fabric(&self) -> bool {
        self.tree.is_some()
    }

    /// The switch a NIC attaches to (the checkpoint store's NIC included),
    /// when there is a fabric.
    pub fn switch_of_nic(&self, nic: u32) -> Option<u32> {
        let f = self.data.fabric.as_ref()?;
        let tree = self.tree.as_ref()?;
        Some(match f.nics.get(nic as usize) {
            Some(&s) => s,
            None => f.storage.unwrap_or_else(|| tree.root()),
        })
    }

    /// The switch links between two NICs (up to their lowest common
    /// switch, then down), appended to `out`; none without a fabric.
    pub fn fabric_path(&self, from_nic: u32, to_nic: u32, out: &mut Vec<FabricLink>) {
        if let (Some(tree), Some(a), Some(b)) = (&self.tree, self.switch_of_nic(from_nic), self.switch_of_nic(to_nic)) {
            tree.path(a, b, out);
        }
    }

    /// Every switch link between two switches, in no set order (for sums
    /// over a route without building it); none without a fabric.
    pub fn fabric_walk(&self, from_switch: u32, to_switch: u32, f: impl FnMut(FabricLink)) {
        if let Some(tree) = &self.tree {
            tree.walk(from_switch, to_switch, f);
        }
    }

    /// The switch above a switch, if any.
    pub fn parent_switch(&self, s: u32) -> Option<u32> {
        self.tree.as_ref()?.parent(s)
    }

    /// Capacity of a switch link, bytes per second (0 for the root's
    /// missing uplink or a switch that does not exist).
    pub fn fabric_capacity(&self, link: FabricLink) -> f64 {
        let Some(f) = &self.data.fabric else { return 0.0 };
        match link {
            FabricLink::Up(s) => f.switches.get(s as usize).map_or(0.0, |s| s.up),
            FabricLink::Down(s) => f.switches.get(s as usize).map_or(0.0, |s| s.down),
        }
    }

    /// Name of a switch, for reports.
    pub fn switch_name(&self, s: u32) -> &str {
        self.data
            .fabric
            .as_ref()
            .and_then(|f| f.switches.get(s as usize))
            .map_or("?", |s| s.name.as_str())
    }

    /// Number of switches of the fabric (0 without one).
    pub fn num_switches(&self) -> u32 {
        self.data.fabric.as_ref().map_or(0, |f| f.switches.len() as u32)
    }

    /// True when the device exists and is not dead.
    pub fn is_live(&self, d: DeviceId) -> bool {
        let compute = self.data.nodes * self.data.gpus_per_node;
        (d < compute && !self.data.dead.contains(&d)) || Some(d) == self.storage_device()
    }
}

/// A count of a cluster description: `Err(None)` when it is not a number,
/// `Err(Some(limit error))` when it is one beyond [`crate::limits::MAX_DEVICES`].
fn parse_count(s: &str, what: &'static str) -> std::result::Result<u32, Option<Error>> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(None);
    }
    let max = crate::limits::MAX_DEVICES;
    match s.parse::<u64>() {
        Ok(v) if v <= u64::from(max) => Ok(v as u32),
        Ok(v) => Err(Some(Error::Limit {
            what,
            value: v,
            max: max.into(),
        })),
        Err(_) => Err(Some(Error::Limit {
            what,
            value: u64::MAX,
            max: max.into(),
        })),
    }
}

impl TryFrom<ClusterData> for Cluster {
    type Error = Error;
    fn try_from(data: ClusterData) -> Result<Cluster> {
        Cluster::new(data)
    }
}

impl From<Cluster> for ClusterData {
    fn from(c: Cluster) -> ClusterData {
        c.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_presets() {
        let c = Cluster::parse("4x4").unwrap();
        assert_eq!((c.nodes(), c.gpus_per_node(), c.num_devices()), (4, 4, 16));
        assert_eq!(c.name(), "tenplex-onprem");
        let d = Cluster::parse("dgx-h100:64").unwrap();
        assert_eq!(d.num_devices(), 512);
        assert_eq!(d.nic_of(9), 9);
        assert_eq!(c.nic_of(7), 1);
        assert!(Cluster::parse("4y4").is_err());
        assert!(Cluster::parse("0x4").is_err());
        assert!(Cluster::parse("dgx-h100:x").is_err());
    }

    #[test]
    fn fabric_presets_are_trees_of_rail_switches() {
        let c = Cluster::parse("dgx-h100-rail-2to1:64").unwrap();
        // Two units of 32 nodes, 8 rails each, one spine.
        assert_eq!((c.num_devices(), c.num_switches()), (512, 17));
        let f = c.data().fabric.as_ref().unwrap();
        assert_eq!(f.switches[1].up, 32.0 * 50e9 / 2.0);
        // NIC 3 of node 40 sits on unit 1's rail 3, under the spine.
        let s = c.switch_of_nic(40 * 8 + 3).unwrap();
        assert_eq!(c.switch_name(s), "su1-rail3");
        assert_eq!(c.parent_switch(s), Some(0));
        let mut path = Vec::new();
        c.fabric_path(3, 40 * 8 + 3, &mut path);
        assert_eq!(path.len(), 2, "up from unit 0's rail 3, down to unit 1's");
        path.clear();
        c.fabric_path(3, 8 + 3, &mut path);
        assert!(path.is_empty(), "same rail, same unit: off the spine");
        let g = Cluster::parse("gb200-nvl72:2").unwrap();
        assert_eq!((g.num_devices(), g.gpus_per_node(), g.num_switches()), (144, 72, 73));
        assert!(!Cluster::parse("dgx-h100:4").unwrap().has_fabric());
        assert!(!Cluster::parse("2x8").unwrap().has_fabric());
    }

    #[test]
    fn dead_devices_must_exist() {
        let c = Cluster::parse("2x4").unwrap();
        assert!(c.with_dead([7]).unwrap().dead().contains(&7));
        assert!(c.with_dead([8]).is_err());
        assert!(!c.with_dead([3]).unwrap().is_live(3));
    }

    #[test]
    fn nic_counts_are_bounded_and_indices_never_overflow() {
        // A damaged plan's cluster once panicked in nic_of (found by
        // tests/adversarial.rs): more NICs than any cluster has are refused,
        // and the index is computed without overflow below that bound.
        let mut data = ClusterData::from(Cluster::parse("1x8").unwrap());
        data.nics_per_node = 1_431_655_766;
        assert!(Cluster::new(data.clone()).is_err());
        data.nics_per_node = crate::limits::MAX_DEVICES;
        let c = Cluster::new(data).unwrap();
        assert_eq!(c.nic_of(7), 7 * (crate::limits::MAX_DEVICES / 8));
    }
}
