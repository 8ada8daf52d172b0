//! The example store of docs/new-store.md: one `BTreeMap` behind a mutex,
//! shared by every client made from the same [`BTreeServer`]. Atomic within
//! one process only: it shows the shape of a store, it is not one to deploy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, Assert, Backend, Entry, Mutation, Result, TxnOutcome, Version,
};

/// One cell: its version counter (kept after a delete, so a version is never
/// handed out twice for a key) and its value (`None`: deleted).
#[derive(Clone, Debug, Default)]
struct Cell {
    version: u64,
    value: Option<Vec<u8>>,
}

/// The "server": every namespace's cells, keyed by `(namespace, key)`.
#[derive(Clone, Debug, Default)]
pub struct BTreeServer {
    cells: Arc<Mutex<BTreeMap<(String, String), Cell>>>,
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
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Cell>> {
        // A panic while holding the lock cannot leave a half-applied txn:
        // every txn checks all asserts before writing anything.
        self.server.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, cells: &BTreeMap<(String, String), Cell>, key: &str) -> Entry {
        match cells.get(&(self.namespace.clone(), key.to_owned())) {
            Some(Cell {
                version,
                value: Some(value),
            }) => Entry::present(key, Version(*version), value.clone()),
            // Never written, or deleted: missing.
            _ => Entry::missing(key),
        }
    }

    fn version(&self, cells: &BTreeMap<(String, String), Cell>, key: &str) -> Version {
        self.entry(cells, key).version
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
        let cells = self.lock();
        Ok(keys.iter().map(|k| self.entry(&cells, k)).collect())
    }

    /// Check every assert, then write every mutation, under one lock.
    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let mut cells = self.lock();
        if asserts
            .iter()
            .any(|a| self.version(&cells, &a.key) != a.version)
        {
            // The current entries of the asserted keys, once each, in assert order.
            let mut current: Vec<Entry> = Vec::new();
            for a in asserts {
                if !current.iter().any(|e| e.key == a.key) {
                    current.push(self.entry(&cells, &a.key));
                }
            }
            return Ok(TxnOutcome::rejected(current));
        }
        for mutation in mutations {
            let cell = cells
                .entry((self.namespace.clone(), mutation.key().to_owned()))
                .or_default();
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
        let cells = self.lock();
        let start = (self.namespace.clone(), prefix.to_owned());
        Ok(cells
            .range(start..)
            .take_while(|((ns, key), _)| *ns == self.namespace && key.starts_with(prefix))
            .filter(|(_, cell)| cell.value.is_some())
            .map(|((_, key), _)| key.clone())
            .collect())
    }
}
