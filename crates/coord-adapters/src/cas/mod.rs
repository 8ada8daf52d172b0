//! The CAS engine: snapshot → decide → txn asserting every key read → on
//! rejection decide again from the returned entries.
//!
//! The window between reading and writing is not wished away: the txn
//! asserts the version of every key in the [`View`] the decision saw, so a
//! decision only commits if nothing it read changed. A rejected txn returns
//! the current entries, so the next decision costs no extra read.
//!
//! **One round trip when uncontended.** The engine remembers the last entry
//! it saw for each key (a bounded cache). A decision over keys it has seen
//! starts from the cache; keys it has never seen are assumed missing. The
//! txn's asserts verify the guess: a wrong guess is just a rejected txn that
//! returns the truth. Decisions that write nothing are confirmed by an
//! assert-only txn unless they came from one consistent read made in the
//! same call, so a stale cache never becomes an answer.
//!
//! **Indeterminate txns** (sent, answer lost) are never guessed. A txn whose
//! answer is lost may have applied, or may still apply *later*: a server
//! finishes a transaction after its client is gone, a proposal already in a
//! consensus log commits after the client gave up. So "every asserted key is
//! still at its asserted version" proves nothing. The engine settles the
//! doubt by sending the *same* txn again (same asserts, same bytes): both
//! assert the same versions and both write an asserted key, so at most one of
//! the two can ever apply. Then:
//!
//! - the resend applies: the original never will; the decision's answer holds;
//! - the resend is rejected and every put of the txn is in the store
//!   byte-for-byte (and the store does not mark the rejection
//!   [`unconfirmed`](coord_backend::TxnOutcome::unconfirmed): a store asked
//!   to confirm replication that could not is [`Error::Indeterminate`]
//!   here): one of the two applied, the answer holds (this is the
//!   caller recognising its own token: every adapter puts a freshly minted
//!   token in at least one value of every commit, so nobody else writes those
//!   bytes);
//! - the resend is rejected and the puts are not there: the asserted versions
//!   moved on, so the original can no longer apply, but whether it applied
//!   before being overwritten is unknown: [`Error::Indeterminate`];
//! - the resend's own answer is lost again: back off and resend, at most
//!   [`CasOptions::max_attempts`] times, then [`Error::Indeterminate`].
//!
//! "At most one of the two can apply" holds only while the state the txn
//! asserts cannot come back. Versions never do (stores never reuse one,
//! reclaim included), but "missing" does once the key is deleted: a
//! decision that creates a record which something later deletes (retention
//! pruning a completed task) must also assert a key that only moves
//! forward and that every such delete writes (the retention index's
//! removal counter, see [`crate::retention`]), or a copy held back in the
//! server could create the record again after its deletion.
//!
//! **Refusals** are a decision's errors (`?` on a read, `return Err(..)`):
//! answers like [`Decision::Return`], so a refusal decided on remembered
//! entries is confirmed the same way before it is returned. Adapters build
//! their records with [`Record`] and [`RecordSpace`] (see [`record`] and
//! [`space`]).
//!
//! A decision that writes nothing is confirmed by an assert-only txn; when
//! that confirmation fails, nothing was written either way, so the engine
//! reads a fresh snapshot and decides again instead of reporting a doubt.
//!
//! Every store call of the engine is bounded by [`CasOptions::call_timeout`]:
//! a txn that does not answer in time is indeterminate (a hung write may
//! still apply), a read that does not answer is unavailable.
//!
//! **Bounded.** After [`CasOptions::max_attempts`] rejected txns the engine
//! gives up with [`Error::ConflictRetriesExhausted`]; rejections after the
//! first are followed by a jittered exponential backoff.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_backend::{Assert, Backend, Entry, Error, InvalidInput, Mutation, TxnOutcome, Version};

pub mod record;
pub mod space;
pub(crate) use record::record_kind;
pub use record::{whole_millis, LeaseRecord, Nonce, Record};
pub(crate) use space::record_options;
pub use space::RecordSpace;
pub(crate) use space::Verdict;

/// Tuning of a [`CasEngine`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CasOptions {
    /// Txns tried before giving up with [`Error::ConflictRetriesExhausted`].
    pub max_attempts: u32,
    /// First backoff after a second rejection; doubles up to `max_backoff`.
    pub base_backoff: Duration,
    /// Longest backoff between attempts.
    pub max_backoff: Duration,
    /// Start decisions from remembered entries (and "missing" for unseen keys)
    /// instead of a snapshot: one round trip when the guess is right, two when wrong.
    pub optimistic: bool,
    /// How many recently used keys the engine remembers (older ones are
    /// forgotten first; memory holds at most twice this many entries).
    pub cache_capacity: usize,
    /// Longest wait for one store call (`None` = wait as long as the store
    /// client does). A txn that does not answer in time is indeterminate.
    pub call_timeout: Option<Duration>,
}

impl Default for CasOptions {
    fn default() -> Self {
        CasOptions {
            max_attempts: 64,
            base_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(50),
            optimistic: true,
            cache_capacity: 10_000,
            call_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// What a decision returns to the engine.
#[derive(Debug)]
pub enum Decision<T> {
    /// Answer without writing anything.
    Return(T),
    /// Apply `mutations` (every written key must be in the view), then answer `then`.
    Commit {
        /// The writes; at least one put must carry a freshly minted token.
        mutations: Vec<Mutation>,
        /// The answer once the txn applied.
        then: T,
    },
    /// [`Decision::Commit`] plus writes of keys outside the view, sent
    /// without asserts. Only for writes that are right whatever the key
    /// holds: the removal of an auxiliary record whose owner asserts it
    /// before each of its own writes (so no late write brings it back), or
    /// the creation of a key that is fresh by construction (named by a
    /// number the same txn allocates from an asserted counter). The
    /// decision still rests on the asserted keys of the view.
    CommitWithUnasserted {
        /// The writes of keys in the view, as for `Commit`.
        mutations: Vec<Mutation>,
        /// Writes of keys outside the view (keys in the view are ignored here).
        unasserted: Vec<Mutation>,
        /// The answer once the txn applied.
        then: T,
    },
    /// The decision needs more keys (e.g. task dependencies): add them and decide again.
    Expand(Vec<String>),
}

impl<T> Decision<T> {
    /// The same decision with `more` writes of keys outside the view (see
    /// [`Decision::CommitWithUnasserted`]), if it commits.
    pub fn with_unasserted(self, more: Vec<Mutation>) -> Decision<T> {
        if more.is_empty() {
            return self;
        }
        match self {
            Decision::Commit { mutations, then } => Decision::CommitWithUnasserted {
                mutations,
                unasserted: more,
                then,
            },
            Decision::CommitWithUnasserted {
                mutations,
                mut unasserted,
                then,
            } => {
                unasserted.extend(more);
                Decision::CommitWithUnasserted {
                    mutations,
                    unasserted,
                    then,
                }
            }
            other => other,
        }
    }

    /// The same decision with its answer mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Decision<U> {
        match self {
            Decision::Return(answer) => Decision::Return(f(answer)),
            Decision::Commit { mutations, then } => Decision::Commit {
                mutations,
                then: f(then),
            },
            Decision::CommitWithUnasserted {
                mutations,
                unasserted,
                then,
            } => Decision::CommitWithUnasserted {
                mutations,
                unasserted,
                then: f(then),
            },
            Decision::Expand(keys) => Decision::Expand(keys),
        }
    }

    /// Write `mutations`, then answer `then` (a [`Decision::Commit`]).
    pub fn commit(mutations: Vec<Mutation>, then: T) -> Self {
        Decision::Commit { mutations, then }
    }
}

/// The keys a decision sees, as of one read (or a best guess the txn will verify).
#[derive(Clone, Debug, Default)]
pub struct View {
    entries: BTreeMap<String, Entry>,
}

impl View {
    /// The entry of `key`; missing when the key was not part of the view.
    pub fn entry(&self, key: &str) -> Entry {
        self.entries
            .get(key)
            .cloned()
            .unwrap_or_else(|| Entry::missing(key))
    }

    /// The value of `key`, if it exists.
    pub fn value(&self, key: &str) -> Option<&[u8]> {
        self.entries.get(key).and_then(|e| e.value.as_deref())
    }

    /// The version of `key` ([`Version::MISSING`] when it does not exist).
    pub fn version(&self, key: &str) -> Version {
        self.entries
            .get(key)
            .map(|e| e.version)
            .unwrap_or(Version::MISSING)
    }

    /// Whether `key` is part of the view.
    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// The keys of the view.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    fn asserts(&self) -> Vec<Assert> {
        self.entries
            .values()
            .map(|e| Assert::at(e.key.clone(), e.version))
            .collect()
    }
}

/// Counters of one engine, for benchmarks and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CasStats {
    /// Snapshots sent.
    pub snapshots: u64,
    /// Txns sent (applied or rejected).
    pub txns: u64,
    /// Txns rejected because an assert did not hold.
    pub rejections: u64,
}

impl CasStats {
    /// Store calls made (snapshots + txns): each is one round trip on a networked store.
    pub fn round_trips(&self) -> u64 {
        self.snapshots + self.txns
    }
}

#[derive(Debug, Default)]
struct Counters {
    snapshots: AtomicU64,
    txns: AtomicU64,
    rejections: AtomicU64,
}

/// The CAS loop every adapter decides through. Cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct CasEngine {
    backend: Arc<dyn Backend>,
    options: CasOptions,
    cache: Arc<Mutex<EntryCache>>,
    counters: Arc<Counters>,
}

impl CasEngine {
    /// An engine over `backend` with default options.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, CasOptions::default())
    }

    /// An engine over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: CasOptions) -> Self {
        crate::telemetry::register_cas(backend.store_name());
        CasEngine {
            backend,
            options,
            cache: Arc::default(),
            counters: Arc::default(),
        }
    }

    /// The backend this engine writes to.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The backend's store name (`Backend::store_name`): the `store` field
    /// of every adapter span and metric.
    pub fn store_name(&self) -> &'static str {
        self.backend.store_name()
    }

    /// Counters since creation.
    pub fn stats(&self) -> CasStats {
        CasStats {
            snapshots: self.counters.snapshots.load(Ordering::Relaxed),
            txns: self.counters.txns.load(Ordering::Relaxed),
            rejections: self.counters.rejections.load(Ordering::Relaxed),
        }
    }

    /// A consistent snapshot of `keys` (counted, and remembered in the cache).
    pub async fn snapshot(&self, keys: &[String]) -> Result<Vec<Entry>, Error> {
        self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
        let read = self.backend.snapshot(keys);
        let entries = match self.options.call_timeout {
            None => read.await?,
            Some(limit) => tokio::time::timeout(limit, read)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Unavailable {
                        message: format!("no answer to a snapshot within {limit:?}"),
                        source: None,
                    })
                })?,
        };
        self.remember(&entries);
        Ok(entries)
    }

    /// Run one decision to completion.
    ///
    /// `decide` is called with a view of `keys` (plus any keys it asked for
    /// with [`Decision::Expand`]) and may be called several times: it must
    /// be a pure function of the view (and of values it captured, such as
    /// the time and a minted token).
    ///
    /// An error of `decide` is a **refusal**: an answer like
    /// [`Decision::Return`], so it is confirmed against the store before it
    /// is returned unless the view was one consistent read (a remembered
    /// record may be stale; a refusal decided on it is decided again on the
    /// truth). A decision refuses with `?` or `return Err(..)`.
    pub async fn decide<T, E, F>(&self, keys: &[String], mut decide: F) -> Result<T, E>
    where
        F: FnMut(&View) -> Result<Decision<T>, E>,
        E: From<Error>,
    {
        let mut view = View::default();
        // Whether `view` is exactly one consistent read of every key in it.
        let mut consistent = false;
        if self.options.optimistic {
            self.fill_from_cache(&mut view, keys);
        } else {
            self.read_into(&mut view, keys).await?;
            consistent = true;
        }
        let mut rejections = 0u32;
        let mut expansions = 0u32;
        loop {
            let decided = match decide(&view) {
                Ok(decision) => decision.map(Ok),
                Err(refusal) => Decision::Return(Err(refusal)),
            };
            let (decision, unasserted) = match decided {
                Decision::CommitWithUnasserted {
                    mutations,
                    unasserted,
                    then,
                } => (Decision::Commit { mutations, then }, unasserted),
                other => (other, Vec::new()),
            };
            match decision {
                Decision::Expand(more) => {
                    expansions += 1;
                    if expansions > self.options.max_attempts {
                        return Err(Error::ConflictRetriesExhausted {
                            attempts: expansions,
                        }
                        .into());
                    }
                    let fresh: Vec<String> =
                        more.into_iter().filter(|k| !view.contains(k)).collect();
                    if fresh.is_empty() {
                        return Err(Error::InvalidInput(InvalidInput::Argument(
                            "decision asked to expand with keys it already has".into(),
                        ))
                        .into());
                    }
                    if self.options.optimistic {
                        self.fill_from_cache(&mut view, &fresh);
                        consistent = false;
                    } else {
                        let mut all: Vec<String> = view.keys().map(str::to_owned).collect();
                        all.extend(fresh);
                        view = View::default();
                        self.read_into(&mut view, &all).await?;
                        consistent = true;
                    }
                }
                Decision::Return(answer) if consistent => return answer,
                Decision::Return(answer) => {
                    // Confirm the guessed view with an assert-only txn.
                    match self.commit(&mut view, &[]).await {
                        Ok(true) => return answer,
                        Ok(false) => {
                            consistent = true;
                            self.after_rejection(&mut rejections).await?;
                        }
                        // An assert-only txn writes nothing, applied or not:
                        // a consistent read answers in its place.
                        Err(error) if error.is_indeterminate() || error.is_retryable() => {
                            let keys: Vec<String> = view.keys().map(str::to_owned).collect();
                            view = View::default();
                            self.read_into(&mut view, &keys).await?;
                            consistent = true;
                        }
                        Err(error) => return Err(error.into()),
                    }
                }
                Decision::Commit { mutations, then } => {
                    if let Some(stray) = mutations.iter().find(|m| !view.contains(m.key())) {
                        return Err(Error::InvalidInput(InvalidInput::Argument(format!(
                            "decision writes {:?} without having read it",
                            stray.key()
                        )))
                        .into());
                    }
                    let mutations: Vec<Mutation> = mutations
                        .into_iter()
                        .chain(unasserted.into_iter().filter(|m| !view.contains(m.key())))
                        .collect();
                    match self.commit(&mut view, &mutations).await {
                        Ok(true) => return then,
                        Ok(false) => {
                            consistent = true;
                            self.after_rejection(&mut rejections).await?;
                        }
                        Err(error) if error.is_indeterminate() => {
                            self.settle(&view.asserts(), &mutations, error).await?;
                            return then;
                        }
                        Err(error) => return Err(error.into()),
                    }
                }
                Decision::CommitWithUnasserted { .. } => {
                    unreachable!("turned into a Commit above")
                }
            }
        }
    }

    /// The txn `asserts → mutations` was sent and its answer lost (`lost`):
    /// `Ok` once it is known that it (or its identical resend) applied, else
    /// [`Error::Indeterminate`]. See the module docs for why a resend is safe.
    async fn settle(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
        lost: Error,
    ) -> Result<(), Error> {
        let mut last = lost;
        for attempt in 1..=self.options.max_attempts {
            self.backoff(attempt).await;
            self.counters.txns.fetch_add(1, Ordering::Relaxed);
            match self.call_txn(asserts, mutations).await {
                Ok(outcome) if outcome.applied => {
                    self.remember_written(asserts, mutations, &outcome);
                    return Ok(());
                }
                Ok(outcome) => {
                    self.counters.rejections.fetch_add(1, Ordering::Relaxed);
                    crate::telemetry::cas_conflict(self.backend.store_name());
                    self.remember(&outcome.current);
                    if puts_landed(mutations, &outcome.current) {
                        // Our puts are there, but the store could not say
                        // they survive a failover: not an answer.
                        if let Some(why) = outcome.unconfirmed {
                            return Err(Error::Indeterminate {
                                message: format!(
                                    "the answer of a txn was lost; its writes are in the store, \
                                     but not confirmed durable: {why}"
                                ),
                                source: Some(Box::new(last)),
                            });
                        }
                        return Ok(());
                    }
                    return Err(Error::Indeterminate {
                        message: "the answer of a txn was lost and the keys it asserted have \
                                  changed since: it may have applied before being overwritten"
                            .into(),
                        source: Some(Box::new(last)),
                    });
                }
                // Lost again, or not sent at all: the first send is still in doubt.
                Err(error) if error.is_indeterminate() => last = error,
                Err(error) if error.is_retryable() => {}
                // Not an answer about the txn (the same txn was valid a moment ago).
                Err(_) => break,
            }
        }
        Err(last)
    }

    /// Jittered exponential backoff before the `attempt`-th retry (from 1).
    async fn backoff(&self, attempt: u32) {
        let exp = self
            .options
            .base_backoff
            .saturating_mul(1 << (attempt.saturating_sub(1)).min(16));
        let cap = exp.min(self.options.max_backoff);
        tokio::time::sleep(cap.mul_f64(crate::jitter::unit())).await;
    }

    async fn after_rejection(&self, rejections: &mut u32) -> Result<(), Error> {
        *rejections += 1;
        if *rejections >= self.options.max_attempts {
            return Err(Error::ConflictRetriesExhausted {
                attempts: *rejections,
            });
        }
        if *rejections > 1 {
            self.backoff(*rejections - 1).await;
        }
        Ok(())
    }

    /// The backend's txn, bounded by the call timeout (a txn that does not
    /// answer in time may still apply: indeterminate).
    async fn call_txn(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> Result<TxnOutcome, Error> {
        crate::telemetry::cas_attempt(self.backend.store_name());
        let call = self.backend.txn(asserts, mutations);
        match self.options.call_timeout {
            None => call.await,
            Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(Error::Indeterminate {
                    message: format!("no answer to a txn within {limit:?}"),
                    source: None,
                })
            }),
        }
    }

    /// Send the txn; on success update the cache, on rejection refresh `view`.
    async fn commit(&self, view: &mut View, mutations: &[Mutation]) -> Result<bool, Error> {
        self.counters.txns.fetch_add(1, Ordering::Relaxed);
        let asserts = view.asserts();
        let outcome = self.call_txn(&asserts, mutations).await?;
        if outcome.applied {
            self.remember_written(&asserts, mutations, &outcome);
            Ok(true)
        } else {
            self.counters.rejections.fetch_add(1, Ordering::Relaxed);
            crate::telemetry::cas_conflict(self.backend.store_name());
            self.remember(&outcome.current);
            for entry in outcome.current {
                view.entries.insert(entry.key.clone(), entry);
            }
            Ok(false)
        }
    }

    /// Remember what an applied txn wrote: the version the store reports
    /// for a put; else one past the version it was asserted at, which for a
    /// key created over "missing" is a guess of 1 (right until the key was
    /// deleted once or the namespace reclaimed; a wrong guess costs one
    /// rejected txn, which returns the truth).
    fn remember_written(&self, asserts: &[Assert], mutations: &[Mutation], outcome: &TxnOutcome) {
        let written: Vec<Entry> = mutations
            .iter()
            .map(|m| match m {
                Mutation::Put { key, value } => {
                    let version = outcome.written_version(key).unwrap_or_else(|| {
                        // A txn names a handful of keys: a scan beats hashing them.
                        let before = asserts
                            .iter()
                            .find(|a| a.key == *key)
                            .map_or(Version::MISSING, |a| a.version);
                        Version(before.0 + 1)
                    });
                    Entry::present(key.clone(), version, value.clone())
                }
                // A deleted key reads as missing; its hidden counter is not needed to assert it.
                Mutation::Delete { key } => Entry::missing(key.clone()),
            })
            .collect();
        self.remember(&written);
    }

    async fn read_into(&self, view: &mut View, keys: &[String]) -> Result<(), Error> {
        for entry in self.snapshot(keys).await? {
            view.entries.insert(entry.key.clone(), entry);
        }
        Ok(())
    }

    /// The options this engine decides with.
    pub fn options(&self) -> &CasOptions {
        &self.options
    }

    /// The same engine (backend, cache, counters) giving up after
    /// `attempts` rejected txns, and pausing `backoff` (doubling, jittered)
    /// from the second rejection on: for a fast path with a fallback of its
    /// own, or for a decision that must not lose every race to writers with
    /// fresher caches (zero backoff: each retry already carries the values
    /// the rejection returned).
    pub fn with_retries(&self, attempts: u32, backoff: Duration) -> CasEngine {
        let mut engine = self.clone();
        engine.options.max_attempts = attempts.max(1);
        engine.options.base_backoff = backoff;
        engine.options.max_backoff = engine.options.max_backoff.max(backoff);
        engine
    }

    /// What the cache last saw of `key` (`None`: never seen, or forgotten).
    /// A guess only (another client may have written since): fit for a
    /// prediction that is checked later, never for a decision.
    pub fn cached(&self, key: &str) -> Option<Entry> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.get(key, self.options.cache_capacity)
    }

    fn fill_from_cache(&self, view: &mut View, keys: &[String]) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            let entry = cache
                .get(key, self.options.cache_capacity)
                .unwrap_or_else(|| Entry::missing(key.clone()));
            view.entries.insert(key.clone(), entry);
        }
    }

    fn remember(&self, entries: &[Entry]) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        for entry in entries {
            cache.insert(entry.clone(), self.options.cache_capacity);
        }
    }
}

/// Whether every asserted put of `mutations` is in `current`
/// byte-for-byte (and every asserted deleted key is missing), with at least
/// one such put: the caller's own freshly minted bytes, which nobody else
/// writes. Writes outside the asserts have no entry in `current`; the
/// asserted puts already tell whether the (atomic) txn applied.
fn puts_landed(mutations: &[Mutation], current: &[Entry]) -> bool {
    let now: HashMap<&str, &Entry> = current.iter().map(|e| (e.key.as_str(), e)).collect();
    let checked: Vec<(&Mutation, &Entry)> = mutations
        .iter()
        .filter_map(|m| now.get(m.key()).map(|e| (m, *e)))
        .collect();
    checked
        .iter()
        .any(|(m, _)| matches!(m, Mutation::Put { .. }))
        && checked.iter().all(|(m, e)| match m {
            Mutation::Put { value, .. } => e.value.as_ref() == Some(value),
            Mutation::Delete { .. } => !e.exists(),
        })
}

/// Last-seen entries in two generations: when the young one is full it
/// becomes the old one, and a hit in the old one is moved back. Keys in use
/// (a lock's record, a resource's record) survive a flood of one-off keys,
/// at the cost of at most `2 × capacity` entries.
#[derive(Debug, Default)]
struct EntryCache {
    young: HashMap<String, Entry>,
    old: HashMap<String, Entry>,
}

impl EntryCache {
    fn get(&mut self, key: &str, capacity: usize) -> Option<Entry> {
        if let Some(entry) = self.young.get(key) {
            return Some(entry.clone());
        }
        let entry = self.old.remove(key)?;
        self.insert(entry.clone(), capacity);
        Some(entry)
    }

    fn insert(&mut self, entry: Entry, capacity: usize) {
        if self.young.len() >= capacity.max(1) && !self.young.contains_key(&entry.key) {
            self.old = std::mem::take(&mut self.young);
        }
        self.old.remove(&entry.key);
        self.young.insert(entry.key.clone(), entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_backend::BackendExt;
    use coord_memory::SingleProcessMemoryBackend;

    fn counter_step(view: &View) -> Result<Decision<u64>, Error> {
        let n = view
            .value("n")
            .map(|v| String::from_utf8_lossy(v).parse::<u64>().unwrap())
            .unwrap_or(0);
        Ok(Decision::Commit {
            mutations: vec![Mutation::put("n", (n + 1).to_string())],
            then: n + 1,
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn increments_race_to_exact_total() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("cas").unwrap());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let engine = CasEngine::new(backend.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    engine
                        .decide::<_, Error, _>(&["n".into()], counter_step)
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(backend.get("n").await.unwrap().value.unwrap(), b"400");
    }

    #[test]
    fn cache_keeps_keys_in_use_across_a_flood() {
        let mut cache = EntryCache::default();
        cache.insert(Entry::present("hot", Version(7), b"x".to_vec()), 4);
        for i in 0..100 {
            cache.insert(Entry::missing(format!("cold/{i}")), 4);
            assert_eq!(cache.get("hot", 4).map(|e| e.version), Some(Version(7)));
        }
        assert!(cache.young.len() + cache.old.len() <= 8);
    }

    #[tokio::test]
    async fn uncontended_decision_costs_one_round_trip() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("cas").unwrap());
        let engine = CasEngine::new(backend);
        engine
            .decide::<_, Error, _>(&["n".into()], counter_step)
            .await
            .unwrap();
        engine
            .decide::<_, Error, _>(&["n".into()], counter_step)
            .await
            .unwrap();
        assert_eq!(engine.stats().round_trips(), 2);
        assert_eq!(engine.stats().rejections, 0);
    }

    /// A key created over a tombstone is remembered at the version the
    /// store gave it (not a guess of 1): the next decision costs one txn.
    #[tokio::test]
    async fn a_created_key_is_remembered_at_its_reported_version() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("cas").unwrap());
        backend
            .put_if("n", Version::MISSING, b"0".to_vec())
            .await
            .unwrap();
        backend.delete_if("n", Version(1)).await.unwrap();
        let engine = CasEngine::new(backend);
        for _ in 0..2 {
            engine
                .decide::<_, Error, _>(&["n".into()], counter_step)
                .await
                .unwrap();
        }
        assert_eq!(engine.cached("n").map(|e| e.version), Some(Version(4)));
        assert_eq!(engine.stats().rejections, 0);
        assert_eq!(engine.stats().round_trips(), 2);
    }

    #[tokio::test]
    async fn unasserted_writes_apply_with_the_decision_and_only_with_it() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("cas").unwrap());
        backend
            .put_if("aux", Version::MISSING, b"old".to_vec())
            .await
            .unwrap();
        let engine = CasEngine::new(backend.clone());
        // "aux" is never read: it is deleted whatever it holds, "fresh" created.
        let step = |view: &View| -> Result<Decision<u64>, Error> {
            let Decision::Commit { mutations, then } = counter_step(view)? else {
                unreachable!()
            };
            Ok(Decision::CommitWithUnasserted {
                mutations,
                unasserted: vec![
                    Mutation::delete("aux"),
                    Mutation::put("fresh", b"1".to_vec()),
                ],
                then,
            })
        };
        assert_eq!(
            engine
                .decide::<_, Error, _>(&["n".into()], step)
                .await
                .unwrap(),
            1
        );
        assert!(backend.get("aux").await.unwrap().value.is_none());
        assert_eq!(backend.get("fresh").await.unwrap().value.unwrap(), b"1");
        // A decision that writes nothing asserted still refuses a stray write.
        let stray = |_: &View| -> Result<Decision<()>, Error> {
            Ok(Decision::CommitWithUnasserted {
                mutations: vec![Mutation::put("elsewhere", b"x".to_vec())],
                unasserted: Vec::new(),
                then: (),
            })
        };
        let refused = engine.decide::<_, Error, _>(&["n".into()], stray).await;
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{refused:?}"
        );
    }

    /// A store whose first txn applies and loses its answer, and whose
    /// rejections say (when `doubt`) that their entries are not confirmed
    /// durable: a replicated store that could not get its replicas' ack.
    #[derive(Debug)]
    struct LostThenUnconfirmed {
        inner: SingleProcessMemoryBackend,
        lost_one: std::sync::atomic::AtomicBool,
        doubt: bool,
    }

    #[async_trait::async_trait]
    impl Backend for LostThenUnconfirmed {
        fn namespace(&self) -> &str {
            self.inner.namespace()
        }
        fn limits(&self) -> coord_backend::Limits {
            self.inner.limits()
        }
        async fn raw_snapshot(&self, keys: &[&str]) -> coord_backend::Result<Vec<Entry>> {
            self.inner.raw_snapshot(keys).await
        }
        async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
            self.inner.raw_keys(prefix).await
        }
        async fn raw_txn(
            &self,
            asserts: &[Assert],
            mutations: &[Mutation],
        ) -> coord_backend::Result<TxnOutcome> {
            let outcome = self.inner.raw_txn(asserts, mutations).await?;
            if !self.lost_one.swap(true, Ordering::SeqCst) {
                return Err(Error::indeterminate(
                    "answer lost",
                    std::io::Error::other("test"),
                ));
            }
            Ok(match (outcome.applied, self.doubt) {
                (false, true) => TxnOutcome::rejected_unconfirmed(
                    outcome.current,
                    "1 of the 2 replicas asked for".into(),
                ),
                _ => outcome,
            })
        }
    }

    #[tokio::test]
    async fn a_resend_refused_over_unconfirmed_entries_settles_nothing() {
        for doubt in [false, true] {
            let store = Arc::new(LostThenUnconfirmed {
                inner: SingleProcessMemoryBackend::new("cas-unconfirmed").unwrap(),
                lost_one: false.into(),
                doubt,
            });
            let engine = CasEngine::new(store.clone());
            let answer = engine
                .decide::<_, Error, _>(&["n".into()], counter_step)
                .await;
            // The lost txn applied either way; the resend is refused and
            // shows its bytes. Only a confirmed rejection makes that an answer.
            assert_eq!(
                store.inner.get("n").await.unwrap().value.as_deref(),
                Some(&b"1"[..])
            );
            if doubt {
                assert!(
                    matches!(&answer, Err(Error::Indeterminate { message, .. }) if message.contains("not confirmed durable")),
                    "{answer:?}"
                );
            } else {
                assert_eq!(answer.unwrap(), 1);
            }
        }
    }

    #[test]
    fn a_lost_answer_is_settled_by_the_asserted_puts_alone() {
        let put = Mutation::put("n", b"fresh-bytes".to_vec());
        let unasserted = Mutation::delete("aux");
        let current = [Entry::present("n", Version(3), b"fresh-bytes".to_vec())];
        assert!(puts_landed(&[put.clone(), unasserted.clone()], &current));
        let overwritten = [Entry::present("n", Version(4), b"other".to_vec())];
        assert!(!puts_landed(&[put, unasserted.clone()], &overwritten));
        // Nothing asserted was put: nothing tells whether it applied.
        assert!(!puts_landed(&[unasserted], &current));
    }
}
