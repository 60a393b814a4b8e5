//! Several processes: one worker per device executes its part of a verified
//! plan, exchanging boxes with its peers over TCP.
//!
//! Every worker holds the same plan and a table of its peers' addresses. A
//! copy travels its route (`src`, relays, `dst`) as frames: the copy's box cut
//! along its first dimension into slabs of at most `frame_bytes`, each sent
//! with a small header (copy index, hop, rows). A relay forwards frames as
//! they arrive; the destination writes them into its piece and, for a
//! multicast, forwards them to each device of the copy's fanout (hops past
//! the route's end: hop `route length + k` is the copy's `k`-th forward). Buffers are
//! bounded (one frame per connection in flight at a reader; TCP flow control
//! does the rest), and every connect, read and write has a timeout, so a dead
//! peer is an error naming it, never a hang.
//!
//! Frame header (little-endian): magic `TPLN` (u32), copy index (u32), hop
//! (u32), first row, end row, payload bytes (u64 each).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tenplan_ptc::{Copy, DeviceId, Forward, Piece, Plan, Region, TensorId};

use crate::{add_box, copy_box, Error, HostMemory, Result, Verified};

const MAGIC: u32 = u32::from_le_bytes(*b"TPLN");
const HEADER: usize = 36;

/// How one worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// This worker's device.
    pub device: DeviceId,
    /// Every peer's address (this worker's own entry is ignored).
    pub peers: BTreeMap<DeviceId, SocketAddr>,
    /// Limit on connecting, on each read and write, and on the whole run.
    pub timeout: Duration,
    /// Largest payload of one frame.
    pub frame_bytes: usize,
}

/// What a worker did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Frames this worker sent as a source.
    pub frames_sent: u64,
    /// Payload bytes it sent as a source.
    pub bytes_sent: u64,
    /// Frames it forwarded as a relay.
    pub frames_forwarded: u64,
    /// Frames it wrote into its own target buffers (from peers).
    pub frames_received: u64,
    /// Bytes copied locally (source and destination on this device).
    pub bytes_local: u64,
}

/// Parse a peers table: one `DEVICE ADDRESS` per line (`#` starts a comment).
pub fn parse_peers(text: &str) -> std::result::Result<BTreeMap<DeviceId, SocketAddr>, String> {
    let mut peers = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(d), Some(a), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("line {}: expected `DEVICE ADDRESS`, got `{line}`", i + 1));
        };
        let d: DeviceId = d.parse().map_err(|_| format!("line {}: bad device `{d}`", i + 1))?;
        let a: SocketAddr = a.parse().map_err(|_| format!("line {}: bad address `{a}`", i + 1))?;
        if peers.insert(d, a).is_some() {
            return Err(format!("line {}: device {d} listed twice", i + 1));
        }
    }
    Ok(peers)
}

/// The rows of each frame of a copy.
fn frames(c: &Copy, elem: u64, frame_bytes: usize) -> Vec<(u64, u64)> {
    let rows = c.region.range(0);
    let row_bytes = c.region.volume() / (rows.end - rows.start) * elem;
    let per = (frame_bytes as u64 / row_bytes.max(1)).max(1);
    (rows.start..rows.end)
        .step_by(per as usize)
        .map(|lo| (lo, (lo + per).min(rows.end)))
        .collect()
}

struct Shared<'a> {
    plan: &'a Plan,
    cfg: &'a WorkerConfig,
    target: Mutex<BTreeMap<DeviceId, Vec<Vec<u8>>>>,
    out: BTreeMap<DeviceId, Mutex<Option<TcpStream>>>,
    state: Mutex<Progress>,
    changed: Condvar,
    deadline: Instant,
}

#[derive(Default)]
struct Progress {
    received: u64,
    stats: WorkerStats,
    error: Option<Error>,
}

impl Shared<'_> {
    fn fail(&self, e: Error) {
        let mut s = self.state.lock().expect("no poisoning: workers do not panic");
        if s.error.is_none() {
            s.error = Some(e);
        }
        self.changed.notify_all();
    }

    fn err(&self, what: impl Into<String>) -> Error {
        Error::Worker {
            device: self.cfg.device,
            what: what.into(),
        }
    }

    /// Send one frame to a peer, connecting on first use.
    fn send(&self, to: DeviceId, header: &[u8], payload: &[u8]) -> Result<()> {
        let slot = self
            .out
            .get(&to)
            .ok_or_else(|| self.err(format!("no address for device {to} in the peers table")))?;
        let mut conn = slot.lock().expect("no poisoning");
        if conn.is_none() {
            let addr = self.cfg.peers[&to];
            let stream = loop {
                match TcpStream::connect_timeout(&addr, self.cfg.timeout) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() < self.deadline => {
                        // The peer may not be listening yet.
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        return Err(self.err(format!("timed out connecting to device {to} at {addr}: {e}")));
                    }
                }
            };
            stream
                .set_write_timeout(Some(self.cfg.timeout))
                .and_then(|_| stream.set_nodelay(true))
                .map_err(|e| self.err(format!("socket to device {to}: {e}")))?;
            *conn = Some(stream);
        }
        let s = conn.as_mut().expect("connected above");
        s.write_all(header)
            .and_then(|_| s.write_all(payload))
            .map_err(|e| self.err(format!("sending to device {to}: {e}")))
    }

    /// Write a frame's rows of copy `c` into the target piece `w` names on
    /// this device.
    fn scatter(&self, c: &Copy, w: &Forward, rows: &Region, payload: &[u8]) {
        let problem = &self.plan.problem;
        let elem = problem.tensors()[c.tensor as usize].dtype.size() as usize;
        let to = problem
            .target()
            .piece_at(w.dst, w.buffer, w.offset, c.tensor)
            .expect("verified: the target piece exists");
        let from = Piece {
            tensor: c.tensor,
            region: rows.clone(),
            offset: 0,
        };
        let mut target = self.target.lock().expect("no poisoning");
        let buf = &mut target.get_mut(&w.dst).expect("this device's buffers")[w.buffer as usize];
        if c.reduce {
            add_box(
                payload,
                &from,
                buf,
                to,
                rows,
                problem.tensors()[c.tensor as usize].dtype,
            );
        } else {
            copy_box(payload, &from, buf, to, rows, elem);
        }
    }

    /// Handle frames from one peer until it closes the connection.
    fn read_from(&self, mut stream: TcpStream) -> Result<()> {
        stream
            .set_read_timeout(Some(self.cfg.timeout))
            .map_err(|e| self.err(format!("socket: {e}")))?;
        let me = self.cfg.device;
        let mut header = [0u8; HEADER];
        let mut payload = Vec::new();
        loop {
            match stream.read_exact(&mut header) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(self.err(format!("reading from a peer: {e}"))),
            }
            let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
            let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
            let (magic, ci, hop, lo, hi, len) = (u32_at(0), u32_at(4), u32_at(8), u64_at(12), u64_at(20), u64_at(28));
            let bad = |what: String| self.err(format!("protocol: {what}"));
            if magic != MAGIC {
                return Err(bad("bad frame magic (not a tenplan worker?)".into()));
            }
            let c = self
                .plan
                .copies
                .get(ci as usize)
                .ok_or_else(|| bad(format!("copy {ci} does not exist")))?;
            let route = c.route();
            let forward = (hop as usize).checked_sub(route.len()).map(|k| c.fanout.get(k));
            let mine = match forward {
                None => route.get(hop as usize) == Some(&me) && hop > 0,
                Some(w) => w.is_some_and(|w| w.dst == me),
            };
            if !mine {
                return Err(bad(format!("copy {ci} hop {hop} is not for device {me}")));
            }
            let full = c.region.range(0);
            if lo >= hi || lo < full.start || hi > full.end {
                return Err(bad(format!("rows {lo}..{hi} are outside copy {ci}")));
            }
            let rows = c.region.with_range(0, lo..hi);
            let elem = self.plan.problem.tensors()[c.tensor as usize].dtype.size();
            let row_bytes = rows.volume() / (hi - lo) * elem;
            if len != rows.volume() * elem || len > (self.cfg.frame_bytes as u64).max(row_bytes) {
                return Err(bad(format!("copy {ci} rows {lo}..{hi}: {len} bytes")));
            }
            payload.resize(len as usize, 0);
            stream
                .read_exact(&mut payload)
                .map_err(|e| self.err(format!("reading a frame of copy {ci}: {e}")))?;
            let (mut forwarded, mut received) = (0, 0);
            if let Some(Some(w)) = forward {
                self.scatter(c, w, &rows, &payload);
                received += 1;
            } else if hop as usize + 1 < route.len() {
                let mut next = header;
                next[8..12].copy_from_slice(&(hop + 1).to_le_bytes());
                self.send(route[hop as usize + 1], &next, &payload)?;
                forwarded += 1;
            } else {
                let mut writes = c.writes();
                let own = writes.next().expect("a copy writes its destination");
                self.scatter(c, &own, &rows, &payload);
                received += 1;
                // A multicast: pass the frame on within the node.
                for (k, w) in writes.enumerate() {
                    let mut next = header;
                    next[8..12].copy_from_slice(&((route.len() + k) as u32).to_le_bytes());
                    self.send(w.dst, &next, &payload)?;
                    forwarded += 1;
                }
            }
            let mut s = self.state.lock().expect("no poisoning");
            s.received += 1;
            s.stats.frames_forwarded += forwarded;
            s.stats.frames_received += received;
            self.changed.notify_all();
        }
    }
}

/// Read the rows `rows` of copy `c` from this device's source buffers, which
/// hold the tensor's boxes `pieces` (from [`tenplan_ptc::Layout::pieces_of`]).
fn gather(
    plan: &Plan,
    source: &HostMemory,
    pieces: &[(usize, &Piece)],
    c: &Copy,
    rows: &Region,
    out: &mut Vec<u8>,
) -> Result<()> {
    let elem = plan.problem.tensors()[c.tensor as usize].dtype.size() as usize;
    out.clear();
    out.resize(rows.volume() as usize * elem, 0);
    let to = Piece {
        tensor: c.tensor,
        region: rows.clone(),
        offset: 0,
    };
    for &(bi, from) in pieces {
        if let Some(part) = from.region.intersect(rows) {
            let buf = source.buffer(c.src, bi).ok_or(Error::MissingDevice { device: c.src })?;
            copy_box(buf, from, out, &to, &part, elem);
        }
    }
    Ok(())
}

/// Run this device's part of a verified plan. `listener` is bound to this
/// device's address in the peers table; `source` holds this device's source
/// buffers (if it is a source). Returns this device's target buffers (if it
/// is a target) and what it did.
pub fn run_worker(
    verified: &Verified<'_>,
    cfg: &WorkerConfig,
    listener: TcpListener,
    source: &HostMemory,
) -> Result<(HostMemory, WorkerStats)> {
    let plan = verified.plan();
    let me = cfg.device;
    let tensors = plan.problem.tensors();
    let target_layout = plan.problem.target();
    let mut target = BTreeMap::new();
    if let Some(shard) = target_layout.shard_of(me) {
        target.insert(
            me,
            shard.buffers.iter().map(|b| vec![0u8; b.bytes() as usize]).collect(),
        );
    }
    // What will arrive: frames of every route through this device, from
    // these predecessors.
    let mut expected = 0u64;
    let mut senders: BTreeSet<DeviceId> = BTreeSet::new();
    for c in &plan.copies {
        let route = c.route();
        let count = || frames(c, tensors[c.tensor as usize].dtype.size(), cfg.frame_bytes).len() as u64;
        for h in 1..route.len() {
            if route[h] == me {
                expected += count();
                senders.insert(route[h - 1]);
            }
        }
        if c.fanout.iter().any(|w| w.dst == me) {
            expected += count();
            senders.insert(c.dst);
        }
        for &d in route[1..].iter().chain(c.fanout.iter().map(|w| &w.dst)) {
            if !cfg.peers.contains_key(&d) && d != me {
                return Err(Error::Worker {
                    device: me,
                    what: format!("device {d} is on a route but not in the peers table"),
                });
            }
        }
    }
    let shared = Shared {
        plan,
        cfg,
        target: Mutex::new(target),
        out: cfg
            .peers
            .keys()
            .filter(|&&d| d != me)
            .map(|&d| (d, Mutex::new(None)))
            .collect(),
        state: Mutex::new(Progress::default()),
        changed: Condvar::new(),
        deadline: Instant::now() + cfg.timeout,
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| shared.err(format!("listener: {e}")))?;
    std::thread::scope(|scope| {
        let sh = &shared;
        // Accept one connection from each predecessor, then stop listening.
        scope.spawn(move || {
            let mut accepted = 0;
            while accepted < senders.len() {
                match listener.accept() {
                    Ok((stream, _)) => {
                        accepted += 1;
                        let _ = stream.set_nonblocking(false);
                        scope.spawn(move || {
                            if let Err(e) = sh.read_from(stream) {
                                sh.fail(e);
                            }
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > sh.deadline || sh.state.lock().expect("no poisoning").error.is_some() {
                            sh.fail(sh.err(format!(
                                "timed out waiting for connections: {accepted} of {} peers connected",
                                senders.len()
                            )));
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        sh.fail(sh.err(format!("accepting: {e}")));
                        return;
                    }
                }
            }
        });
        // Send this device's copies, in plan order.
        let mut buf = Vec::new();
        // This device's boxes of each tensor it sends, looked up once.
        let mut held: HashMap<TensorId, Vec<(usize, &Piece)>> = HashMap::new();
        for (ci, c) in plan.copies.iter().enumerate().filter(|(_, c)| c.src == me) {
            let elem = tensors[c.tensor as usize].dtype.size();
            let route = c.route();
            let pieces = held
                .entry(c.tensor)
                .or_insert_with(|| plan.problem.source().pieces_of(me, c.tensor));
            for (lo, hi) in frames(c, elem, cfg.frame_bytes) {
                let rows = c.region.with_range(0, lo..hi);
                let sent = gather(plan, source, pieces, c, &rows, &mut buf).and_then(|()| {
                    if route.len() == 1 {
                        // Local (verified: a multicast never starts on its node).
                        for w in c.writes() {
                            sh.scatter(c, &w, &rows, &buf);
                        }
                        return Ok(false);
                    }
                    let mut header = Vec::with_capacity(HEADER);
                    header.extend_from_slice(&MAGIC.to_le_bytes());
                    header.extend_from_slice(&(ci as u32).to_le_bytes());
                    header.extend_from_slice(&1u32.to_le_bytes());
                    header.extend_from_slice(&lo.to_le_bytes());
                    header.extend_from_slice(&hi.to_le_bytes());
                    header.extend_from_slice(&(buf.len() as u64).to_le_bytes());
                    sh.send(route[1], &header, &buf).map(|()| true)
                });
                let mut s = sh.state.lock().expect("no poisoning");
                match sent {
                    Ok(true) => {
                        s.stats.frames_sent += 1;
                        s.stats.bytes_sent += buf.len() as u64;
                    }
                    Ok(false) => s.stats.bytes_local += buf.len() as u64,
                    Err(e) => {
                        if s.error.is_none() {
                            s.error = Some(e);
                        }
                    }
                }
                if s.error.is_some() {
                    break;
                }
            }
        }
        // Wait for every inbound frame, an error, or the deadline.
        let mut s = sh.state.lock().expect("no poisoning");
        while s.received < expected && s.error.is_none() {
            let left = sh.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.error = Some(sh.err(format!(
                    "timed out after {:?}: {} of {expected} frames arrived",
                    cfg.timeout, s.received
                )));
                break;
            }
            s = sh.changed.wait_timeout(s, left).expect("no poisoning").0;
        }
        drop(s);
        // Closing our connections lets the peers' readers finish.
        for slot in sh.out.values() {
            if let Some(stream) = slot.lock().expect("no poisoning").take() {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        }
    });
    let progress = shared.state.into_inner().expect("no poisoning");
    if let Some(e) = progress.error {
        return Err(e);
    }
    let target = shared.target.into_inner().expect("no poisoning");
    Ok((HostMemory::from_buffers(target_layout, target)?, progress.stats))
}

/// Write one device's buffers as a safetensors file (one 1-D entry per
/// buffer, keyed by its name), atomically.
pub fn write_device_buffers(
    path: &std::path::Path,
    memory: &HostMemory,
    layout: &tenplan_ptc::Layout,
    device: DeviceId,
) -> Result<()> {
    let shard = layout.shard_of(device).ok_or(Error::MissingDevice { device })?;
    let mut views = Vec::new();
    for (i, b) in shard.buffers.iter().enumerate() {
        let data = memory.buffer(device, i).ok_or(Error::MissingDevice { device })?;
        let view =
            safetensors::tensor::TensorView::new(crate::checkpoint::st_dtype(b.dtype), vec![b.len as usize], data)
                .map_err(|e| Error::file(path, format!("buffer `{}`: {e}", b.name)))?;
        views.push((b.name.clone(), view));
    }
    let bytes = safetensors::serialize(views, None).map_err(|e| Error::file(path, e.to_string()))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::file(path, "not a file name"))?;
    crate::checkpoint::write_atomic(dir, name, &bytes)
}
