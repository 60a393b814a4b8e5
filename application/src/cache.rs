//! Answers by question, shared by the threads of a training loop or a
//! scheduler: a question asked again (the same weight sync every step, the
//! same switch, the same price) is answered without planning.
//!
//! Keys are the typed requests themselves, in canonical form (parsed
//! layouts, clusters and planner specs, so two spellings of one question
//! are one key): hashing reads their cheap fields, equality compares them
//! whole (two clusters that share a name never share a plan). The cache
//! holds at most a number of entries and of bytes (each value says what it
//! weighs); past either, the least recently used answers are evicted.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::Result;

/// What a cached value costs to keep, in bytes (roughly: its plan's copies).
pub trait Weigh {
    /// Bytes the value holds.
    fn weight(&self) -> u64;
}

/// Values by key, each computed once, least recently used evicted first.
pub struct PlanCache<K, V> {
    entries: RwLock<HashMap<K, Entry<V>>>,
    /// Ticks on every use: an entry's last use orders eviction.
    clock: AtomicU64,
    max_entries: usize,
    max_bytes: u64,
}

struct Entry<V> {
    value: Arc<V>,
    last_used: AtomicU64,
    bytes: u64,
}

/// Entries a cache keeps by default.
pub const DEFAULT_MAX_ENTRIES: usize = 1024;
/// Bytes a cache keeps by default (4 GiB: a few of the largest syncs'
/// plans, thousands of ordinary ones).
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

impl<K, V> fmt::Debug for PlanCache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries = self.entries.read().map_or(0, |e| e.len());
        f.debug_struct("PlanCache")
            .field("entries", &entries)
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl<K: Hash + Eq + Clone, V: Weigh> Default for PlanCache<K, V> {
    fn default() -> Self {
        PlanCache::with_limits(DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    }
}

impl<K: Hash + Eq + Clone, V: Weigh> PlanCache<K, V> {
    /// An empty cache with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache keeping at most `max_entries` values and `max_bytes`
    /// bytes of them (the last value inserted is kept whatever it weighs).
    pub fn with_limits(max_entries: usize, max_bytes: u64) -> Self {
        PlanCache {
            entries: RwLock::new(HashMap::new()),
            clock: AtomicU64::new(0),
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    /// The value computed before for `key`, if any.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        let entries = self.entries.read().expect("no poisoning");
        let e = entries.get(key)?;
        e.last_used
            .store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Some(e.value.clone())
    }

    /// The cached value, or compute it with `make` now and remember it (a
    /// value another thread stored meanwhile wins).
    pub fn get_or_insert_with(&self, key: &K, make: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let value = Arc::new(make()?);
        let mut entries = self.entries.write().expect("no poisoning");
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let kept = entries
            .entry(key.clone())
            .or_insert_with(|| Entry {
                bytes: value.weight(),
                value,
                last_used: AtomicU64::new(now),
            })
            .value
            .clone();
        Self::evict(&mut entries, key, self.max_entries, self.max_bytes);
        Ok(kept)
    }

    /// Evict the least recently used entries other than `keep` until the
    /// limits hold.
    fn evict(entries: &mut HashMap<K, Entry<V>>, keep: &K, max_entries: usize, max_bytes: u64) {
        let mut bytes: u64 = entries.values().map(|e| e.bytes).sum();
        while entries.len() > max_entries || (bytes > max_bytes && entries.len() > 1) {
            let Some(oldest) = entries
                .iter()
                .filter(|(k, _)| *k != keep)
                .min_by_key(|(_, e)| e.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            if let Some(e) = entries.remove(&oldest) {
                bytes -= e.bytes;
            }
        }
    }

    /// Number of cached values.
    pub fn len(&self) -> usize {
        self.entries.read().expect("no poisoning").len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the cached values hold.
    pub fn bytes(&self) -> u64 {
        self.entries
            .read()
            .expect("no poisoning")
            .values()
            .map(|e| e.bytes)
            .sum()
    }

    /// Median time of a lookup of `key` (a hit where it is cached), in
    /// nanoseconds, over 100 rounds of 1,000 lookups: what a training loop
    /// pays to fetch a plan it asked for before.
    pub fn median_lookup_ns(&self, key: &K) -> f64 {
        let mut samples = Vec::with_capacity(100);
        for _ in 0..100 {
            let t = std::time::Instant::now();
            for _ in 0..1000 {
                std::hint::black_box(self.get(std::hint::black_box(key)));
            }
            samples.push(t.elapsed().as_secs_f64() * 1e9 / 1000.0);
        }
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2]
    }

    /// Forget every value.
    pub fn clear(&self) {
        self.entries.write().expect("no poisoning").clear();
    }
}

impl Weigh for tenplan_ptc::Plan {
    fn weight(&self) -> u64 {
        (self.copies.len() * std::mem::size_of::<tenplan_ptc::BoxCopy>()
            + self.fills.len() * std::mem::size_of::<tenplan_ptc::Fill>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Weighs(u64);

    impl Weigh for Weighs {
        fn weight(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_question_is_answered_once() {
        let cache: PlanCache<u32, Weighs> = PlanCache::new();
        let mut made = 0;
        for _ in 0..3 {
            cache
                .get_or_insert_with(&7, || {
                    made += 1;
                    Ok(Weighs(1))
                })
                .unwrap();
        }
        assert_eq!((made, cache.len()), (1, 1));
    }

    #[test]
    fn the_least_recently_used_answer_goes_first() {
        let cache: PlanCache<u32, Weighs> = PlanCache::with_limits(3, u64::MAX);
        for k in 0..3 {
            cache.get_or_insert_with(&k, || Ok(Weighs(1))).unwrap();
        }
        // 0 used again: 1 is now the oldest.
        assert!(cache.get(&0).is_some());
        cache.get_or_insert_with(&3, || Ok(Weighs(1))).unwrap();
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&1).is_none());
        for k in [0, 2, 3] {
            assert!(cache.get(&k).is_some(), "{k}");
        }
    }

    #[test]
    fn bytes_are_limited_too_but_the_newest_answer_stays() {
        let cache: PlanCache<u32, Weighs> = PlanCache::with_limits(100, 10);
        cache.get_or_insert_with(&0, || Ok(Weighs(4))).unwrap();
        cache.get_or_insert_with(&1, || Ok(Weighs(4))).unwrap();
        assert_eq!(cache.bytes(), 8);
        cache.get_or_insert_with(&2, || Ok(Weighs(4))).unwrap();
        assert_eq!((cache.len(), cache.bytes()), (2, 8));
        assert!(cache.get(&0).is_none());
        cache.get_or_insert_with(&3, || Ok(Weighs(50))).unwrap();
        assert_eq!(cache.len(), 1);
        assert!(cache.get(&3).is_some());
    }

    #[test]
    fn a_failure_is_not_remembered() {
        let cache: PlanCache<u32, Weighs> = PlanCache::new();
        assert!(cache
            .get_or_insert_with(&1, || Err(crate::Error::request("no")))
            .is_err());
        assert!(cache.is_empty());
    }
}
