//! Parallel configurations: `tp=4,pp=2,dp=1,zero=1,ep=1,devices=8-15,split=10:11:11`.

use std::fmt;
use std::str::FromStr;

use tenplan_ptc::{limits, Cluster, DeviceId};

use crate::{Error, Result};

/// A Megatron-style parallel configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParallelConfig {
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Pipeline-parallel degree.
    pub pp: u32,
    /// Data-parallel degree.
    pub dp: u32,
    /// ZeRO stage: 0 (optimizer state follows the parameters) or 1
    /// (distributed optimizer: optimizer state sharded over data parallelism).
    pub zero: u32,
    /// Expert-parallel degree (MoE models), carved out of data parallelism.
    pub ep: u32,
    /// Global device ids of ranks `0..tp·pp·dp`; `None` means `0..tp·pp·dp`.
    pub devices: Option<Vec<DeviceId>>,
    /// Layers per pipeline stage; `None` means an even split.
    pub split: Option<Vec<u32>>,
    /// Serving layouts only: the experts each of the `ep` groups of an
    /// engine's ranks serves, as EPLB's rebalanced placements give them
    /// (`experts=0-2+7:3-7`: groups separated by `:`, experts by `+`,
    /// ranges `A-B`; an expert may be in several groups, as a redundant
    /// replica). `None`: group g serves the g-th contiguous `experts/ep`.
    pub experts: Option<Vec<Vec<u32>>>,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            tp: 1,
            pp: 1,
            dp: 1,
            zero: 0,
            ep: 1,
            devices: None,
            split: None,
            experts: None,
        }
    }
}

impl ParallelConfig {
    /// Number of ranks, tp·pp·dp.
    pub fn world(&self) -> u64 {
        self.tp as u64 * self.pp as u64 * self.dp as u64
    }

    /// Device of each rank, in rank order (Megatron order: tp fastest, then dp, then pp).
    ///
    /// Refuses zero degrees and more ranks than [`limits::MAX_DEVICES`]
    /// before allocating anything.
    pub fn rank_devices(&self) -> Result<Vec<DeviceId>> {
        for (what, v) in [("tp", self.tp), ("pp", self.pp), ("dp", self.dp), ("ep", self.ep)] {
            if v == 0 {
                return Err(Error::ZeroDegree { what });
            }
        }
        let needed = self.world();
        limits::check("ranks (tp·pp·dp)", needed, limits::MAX_DEVICES.into())?;
        match &self.devices {
            None => Ok((0..needed as u32).collect()),
            Some(d) if d.len() as u64 == needed => Ok(d.clone()),
            Some(d) => Err(Error::DeviceCount {
                tp: self.tp,
                pp: self.pp,
                dp: self.dp,
                needed,
                given: d.len() as u64,
            }),
        }
    }

    /// Check, before any layout is built, that the configuration's ranks fit
    /// the cluster: tp·pp·dp ranks at most the cluster's compute devices, and
    /// every device it names exists.
    pub fn check_cluster(&self, cluster: &Cluster) -> Result<()> {
        let have = cluster.compute_nodes() as u64 * cluster.gpus_per_node() as u64;
        let needed = self.world();
        if needed > have {
            return Err(Error::ClusterTooSmall {
                layout: self.to_string(),
                ranks: needed,
                cluster: cluster.name().to_string(),
                devices: have,
            });
        }
        if let Some(&d) = self.devices.iter().flatten().find(|&&d| u64::from(d) >= have) {
            return Err(Error::ClusterTooSmall {
                layout: self.to_string(),
                ranks: u64::from(d) + 1,
                cluster: cluster.name().to_string(),
                devices: have,
            });
        }
        Ok(())
    }

    /// The same configuration on devices `first..first + tp·pp·dp`.
    pub fn on_devices_from(mut self, first: DeviceId) -> Self {
        self.devices = Some((first..first + self.world() as u32).collect());
        self
    }
}

/// The `key=value` pairs of a layout string, trimmed; a pair that is not
/// one, or a key given twice, is refused.
pub(crate) fn key_values(input: &str) -> Result<Vec<(&str, &str)>> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for part in input.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| parse_error(input, format!("`{part}` is not key=value")))?;
        let (k, v) = (k.trim(), v.trim());
        if pairs.iter().any(|(seen, _)| *seen == k) {
            return Err(parse_error(input, format!("`{k}` is given twice")));
        }
        pairs.push((k, v));
    }
    Ok(pairs)
}

/// A number of a layout string's `key=value`.
pub(crate) fn layout_number(input: &str, k: &str, v: &str) -> Result<u32> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(parse_error(
            input,
            format!("`{k}={v}`: expected a non-negative integer"),
        ));
    }
    // Every degree, device id and layer count is bounded by the device
    // limit; a larger number is refused by name, not mistaken for a
    // malformed one.
    let max = u64::from(limits::MAX_DEVICES);
    match v.parse::<u64>() {
        Ok(n) if n <= max => Ok(n as u32),
        _ => Err(parse_error(input, format!("`{k}={v}` exceeds the limit of {max}"))),
    }
}

/// `devices=A-B`: the devices A to B.
pub(crate) fn device_range(input: &str, v: &str) -> Result<Vec<u32>> {
    let (a, b) = v
        .split_once('-')
        .ok_or_else(|| parse_error(input, format!("`devices={v}`: expected a range A-B")))?;
    let (a, b) = (layout_number(input, "devices", a)?, layout_number(input, "devices", b)?);
    if a > b {
        return Err(parse_error(input, format!("`devices={v}`: range is inverted")));
    }
    Ok((a..=b).collect())
}

fn parse_error(input: &str, why: String) -> Error {
    Error::ParseLayout {
        input: input.to_string(),
        why,
    }
}

impl FromStr for ParallelConfig {
    type Err = Error;

    fn from_str(input: &str) -> Result<ParallelConfig> {
        let bad = |why: String| Error::ParseLayout {
            input: input.to_string(),
            why,
        };
        let mut c = ParallelConfig::default();
        if input.trim().is_empty() {
            return Err(bad(
                "empty layout; expected key=value pairs such as tp=2,pp=1,dp=4".into()
            ));
        }
        for (k, v) in key_values(input)? {
            let num = |v: &str| layout_number(input, k, v);
            match k {
                "tp" => c.tp = num(v)?,
                "pp" => c.pp = num(v)?,
                "dp" => c.dp = num(v)?,
                "ep" => c.ep = num(v)?,
                "zero" => c.zero = num(v)?,
                "devices" => c.devices = Some(device_range(input, v)?),
                "split" => {
                    c.split = Some(v.split(':').map(num).collect::<Result<_>>()?);
                }
                "experts" => {
                    let mut groups = Vec::new();
                    for g in v.split(':') {
                        let mut list = Vec::new();
                        for item in g.split('+') {
                            match item.split_once('-') {
                                Some((a, b)) => {
                                    let (a, b) = (num(a)?, num(b)?);
                                    if a > b {
                                        return Err(bad(format!("`experts={v}`: range {item} is inverted")));
                                    }
                                    list.extend(a..=b);
                                }
                                None => list.push(num(item)?),
                            }
                        }
                        groups.push(list);
                    }
                    c.experts = Some(groups);
                }
                _ => {
                    return Err(bad(format!(
                        "unknown key `{k}` (expected tp, pp, dp, zero, ep, devices, split, experts)"
                    )))
                }
            }
        }
        for (what, v) in [("tp", c.tp), ("pp", c.pp), ("dp", c.dp), ("ep", c.ep)] {
            if v == 0 {
                return Err(Error::ZeroDegree { what });
            }
        }
        c.rank_devices()?;
        Ok(c)
    }
}

impl fmt::Display for ParallelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp={},pp={},dp={}", self.tp, self.pp, self.dp)?;
        if self.zero != 0 {
            write!(f, ",zero={}", self.zero)?;
        }
        if self.ep != 1 {
            write!(f, ",ep={}", self.ep)?;
        }
        if let Some(d) = &self.devices {
            let contiguous = d.windows(2).all(|w| w[1] == w[0] + 1);
            if let (true, Some(first), Some(last)) = (contiguous, d.first(), d.last()) {
                if *first != 0 {
                    write!(f, ",devices={first}-{last}")?;
                }
            }
        }
        if let Some(s) = &self.split {
            let s: Vec<String> = s.iter().map(u32::to_string).collect();
            write!(f, ",split={}", s.join(":"))?;
        }
        if let Some(groups) = &self.experts {
            // Runs of consecutive experts as ranges, in the order given.
            let groups: Vec<String> = groups
                .iter()
                .map(|g| {
                    let mut items: Vec<String> = Vec::new();
                    let mut i = 0;
                    while i < g.len() {
                        let mut j = i;
                        while j + 1 < g.len() && g[j + 1] == g[j] + 1 {
                            j += 1;
                        }
                        items.push(if j > i {
                            format!("{}-{}", g[i], g[j])
                        } else {
                            g[i].to_string()
                        });
                        i = j + 1;
                    }
                    items.join("+")
                })
                .collect();
            write!(f, ",experts={}", groups.join(":"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let c: ParallelConfig = "tp=4,pp=2,dp=2,zero=1,devices=16-31,split=10:14".parse().unwrap();
        assert_eq!((c.tp, c.pp, c.dp, c.zero), (4, 2, 2, 1));
        assert_eq!(c.rank_devices().unwrap()[0], 16);
        assert_eq!(c.to_string(), "tp=4,pp=2,dp=2,zero=1,devices=16-31,split=10:14");
    }

    #[test]
    fn rejects_malformed_strings() {
        for s in [
            "",
            "tp",
            "tp=x",
            "tp=2,tp=2",
            "foo=1",
            "tp=0",
            "devices=3-1",
            "tp=2,devices=0-2",
            "tp=4294967296",
            "dp=4294967295",
            "tp=1024,pp=1024,dp=1024",
            "devices=0-4294967295",
            "tp=-1",
            "tp=+1",
        ] {
            assert!(s.parse::<ParallelConfig>().is_err(), "{s}");
        }
    }
}
