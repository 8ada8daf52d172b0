//! The backend suite against the in-process reference store, and proof that
//! it goes red: the same suite against deliberately broken stores, each of
//! which must be caught by the checks named for it.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{
    Assert, Backend, Entry, Error, Mutation, ReclaimOptions, Reclaimed, Result, TxnOutcome, Version,
};
use coord_conformance::{factory, run_cases, BackendFactory};

/// What is wrong with a [`FlawedStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Nothing: the control, must pass every check.
    None,
    /// Checks the asserts, releases the lock, sleeps, then writes.
    NonAtomicTxn,
    /// Forgets a key's counter on delete, so a re-create starts at v1 again.
    VersionReusedAfterDelete,
    /// Reads the keys of a snapshot one by one, sleeping in between.
    TornSnapshot,
    /// Treats the prefix as a pattern: `_`/`?` match one character, `%`/`*` any run.
    PrefixAsPattern,
    /// A rejected txn echoes the asserted versions instead of the current ones.
    StaleRejection,
    /// A rejected txn returns no entries.
    EmptyRejection,
    /// Every 5th txn fails with `Unavailable` (writing nothing).
    FailingTxns,
    /// Snapshot isolation: asserts on keys the txn does not write are checked
    /// against the versions read when it started (before it waited), asserts
    /// on written keys against the current ones (first committer wins).
    SnapshotIsolation,
    /// An applied txn reports each put's version as one past its assert
    /// (a guess: wrong for a key created again after a delete).
    ReportsGuessedVersions,
    /// `first_keys` ignores its limit past the first key: the head plus
    /// one key too many.
    FirstKeysOverrun,
    /// A reclaim removes tombstones but leaves the floor where it was.
    ReclaimForgetsFloor,
    /// A reclaim removes tombstones, lets go of the store, then raises the
    /// floor: a create in between starts from the old floor.
    ReclaimRacesCreate,
}

/// Where the flawed store keeps the namespace's floor (as the version of a
/// value-less cell): a key no caller can name (keys hold no NUL byte).
const FLOOR: &str = "\0floor";

#[derive(Clone, Debug, Default)]
struct Cell {
    version: u64,
    value: Option<Vec<u8>>,
}

type Cells = Arc<Mutex<BTreeMap<String, Cell>>>;

/// The memory store's semantics, copied, with one [`Flaw`] switched in.
#[derive(Debug)]
struct FlawedStore {
    namespace: String,
    flaw: Flaw,
    cells: Cells,
    txns: Arc<AtomicU64>,
}

fn entry_of(cells: &BTreeMap<String, Cell>, key: &str) -> Entry {
    match cells.get(key) {
        Some(Cell {
            version,
            value: Some(value),
        }) => Entry::present(key, Version(*version), value.clone()),
        _ => Entry::missing(key),
    }
}

fn distinct(keys: impl Iterator<Item = String>) -> Vec<String> {
    let mut seen = HashSet::new();
    keys.filter(|k| seen.insert(k.clone())).collect()
}

/// Whether `pattern` (`_`/`?` = one char, `%`/`*` = any run) matches a prefix of `key`.
fn pattern_prefix(pattern: &[char], key: &[char]) -> bool {
    match pattern.split_first() {
        None => true,
        Some(('%' | '*', rest)) => (0..=key.len()).any(|skip| pattern_prefix(rest, &key[skip..])),
        Some(('_' | '?', rest)) => !key.is_empty() && pattern_prefix(rest, &key[1..]),
        Some((c, rest)) => key.first() == Some(c) && pattern_prefix(rest, &key[1..]),
    }
}

impl FlawedStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Cell>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rejected(&self, cells: &BTreeMap<String, Cell>, asserts: &[Assert]) -> TxnOutcome {
        let keys = distinct(asserts.iter().map(|a| a.key.clone()));
        let current = match self.flaw {
            Flaw::EmptyRejection => Vec::new(),
            Flaw::StaleRejection => keys
                .iter()
                .map(|k| {
                    let asserted = asserts.iter().find(|a| &a.key == k).map(|a| a.version);
                    Entry {
                        version: asserted.unwrap_or_default(),
                        ..entry_of(cells, k)
                    }
                })
                .collect(),
            _ => keys.iter().map(|k| entry_of(cells, k)).collect(),
        };
        TxnOutcome::rejected(current)
    }

    fn holds(cells: &BTreeMap<String, Cell>, asserts: &[Assert]) -> bool {
        asserts
            .iter()
            .all(|a| entry_of(cells, &a.key).version == a.version)
    }

    fn apply(&self, cells: &mut BTreeMap<String, Cell>, mutations: &[Mutation]) {
        for mutation in mutations {
            match mutation {
                Mutation::Delete { key } if self.flaw == Flaw::VersionReusedAfterDelete => {
                    cells.remove(key);
                }
                _ => {
                    let floor = cells.get(FLOOR).map_or(0, |c| c.version);
                    let cell = cells.entry(mutation.key().to_owned()).or_insert(Cell {
                        version: floor,
                        value: None,
                    });
                    cell.version += 1;
                    cell.value = match mutation {
                        Mutation::Put { value, .. } => Some(value.clone()),
                        Mutation::Delete { .. } => None,
                    };
                }
            }
        }
    }
}

#[async_trait]
impl Backend for FlawedStore {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        if self.flaw != Flaw::TornSnapshot {
            let cells = self.lock();
            return Ok(keys.iter().map(|k| entry_of(&cells, k)).collect());
        }
        let mut entries = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if i > 0 {
                // Long enough for a concurrent writer to land between two reads.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            entries.push(entry_of(&self.lock(), key));
        }
        Ok(entries)
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        if self.flaw == Flaw::FailingTxns && self.txns.fetch_add(1, Ordering::SeqCst) % 5 == 4 {
            return Err(Error::unavailable(
                "injected failure",
                "the flawed store drops every 5th txn",
            ));
        }
        if self.flaw == Flaw::NonAtomicTxn {
            {
                let cells = self.lock();
                if !Self::holds(&cells, asserts) {
                    return Ok(self.rejected(&cells, asserts));
                }
            }
            // Read-decide-write in separate steps: every racer that checked
            // before the first write also writes.
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.apply(&mut self.lock(), mutations);
            return Ok(TxnOutcome::applied());
        }
        if self.flaw == Flaw::SnapshotIsolation {
            let started: HashMap<String, Version> = {
                let cells = self.lock();
                asserts
                    .iter()
                    .map(|a| (a.key.clone(), entry_of(&cells, &a.key).version))
                    .collect()
            };
            // Long enough for a concurrent txn to commit in between.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut cells = self.lock();
            let written: HashSet<&str> = mutations.iter().map(Mutation::key).collect();
            let holds = asserts.iter().all(|a| {
                let seen = if written.contains(a.key.as_str()) {
                    entry_of(&cells, &a.key).version
                } else {
                    started[&a.key]
                };
                seen == a.version
            });
            if !holds {
                return Ok(self.rejected(&cells, asserts));
            }
            self.apply(&mut cells, mutations);
            return Ok(TxnOutcome::applied());
        }
        let mut cells = self.lock();
        if !Self::holds(&cells, asserts) {
            return Ok(self.rejected(&cells, asserts));
        }
        self.apply(&mut cells, mutations);
        if self.flaw == Flaw::ReportsGuessedVersions {
            let guessed = mutations
                .iter()
                .filter(|m| matches!(m, Mutation::Put { .. }))
                .map(|m| {
                    let asserted = asserts.iter().find(|a| a.key == m.key());
                    let before = asserted.map_or(0, |a| a.version.0);
                    (m.key().to_owned(), Version(before + 1))
                })
                .collect();
            return Ok(TxnOutcome::applied_at(guessed));
        }
        Ok(TxnOutcome::applied())
    }

    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        let (gone, highest, more) = {
            let mut cells = self.lock();
            let tombstones: Vec<String> = cells
                .iter()
                .filter(|(k, c)| c.value.is_none() && k.as_str() != FLOOR)
                .map(|(k, _)| k.clone())
                .collect();
            let gone: Vec<String> = tombstones
                .iter()
                .take(options.max_tombstones)
                .cloned()
                .collect();
            let highest = gone
                .iter()
                .filter_map(|k| cells.remove(k))
                .map(|c| c.version)
                .max()
                .unwrap_or(0);
            if !matches!(
                self.flaw,
                Flaw::ReclaimForgetsFloor | Flaw::ReclaimRacesCreate
            ) {
                raise_floor(&mut cells, highest);
            }
            (gone.len(), highest, tombstones.len() > gone.len())
        };
        if self.flaw == Flaw::ReclaimRacesCreate {
            tokio::time::sleep(Duration::from_millis(3)).await;
            raise_floor(&mut self.lock(), highest);
        }
        Ok(Reclaimed::new(gone as u64, more))
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let cells = self.lock();
        let pattern: Vec<char> = prefix.chars().collect();
        Ok(cells
            .iter()
            .filter(|(_, c)| c.value.is_some())
            .filter(|(k, _)| {
                if self.flaw == Flaw::PrefixAsPattern {
                    pattern_prefix(&pattern, &k.chars().collect::<Vec<_>>())
                } else {
                    k.starts_with(prefix)
                }
            })
            .map(|(k, _)| k.clone())
            .collect())
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let mut keys = self.raw_keys(prefix).await?;
        let keep = if self.flaw == Flaw::FirstKeysOverrun && limit > 1 {
            limit + 1
        } else {
            limit
        };
        keys.truncate(keep);
        Ok(keys)
    }
}

fn raise_floor(cells: &mut BTreeMap<String, Cell>, to: u64) {
    let floor = cells.entry(FLOOR.to_owned()).or_default();
    floor.version = floor.version.max(to);
}

/// A factory of flawed stores: one map per namespace, shared by every client
/// of that namespace (like a server), private to this factory.
fn flawed(flaw: Flaw) -> BackendFactory {
    let namespaces: Arc<Mutex<HashMap<String, Cells>>> = Arc::default();
    let txns = Arc::new(AtomicU64::new(0));
    factory(move |namespace: String| {
        let cells = namespaces
            .lock()
            .unwrap()
            .entry(namespace.clone())
            .or_default()
            .clone();
        let txns = txns.clone();
        async move {
            Ok(Arc::new(FlawedStore {
                namespace,
                flaw,
                cells,
                txns,
            }) as Arc<dyn Backend>)
        }
    })
}

/// Run the whole suite against a flawed store; assert every check in
/// `must_fail` failed (and nothing else when the flaw is `None`).
async fn caught_by(flaw: Flaw, must_fail: &[&str]) -> HashMap<&'static str, String> {
    let mut cases = coord_conformance::backend::cases();
    cases.extend(coord_conformance::reclaim::cases());
    // The retention suite builds on a correct store (a flaw of the txn
    // itself makes its adapters retry for minutes): it runs on the control
    // and on the reclaim flaws, which it must catch too.
    if matches!(
        flaw,
        Flaw::None | Flaw::ReclaimForgetsFloor | Flaw::ReclaimRacesCreate
    ) {
        cases.extend(coord_conformance::retention::cases());
    }
    let reports = run_cases(&cases, flawed(flaw), |_| {}).await;
    let failed: HashMap<&'static str, String> = reports
        .iter()
        .filter_map(|r| r.result.as_ref().err().map(|f| (r.name, f.message.clone())))
        .collect();
    let mut names: Vec<_> = failed.keys().copied().collect();
    names.sort();
    println!(
        "{flaw:?}: {} of {} checks failed: {names:?}",
        failed.len(),
        reports.len()
    );
    for name in &names {
        let message = &failed[name];
        let short: String = message.chars().take(400).collect();
        println!("  {name}: {short}");
    }
    for name in must_fail {
        assert!(
            failed.contains_key(name),
            "{flaw:?} was not caught by {name} (failed: {names:?})"
        );
    }
    if must_fail.is_empty() {
        assert!(failed.is_empty(), "the unflawed copy failed {names:?}");
    }
    failed
}

/// One test per flaw: each check listed must catch it (none may fail on `None`).
macro_rules! caught {
    ($($test:ident: $flaw:ident, [$($check:literal),* $(,)?];)+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            caught_by(Flaw::$flaw, &[$($check),*]).await;
        }
    )+};
}

caught! {
    unflawed_copy_passes_everything: None, [];
    non_atomic_txn_is_caught: NonAtomicTxn, ["concurrent_txn", "increment_race"];
    version_reuse_is_caught: VersionReusedAfterDelete,
        ["version_monotonic", "all_or_nothing", "model_sequences"];
    torn_snapshot_is_caught: TornSnapshot, ["snapshot_consistency"];
    prefix_as_pattern_is_caught: PrefixAsPattern, ["keys_literal_prefix", "model_sequences"];
    first_keys_overrun_is_caught: FirstKeysOverrun, ["keys_literal_prefix"];
    stale_rejection_entries_are_caught: StaleRejection,
        ["rejected_txn_current", "increment_race", "assert_missing", "model_sequences"];
    empty_rejection_entries_are_caught: EmptyRejection,
        ["rejected_txn_current", "increment_race", "model_sequences"];
    write_skew_is_caught: SnapshotIsolation, ["disjoint_write_skew"];
    reclaim_that_forgets_the_floor_is_caught: ReclaimForgetsFloor, [
        "reclaim_keeps_versions_unique",
        "reclaim_is_bounded",
        "reclaim_races_create",
        // A task added again after a prune and a reclaim: its record
        // restarts at v1, and so would its fences.
        "completed_tasks_go_after_the_window",
    ];
    reclaim_that_races_a_create_is_caught: ReclaimRacesCreate, ["reclaim_races_create"];
    guessed_written_versions_are_caught: ReportsGuessedVersions, ["reported_versions_are_stored"];
}

/// The check of stores that report every put's version (not in the suite)
/// goes red on a store that reports nothing (the control) and on one that
/// guesses.
#[tokio::test]
async fn unreported_or_guessed_put_versions_are_caught() {
    for flaw in [Flaw::None, Flaw::ReportsGuessedVersions] {
        let namespace = coord_conformance::unique_namespace("every_put");
        let backend = flawed(flaw)(namespace).await.expect("flawed store");
        let result = coord_conformance::backend::every_put_reports_its_version(backend).await;
        match result {
            Ok(()) => panic!("{flaw:?} passed every_put_reports_its_version"),
            Err(failure) => println!("{flaw:?}: {}", failure.message),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_errors_are_failures_not_losers() {
    let failed = caught_by(Flaw::FailingTxns, &["concurrent_txn", "model_sequences"]).await;
    let message = &failed["concurrent_txn"];
    assert!(
        message.contains("store error") && message.contains("injected failure"),
        "concurrent_txn must report the store's error, not a lost race: {message}"
    );
}

#[test]
fn pattern_matcher_of_the_flawed_store() {
    let m = |p: &str, k: &str| {
        pattern_prefix(
            &p.chars().collect::<Vec<_>>(),
            &k.chars().collect::<Vec<_>>(),
        )
    };
    assert!(m("a_", "ab") && m("a%", "abc") && m("a*", "aa") && m("", "x"));
    assert!(!m("a_", "a") && !m("b", "ab"));
}

/// The queue's fault check (workers whose answers are lost or land late)
/// passes on the control and goes red on a store whose txn is not atomic:
/// two workers are handed one task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_faults_check_is_red_on_a_non_atomic_store() {
    use coord_conformance::queue::faults_never_double_or_lose;
    if let Err(failure) = faults_never_double_or_lose(flawed(Flaw::None)).await {
        panic!("the control failed: {}", failure.message);
    }
    match faults_never_double_or_lose(flawed(Flaw::NonAtomicTxn)).await {
        Ok(()) => panic!("a non-atomic store passed faults_never_double_or_lose"),
        Err(failure) => println!("NonAtomicTxn: {}", failure.message),
    }
}
