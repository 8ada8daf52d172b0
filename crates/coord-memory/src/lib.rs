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
    Changes, Entry, Limits, Mutation, ReclaimOptions, Reclaimed, Result, TxnOutcome, Version,
};

/// A live key: its version and value.
#[derive(Clone)]
struct Cell {
    version: u64,
    value: Vec<u8>,
}

/// One namespace. Live keys and tombstones (the counters of deleted keys)
/// are kept apart, so a listing reads only live keys and a reclaim finds
/// tombstones without reading them; `floor` is where a key without any
/// record starts counting (see `coord_backend::reclaim`).
#[derive(Default)]
struct Namespace {
    live: BTreeMap<String, Cell>,
    tombstones: BTreeMap<String, u64>,
    floor: u64,
}

impl Namespace {
    /// The counter a write of `key` moves on from.
    fn counter(&self, key: &str) -> u64 {
        match (self.live.get(key), self.tombstones.get(key)) {
            (Some(cell), _) => cell.version,
            (None, Some(version)) => *version,
            (None, None) => self.floor,
        }
    }

    fn len(&self) -> usize {
        self.live.len() + self.tombstones.len()
    }
}

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
    match cells.live.get(key) {
        Some(cell) => Entry::present(key, Version(cell.version), cell.value.clone()),
        None => Entry::missing(key),
    }
}

fn current_version(cells: &Namespace, key: &str) -> Version {
    cells
        .live
        .get(key)
        .map_or(Version::MISSING, |cell| Version(cell.version))
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
        let mut written = Vec::new();
        for mutation in mutations {
            let key = mutation.key();
            let version = cells.counter(key) + 1;
            match mutation {
                Mutation::Put { value, .. } => {
                    written.push((key.to_owned(), Version(version)));
                    cells.tombstones.remove(key);
                    let cell = Cell {
                        version,
                        value: value.clone(),
                    };
                    cells.live.insert(key.to_owned(), cell);
                }
                Mutation::Delete { .. } => {
                    cells.live.remove(key);
                    cells.tombstones.insert(key.to_owned(), version);
                }
            }
        }
        if !mutations.is_empty() {
            // Still under the lock: a watch that began before this commit hears of it.
            let written: Arc<[String]> = mutations.iter().map(|m| m.key().to_owned()).collect();
            self.shared.feed.publish(Changed::Keys(written));
        }
        drop(cells);
        Ok(TxnOutcome::applied_at(written))
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let cells = self.lock();
        Ok(cells
            .live
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect())
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let cells = self.lock();
        Ok(cells
            .live
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect())
    }

    /// Under the store's one lock: the first tombstones (in key order) go,
    /// and the floor rises past their counters in the same step.
    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        let mut cells = self.lock();
        let take = options.max_tombstones.max(1);
        let gone: Vec<String> = cells.tombstones.keys().take(take).cloned().collect();
        for key in &gone {
            if let Some(version) = cells.tombstones.remove(key) {
                cells.floor = cells.floor.max(version);
            }
        }
        Ok(Reclaimed::new(
            gone.len() as u64,
            !cells.tombstones.is_empty(),
        ))
    }
}

#[async_trait]
impl Changes for SingleProcessMemoryBackend {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        validate_prefix(prefix, &self.limits)?;
        Ok(self.shared.feed.watch(prefix))
    }
}
