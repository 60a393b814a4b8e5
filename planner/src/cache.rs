//! Plans by question, shared by the threads of a training loop: hot
//! switches ([`crate::switch::SwitchCache`]) and weight syncs
//! ([`crate::sync::SyncCache`]) are planned once and fetched after.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, RwLock};

use crate::Result;

/// Values (plans and their reports) by key, each computed once.
pub struct PlanCache<K, V> {
    plans: RwLock<HashMap<K, Arc<V>>>,
}

impl<K, V> Default for PlanCache<K, V> {
    fn default() -> Self {
        PlanCache {
            plans: RwLock::new(HashMap::new()),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for PlanCache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanCache").field("plans", &self.plans).finish()
    }
}

impl<K: Hash + Eq + Clone, V> PlanCache<K, V> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value computed before for `key`, if any.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        self.plans.read().expect("no poisoning").get(key).cloned()
    }

    /// The cached value, or compute it with `make` now and remember it (a
    /// value another thread stored meanwhile wins).
    pub fn get_or_insert_with(&self, key: &K, make: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        let v = Arc::new(make()?);
        Ok(self
            .plans
            .write()
            .expect("no poisoning")
            .entry(key.clone())
            .or_insert(v)
            .clone())
    }

    /// Number of cached values.
    pub fn len(&self) -> usize {
        self.plans.read().expect("no poisoning").len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
