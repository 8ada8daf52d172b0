//! The in-process reference store: **atomic within one process only**.
//!
//! [`SingleProcessMemoryBackend`] keeps every namespace in a map behind one
//! mutex. The three primitives are exactly atomic, but only for callers that
//! share the same instance in the same process. Two processes (or two
//! instances) each have their own map: used as a "distributed" store it
//! silently dedupes nothing. It exists as the floor under the adapters'
//! contract suites and as the shape to copy when writing a real store.
//!
//! ```
//! use coord_backend::{Assert, Backend, Mutation};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! # tokio_test();
//! # fn tokio_test() {
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # rt.block_on(async {
//! let store = SingleProcessMemoryBackend::new("demo").unwrap();
//! let out = store
//!     .txn(&[Assert::missing("k")], &[Mutation::put("k", b"v".to_vec())])
//!     .await
//!     .unwrap();
//! assert!(out.applied);
//! # });
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, validate_prefix, Assert, Backend, ChangeFeed, ChangeWatch, Changed,
    Changes, Entry, Limits, Mutation, Result, TxnOutcome, Version,
};

/// One key's cell: its version counter survives deletes (tombstone = `value: None`).
#[derive(Clone, Default)]
struct Cell {
    version: u64,
    value: Option<Vec<u8>>,
}

type Namespace = BTreeMap<String, Cell>;

/// One store: its cells, and the feed its commits notify (under the same lock).
#[derive(Default)]
struct Shared {
    cells: Mutex<Namespace>,
    feed: ChangeFeed,
}

/// Process-wide shared stores for [`SingleProcessMemoryBackend::shared`], one per name.
fn registry() -> &'static Mutex<HashMap<String, Arc<Shared>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Shared>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The in-process reference backend. Its atomicity comes from a mutex in this
/// process: **never use it to coordinate two processes.**
///
/// `Debug` shows the namespace and the number of keys, never their values.
///
/// It offers change notifications ([`Backend::changes`]): every applied txn
/// publishes its written keys to the watches of the same store while it
/// still holds the store's lock, so a watch never misses a commit.
#[derive(Clone)]
pub struct SingleProcessMemoryBackend {
    namespace: String,
    shared: Arc<Shared>,
    limits: Limits,
}

impl std::fmt::Debug for SingleProcessMemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SingleProcessMemoryBackend")
            .field("namespace", &self.namespace)
            // try_lock: formatting must never wait on (or deadlock with) a txn.
            .field(
                "keys",
                &self.shared.cells.try_lock().map(|cells| cells.len()).ok(),
            )
            .field("limits", &self.limits)
            .finish()
    }
}

impl SingleProcessMemoryBackend {
    /// A fresh, empty store for `namespace`.
    pub fn new(namespace: &str) -> Result<Self> {
        validate_namespace(namespace)?;
        Ok(SingleProcessMemoryBackend {
            namespace: namespace.to_owned(),
            shared: Arc::default(),
            limits: Limits::DEFAULT,
        })
    }

    /// The store `memory://?namespace=NAME` names: every call with the same
    /// namespace in this process returns a handle on the same map.
    pub fn shared(namespace: &str) -> Result<Self> {
        validate_namespace(namespace)?;
        let mut registry = registry().lock().unwrap_or_else(|e| e.into_inner());
        let shared = registry.entry(namespace.to_owned()).or_default().clone();
        Ok(SingleProcessMemoryBackend {
            namespace: namespace.to_owned(),
            shared,
            limits: Limits::DEFAULT,
        })
    }

    /// The same store with other limits (tests of large values).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Namespace> {
        // A panic while holding the lock cannot leave a half-applied txn:
        // mutations are applied only after every check passed, without panicking paths.
        self.shared.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many change watches of this store are alive (dropping a watch
    /// ends it; this shows that it did).
    pub fn watchers(&self) -> usize {
        self.shared.feed.watchers()
    }
}

fn entry_of(cells: &Namespace, key: &str) -> Entry {
    match cells.get(key) {
        Some(Cell {
            version,
            value: Some(value),
        }) => Entry::present(key, Version(*version), value.clone()),
        _ => Entry::missing(key),
    }
}

fn current_version(cells: &Namespace, key: &str) -> Version {
    match cells.get(key) {
        Some(Cell {
            version,
            value: Some(_),
        }) => Version(*version),
        _ => Version::MISSING,
    }
}

#[async_trait]
impl Backend for SingleProcessMemoryBackend {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        let cells = self.lock();
        Ok(keys.iter().map(|k| entry_of(&cells, k)).collect())
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let mut cells = self.lock();
        if asserts
            .iter()
            .any(|a| current_version(&cells, &a.key) != a.version)
        {
            let current = coord_backend::distinct_keys(asserts.iter().map(|a| a.key.as_str()))
                .into_iter()
                .map(|k| entry_of(&cells, k))
                .collect();
            return Ok(TxnOutcome::rejected(current));
        }
        for mutation in mutations {
            let cell = cells.entry(mutation.key().to_owned()).or_default();
            cell.version += 1;
            cell.value = match mutation {
                Mutation::Put { value, .. } => Some(value.clone()),
                Mutation::Delete { .. } => None,
            };
        }
        if !mutations.is_empty() {
            // Still under the lock: a watch that began before this commit hears of it.
            let written: Arc<[String]> = mutations.iter().map(|m| m.key().to_owned()).collect();
            self.shared.feed.publish(Changed::Keys(written));
        }
        drop(cells);
        Ok(TxnOutcome::applied())
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let cells = self.lock();
        Ok(cells
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, c)| c.value.is_some())
            .map(|(k, _)| k.clone())
            .collect())
    }
}

#[async_trait]
impl Changes for SingleProcessMemoryBackend {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        validate_prefix(prefix, &self.limits)?;
        Ok(self.shared.feed.watch(prefix))
    }
}
