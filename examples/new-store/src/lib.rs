//! The example store of docs/new-store.md: one `BTreeMap` behind a mutex,
//! shared by every client made from the same [`BTreeServer`]. Atomic within
//! one process only: it shows the shape of a store, it is not one to deploy.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, Assert, Backend, Entry, Mutation, ReclaimOptions, Reclaimed, Result,
    TxnOutcome, Version,
};

/// One cell: its version counter (kept after a delete, so a version is never
/// handed out twice for a key) and its value (`None`: deleted).
#[derive(Clone, Debug, Default)]
struct Cell {
    version: u64,
    value: Option<Vec<u8>>,
}

/// What the server holds: every namespace's cells, keyed by `(namespace,
/// key)`, and each namespace's floor (where a key without a cell starts
/// counting; raised by `reclaim`).
#[derive(Debug, Default)]
struct Data {
    cells: BTreeMap<(String, String), Cell>,
    floors: HashMap<String, u64>,
}

/// The "server": its `Data` behind a mutex.
#[derive(Clone, Debug, Default)]
pub struct BTreeServer {
    data: Arc<Mutex<Data>>,
}

impl BTreeServer {
    /// An empty server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client of this server in `namespace`.
    pub fn client(&self, namespace: &str) -> Result<BTreeStore> {
        validate_namespace(namespace)?;
        Ok(BTreeStore {
            server: self.clone(),
            namespace: namespace.to_owned(),
        })
    }
}

/// A client of a [`BTreeServer`] in one namespace.
#[derive(Clone, Debug)]
pub struct BTreeStore {
    server: BTreeServer,
    namespace: String,
}

impl BTreeStore {
    fn lock(&self) -> MutexGuard<'_, Data> {
        // A panic while holding the lock cannot leave a half-applied txn:
        // every txn checks all asserts before writing anything.
        self.server.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, data: &Data, key: &str) -> Entry {
        match data.cells.get(&(self.namespace.clone(), key.to_owned())) {
            Some(Cell {
                version,
                value: Some(value),
            }) => Entry::present(key, Version(*version), value.clone()),
            // Never written, or deleted: missing.
            _ => Entry::missing(key),
        }
    }

    fn version(&self, data: &Data, key: &str) -> Version {
        self.entry(data, key).version
    }
}

/// The three primitives. Input arrives checked: the provided `snapshot`,
/// `txn` and `keys` of [`Backend`] validate it against `limits()` first.
#[async_trait]
impl Backend for BTreeStore {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    /// One consistent read: every key under the same lock.
    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        let data = self.lock();
        Ok(keys.iter().map(|k| self.entry(&data, k)).collect())
    }

    /// Check every assert, then write every mutation, under one lock.
    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let mut data = self.lock();
        if asserts
            .iter()
            .any(|a| self.version(&data, &a.key) != a.version)
        {
            // The current entries of the asserted keys, once each, in assert order.
            let mut current: Vec<Entry> = Vec::new();
            for a in asserts {
                if !current.iter().any(|e| e.key == a.key) {
                    current.push(self.entry(&data, &a.key));
                }
            }
            return Ok(TxnOutcome::rejected(current));
        }
        let floor = data.floors.get(&self.namespace).copied().unwrap_or(0);
        for mutation in mutations {
            // A key without a cell (never written, or reclaimed) starts above the floor.
            let cell = data
                .cells
                .entry((self.namespace.clone(), mutation.key().to_owned()))
                .or_insert(Cell {
                    version: floor,
                    value: None,
                });
            cell.version += 1;
            cell.value = match mutation {
                Mutation::Put { value, .. } => Some(value.clone()),
                Mutation::Delete { .. } => None,
            };
        }
        Ok(TxnOutcome::applied())
    }

    /// The live keys under `prefix`, in byte order (a `BTreeMap` range).
    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let data = self.lock();
        let start = (self.namespace.clone(), prefix.to_owned());
        Ok(data
            .cells
            .range(start..)
            .take_while(|((ns, key), _)| *ns == self.namespace && key.starts_with(prefix))
            .filter(|(_, cell)| cell.value.is_some())
            .map(|((_, key), _)| key.clone())
            .collect())
    }

    /// Maintenance (optional, but every store of the project has it):
    /// remove up to `max_tombstones` deleted cells and, under the same
    /// lock, raise the namespace's floor to their highest version, so a key
    /// created again still starts above every version it had. (This store
    /// walks its namespace to find them; a real one keeps them findable
    /// without reading live keys.)
    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        let mut data = self.lock();
        let start = (self.namespace.clone(), String::new());
        let tombstones: Vec<(String, String)> = data
            .cells
            .range(start..)
            .take_while(|((ns, _), _)| *ns == self.namespace)
            .filter(|(_, cell)| cell.value.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        let take = options.max_tombstones.min(tombstones.len());
        let mut highest = 0;
        for key in &tombstones[..take] {
            if let Some(cell) = data.cells.remove(key) {
                highest = highest.max(cell.version);
            }
        }
        let floor = data.floors.entry(self.namespace.clone()).or_default();
        *floor = (*floor).max(highest);
        Ok(Reclaimed::new(take as u64, take < tombstones.len()))
    }
}
