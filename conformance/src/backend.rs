//! The backend suite: the contract of the three primitives.
//!
//! Run it with [`backend_tests!`](crate::backend_tests) or call the checks directly.
//!
//! Every check is a plain `async fn`. Checks that take an `Arc<dyn Backend>`
//! expect an **empty namespace** (they refuse to run otherwise, so a leftover
//! key can never make a check pass or fail by accident); checks that take a
//! [`BackendFactory`] open several clients themselves, also several clients of
//! one namespace, so stores with per-client connections are raced for real.
//!
//! What the suite pins down (each bullet is one check):
//!
//! - [`concurrent_txn`]: exactly one of N racing writers commits;
//! - [`increment_race`]: W×M compare-and-swap increments from separate clients end at exactly W×M;
//! - [`snapshot_consistency`]: a snapshot never sees a multi-key txn half applied;
//! - [`disjoint_write_skew`]: two txns asserting `{A, B}`, one writing A and one B, never both commit;
//! - [`version_monotonic`]: +1 per write, deletes too, never reused after a re-create (ABA);
//! - [`assert_missing`]: create-if-missing, also after a delete;
//! - [`all_or_nothing`]: one false assert writes nothing; puts and deletes of one txn apply together;
//! - [`rejected_txn_current`]: a rejected txn returns the true current entries of the asserted keys;
//! - [`snapshot_semantics`]: duplicates once, missing keys as version 0, order of first appearance;
//! - [`keys_literal_prefix`]: sorted, no deleted keys, prefixes are data (`%`, `_`, `*`, `[`, `\`, é, 中, …);
//! - [`namespace_isolation`]: namespaces `Xa`, `Xab`, `Xa:b` never see each other;
//! - [`bad_input`]: [`Error::InvalidInput`] and nothing stored changes;
//! - [`large_values`]: a value of exactly the size limit, and an empty value, round-trip byte-exact;
//! - [`model_sequences`]: random sequences of the three primitives against a reference model (proptest, shrinking).
//!
//! The boundary: these checks observe a store only through the [`Backend`]
//! trait. What the trait cannot show (durability, replication, behaviour when
//! the connection breaks) belongs to the store's own tests and to
//! [`crate::fault`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Error, InvalidInput, Mutation, TxnOutcome, Version};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use crate::{ensure, unique_namespace, BackendFactory, BoxFuture, Case, CheckResult, Failure};

/// Exactly one of `workers` racing writers that assert the same version
/// commits; the version moves by exactly one; store errors are reported as
/// errors, never counted as losers.
pub async fn concurrent_txn(backend: Arc<dyn Backend>, key: &str, workers: usize) -> CheckResult {
    let before = get(&*backend, key).await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let backend = backend.clone();
        let barrier = barrier.clone();
        let key = key.to_owned();
        let version = before.version;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            backend
                .txn(
                    &[Assert::at(key.clone(), version)],
                    &[Mutation::put(key, format!("worker-{worker}"))],
                )
                .await
        }));
    }
    let mut winners = Vec::new();
    for (worker, task) in tasks.into_iter().enumerate() {
        let outcome = task
            .await
            .map_err(|e| Failure::new(format!("worker {worker} panicked: {e}")))??;
        if outcome.applied {
            winners.push(worker);
        }
    }
    ensure!(
        winners.len() == 1,
        "{} of {workers} racing txns on one version committed (expected exactly 1): {winners:?}",
        winners.len()
    );
    let after = get(&*backend, key).await?;
    ensure!(
        after.version == Version(before.version.0 + 1),
        "version moved from {} to {} (expected exactly +1)",
        before.version,
        after.version
    );
    ensure!(
        after.value.as_deref() == Some(format!("worker-{}", winners[0]).as_bytes()),
        "stored value is not the winner's"
    );
    Ok(())
}

fn case_concurrent_txn(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        let backend = factory(unique_namespace("concurrent_txn")).await?;
        concurrent_txn(backend.clone(), "race", 16).await?;
        // again on an existing key
        concurrent_txn(backend, "race", 16).await
    })
}

/// Sizes of [`increment_race`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IncrementRace {
    /// Concurrent workers, each with its own client from the factory.
    pub workers: usize,
    /// Successful increments each worker makes.
    pub increments: usize,
}

impl Default for IncrementRace {
    fn default() -> Self {
        IncrementRace {
            workers: 8,
            increments: 10,
        }
    }
}

fn counter_of(entry: &Entry) -> Result<u64, Failure> {
    match &entry.value {
        None => Ok(0),
        Some(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                Failure::new(format!(
                    "counter {:?} holds {bytes:?}, not a number this check wrote",
                    entry.key
                ))
            }),
    }
}

/// `workers` × `increments` compare-and-swap increments of one counter end at
/// exactly `workers × increments`, and its version moved by exactly as much.
///
/// Each worker gets its own client (`factory(namespace)`) and runs the loop
/// every adapter runs: snapshot once (all workers read before any writes, so
/// the first round is a race on one version), then txn asserting the version it
/// decided from, and on rejection decide again from the entries the rejected
/// txn returned (no second read). A rejected txn must report a version higher
/// than the one asserted, otherwise the loop could never make progress; a
/// worker can only be rejected once per commit of another worker, so the
/// attempts are bounded and a store that lies about `current` fails instead of
/// looping.
pub async fn increment_race(
    factory: BackendFactory,
    namespace: &str,
    key: &str,
    options: IncrementRace,
) -> CheckResult {
    let IncrementRace {
        workers,
        increments,
    } = options;
    ensure!(
        workers > 0,
        "increment_race needs at least one worker, got {options:?}"
    );
    let total = (workers * increments) as u64;
    let first = factory(namespace.to_owned()).await?;
    let before = get(&*first, key).await?;
    let start = counter_of(&before)?;
    // Everyone reads, then everyone writes: the first round is a real race on
    // one version (at least workers - 1 rejections), also on a store so fast
    // that free-running workers would never overlap.
    let read = Arc::new(tokio::sync::Barrier::new(workers));
    let write = Arc::new(tokio::sync::Barrier::new(workers));
    // Open every client before spawning, so a failing factory leaves no task waiting at a barrier.
    let mut clients = Vec::new();
    for _ in 0..workers {
        clients.push(factory(namespace.to_owned()).await?);
    }
    let mut tasks = Vec::new();
    for (worker, backend) in clients.into_iter().enumerate() {
        let (read, write) = (read.clone(), write.clone());
        let key = key.to_owned();
        // Rejections of one worker are bounded by the commits of all others.
        let max_attempts = workers * increments + increments;
        tasks.push(tokio::spawn(async move {
            read.wait().await;
            let first_read = get(&*backend, &key).await;
            write.wait().await;
            let mut known = first_read?;
            let mut done = 0;
            let mut attempts = 0;
            while done < increments {
                attempts += 1;
                ensure!(
                    attempts <= max_attempts,
                    "worker {worker} made {attempts} attempts for {increments} increments \
                     ({workers} workers): rejected txns do not let it progress"
                );
                let next = (counter_of(&known)? + 1).to_string();
                let outcome = backend
                    .txn(
                        &[Assert::at(key.clone(), known.version)],
                        &[Mutation::put(key.clone(), next.clone())],
                    )
                    .await?;
                if outcome.applied {
                    done += 1;
                    known = Entry::present(
                        key.clone(),
                        Version(known.version.0 + 1),
                        next.into_bytes(),
                    );
                    continue;
                }
                let current = outcome.current.into_iter().find(|e| e.key == key);
                let Some(current) = current else {
                    return Err(Failure::new(format!(
                        "worker {worker}: a rejected txn returned no entry for the asserted key {key:?}"
                    )));
                };
                ensure!(
                    current.version > known.version,
                    "worker {worker}: txn asserting {key:?} at {} was rejected, but the store \
                     reports {} as current (must be higher: versions never go back)",
                    known.version,
                    current.version
                );
                known = current;
            }
            Ok::<usize, Failure>(attempts)
        }));
    }
    let mut attempts = 0;
    let mut first_failure = None;
    for (worker, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(Ok(n)) => attempts += n,
            Ok(Err(failure)) => {
                first_failure.get_or_insert(failure);
            }
            Err(e) => {
                first_failure.get_or_insert(Failure::new(format!("worker {worker} panicked: {e}")));
            }
        }
    }
    if let Some(failure) = first_failure {
        return Err(failure);
    }
    let after = get(&*first, key).await?;
    let end = counter_of(&after)?;
    ensure!(
        end == start + total,
        "{workers} workers x {increments} committed increments moved the counter from {start} \
         to {end} (expected {}): some commits overwrote each other ({attempts} txns sent)",
        start + total
    );
    ensure!(
        after.version == Version(before.version.0 + total),
        "{total} committed puts moved the version from {} to {} (expected exactly +{total})",
        before.version,
        after.version
    );
    Ok(())
}

fn case_increment_race(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        let namespace = unique_namespace("increment_race");
        increment_race(factory, &namespace, "counter", IncrementRace::default()).await
    })
}

/// Sizes of [`snapshot_consistency`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotRace {
    /// Clients writing both keys in one txn, as fast as they can.
    pub writers: usize,
    /// Clients taking snapshots of both keys.
    pub readers: usize,
    /// Snapshots each reader takes at least; readers also go on until the
    /// writers committed this many txns, so reads and writes overlap.
    pub snapshots: usize,
}

impl Default for SnapshotRace {
    fn default() -> Self {
        SnapshotRace {
            writers: 2,
            readers: 2,
            snapshots: 200,
        }
    }
}

/// Writers keep writing two keys together (same value, or deleting both, in
/// one txn); concurrent snapshots of both keys never see them torn (different
/// values or versions).
pub async fn snapshot_consistency(
    factory: BackendFactory,
    namespace: &str,
    options: SnapshotRace,
) -> CheckResult {
    ensure!(
        options.writers > 0 && options.readers > 0,
        "snapshot_consistency needs at least one writer and one reader, got {options:?}"
    );
    let keys = vec!["pair/a".to_owned(), "pair/b".to_owned()];
    let first = factory(namespace.to_owned()).await?;
    let initial = first.snapshot(&keys).await?;
    ensure!(
        initial.iter().all(|e| e.version == Version::MISSING),
        "snapshot_consistency needs an empty namespace, found {initial:?}"
    );
    // Open every client before spawning, so a failing factory leaves no task waiting at a barrier.
    let mut clients = Vec::new();
    for _ in 0..options.writers + options.readers {
        clients.push(factory(namespace.to_owned()).await?);
    }
    let mut reader_clients = clients.split_off(options.writers);
    let stop = Arc::new(AtomicBool::new(false));
    // Readers go on until the writers committed this many txns, so reads and
    // writes overlap whatever order the scheduler runs the tasks in.
    let min_writes = options.snapshots as u64;
    let committed = Arc::new(AtomicU64::new(0));
    let writer_stopped = Arc::new(AtomicBool::new(false));
    let start = Arc::new(tokio::sync::Barrier::new(options.writers + options.readers));
    let mut writers = Vec::new();
    for (writer, backend) in clients.into_iter().enumerate() {
        let (stop, start, keys) = (stop.clone(), start.clone(), keys.clone());
        let (committed, writer_stopped) = (committed.clone(), writer_stopped.clone());
        writers.push(tokio::spawn(async move {
            start.wait().await;
            let result = write_pairs(&*backend, &keys, writer, &stop, &committed).await;
            writer_stopped.store(true, Ordering::SeqCst);
            result
        }));
    }
    let mut readers = Vec::new();
    for (reader, backend) in reader_clients.drain(..).enumerate() {
        let (start, keys) = (start.clone(), keys.clone());
        let (committed, writer_stopped) = (committed.clone(), writer_stopped.clone());
        let snapshots = options.snapshots;
        readers.push(tokio::spawn(async move {
            start.wait().await;
            let mut n = 0;
            while n < snapshots
                || (committed.load(Ordering::SeqCst) < min_writes
                    && !writer_stopped.load(Ordering::SeqCst))
            {
                let seen = backend.snapshot(&keys).await?;
                ensure!(
                    seen.len() == 2,
                    "reader {reader}: a snapshot of 2 keys returned {} entries",
                    seen.len()
                );
                ensure!(
                    seen[0].version == seen[1].version && seen[0].value == seen[1].value,
                    "reader {reader}, snapshot {n}: torn read of two keys always written \
                     together: {:?} at {} vs {:?} at {}",
                    seen[0].value.as_deref().map(String::from_utf8_lossy),
                    seen[0].version,
                    seen[1].value.as_deref().map(String::from_utf8_lossy),
                    seen[1].version
                );
                n += 1;
                tokio::task::yield_now().await;
            }
            Ok::<(), Failure>(())
        }));
    }
    let mut first_failure = None;
    for (reader, task) in readers.into_iter().enumerate() {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(failure)) => {
                first_failure.get_or_insert(failure);
            }
            Err(e) => {
                first_failure.get_or_insert(Failure::new(format!("reader {reader} panicked: {e}")));
            }
        }
    }
    // Stop the writers also when a reader failed, so no task outlives the check.
    stop.store(true, Ordering::SeqCst);
    for (writer, task) in writers.into_iter().enumerate() {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(failure)) => {
                first_failure.get_or_insert(failure);
            }
            Err(e) => {
                first_failure.get_or_insert(Failure::new(format!("writer {writer} panicked: {e}")));
            }
        }
    }
    if let Some(failure) = first_failure {
        return Err(failure);
    }
    let writes = committed.load(Ordering::SeqCst);
    ensure!(
        writes >= min_writes,
        "the writers committed {writes} txns while the readers read (expected at least {min_writes})"
    );
    Ok(())
}

/// Write both keys in one txn (or delete both) until told to stop.
async fn write_pairs(
    backend: &dyn Backend,
    keys: &[String],
    writer: usize,
    stop: &AtomicBool,
    committed: &AtomicU64,
) -> CheckResult {
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        // Every 5th round deletes both: a torn read across a delete shows too.
        let mutations: Vec<Mutation> = match round % 5 {
            0 => keys.iter().map(Mutation::delete).collect(),
            _ => {
                let value = format!("w{writer}-{round}");
                keys.iter()
                    .map(|k| Mutation::put(k, value.clone()))
                    .collect()
            }
        };
        let outcome = backend.txn(&[], &mutations).await?;
        ensure!(
            outcome.applied,
            "writer {writer}: a txn without asserts was rejected: {outcome:?}"
        );
        committed.fetch_add(1, Ordering::SeqCst);
        // Let readers and other writers in between writes on small runtimes.
        tokio::task::yield_now().await;
    }
    Ok(())
}

fn case_snapshot_consistency(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        let namespace = unique_namespace("snapshot_consistency");
        snapshot_consistency(factory, &namespace, SnapshotRace::default()).await
    })
}

/// Two txns that both assert `{A, B}` at the versions they read, one writing
/// `A` and the other `B`, never both commit, over `rounds` races from two
/// clients of one namespace: exactly one applies per round.
///
/// A txn's asserts must hold when it commits, also on the keys it does not
/// write. A store that checks them against a snapshot taken before it waited
/// for a concurrent writer (snapshot isolation, e.g. a SQL store running at
/// REPEATABLE READ) lets both commit: write skew, which no check of a single
/// key or of one client can see.
pub async fn disjoint_write_skew(
    factory: BackendFactory,
    namespace: &str,
    rounds: usize,
) -> CheckResult {
    let keys = vec!["skew/a".to_owned(), "skew/b".to_owned()];
    let first = factory(namespace.to_owned()).await?;
    let initial = first.snapshot(&keys).await?;
    ensure!(
        initial.iter().all(|e| e.version == Version::MISSING),
        "disjoint_write_skew needs an empty namespace, found {initial:?}"
    );
    let clients = [
        factory(namespace.to_owned()).await?,
        factory(namespace.to_owned()).await?,
    ];
    for round in 0..rounds {
        let before = first.snapshot(&keys).await?;
        ensure!(
            before.len() == 2,
            "a snapshot of 2 keys returned {} entries",
            before.len()
        );
        let asserts: Vec<Assert> = before
            .iter()
            .map(|e| Assert::at(e.key.clone(), e.version))
            .collect();
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let mut tasks = Vec::new();
        for (writer, backend) in clients.iter().enumerate() {
            let (backend, start, asserts) = (backend.clone(), start.clone(), asserts.clone());
            let mutation =
                Mutation::put(keys[writer].clone(), format!("round-{round}-by-{writer}"));
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                backend.txn(&asserts, &[mutation]).await
            }));
        }
        let mut winners = Vec::new();
        for (writer, task) in tasks.into_iter().enumerate() {
            let outcome = task
                .await
                .map_err(|e| Failure::new(format!("writer {writer} panicked: {e}")))??;
            if outcome.applied {
                winners.push(writer);
            }
        }
        ensure!(
            winners.len() < 2,
            "round {round}: both txns asserting {{A, B}} at {:?} committed, one writing A and \
             the other B (write skew: an assert on a key the txn does not write was not \
             checked at commit)",
            before.iter().map(|e| e.version).collect::<Vec<_>>()
        );
        ensure!(
            winners.len() == 1,
            "round {round}: both txns were rejected, though nothing else wrote {keys:?}"
        );
        let winner = winners[0];
        let after = first.snapshot(&keys).await?;
        for (i, (old, new)) in before.iter().zip(&after).enumerate() {
            let expected = if i == winner {
                Version(old.version.0 + 1)
            } else {
                old.version
            };
            ensure!(
                new.version == expected,
                "round {round}: {:?} moved from {} to {} (writer {winner} won; expected {expected})",
                new.key,
                old.version,
                new.version
            );
        }
        ensure!(
            after[winner].value.as_deref() == Some(format!("round-{round}-by-{winner}").as_bytes()),
            "round {round}: {:?} does not hold the winner's value",
            after[winner].key
        );
    }
    Ok(())
}

fn case_disjoint_write_skew(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        let namespace = unique_namespace("disjoint_write_skew");
        disjoint_write_skew(factory, &namespace, 64).await
    })
}

async fn require_empty(backend: &dyn Backend, check: &str) -> CheckResult {
    let keys = backend.keys("").await?;
    ensure!(
        keys.is_empty(),
        "{check} needs an empty namespace; {:?} holds {keys:?}",
        backend.namespace()
    );
    Ok(())
}

async fn get(backend: &dyn Backend, key: &str) -> Result<Entry, Failure> {
    let mut entries = backend.snapshot(&[key.to_owned()]).await?;
    ensure!(
        entries.len() == 1,
        "a snapshot of one key returned {} entries",
        entries.len()
    );
    Ok(entries.remove(0))
}

async fn must_apply(
    backend: &dyn Backend,
    asserts: &[Assert],
    mutations: &[Mutation],
    what: &str,
) -> CheckResult {
    let outcome = backend.txn(asserts, mutations).await?;
    ensure!(
        outcome.applied,
        "{what}: txn was rejected, expected it to apply (current: {:?})",
        outcome.current
    );
    ensure!(
        outcome.current.is_empty(),
        "{what}: an applied txn returned entries {:?} (must be empty)",
        outcome.current
    );
    Ok(())
}

async fn must_reject(
    backend: &dyn Backend,
    asserts: &[Assert],
    mutations: &[Mutation],
    what: &str,
) -> Result<Vec<Entry>, Failure> {
    let outcome = backend.txn(asserts, mutations).await?;
    ensure!(
        !outcome.applied,
        "{what}: txn applied, expected a rejection"
    );
    Ok(outcome.current)
}

/// Versions move by exactly 1 per write (put or delete), a deleted key reads
/// as missing, deleting a missing key is allowed and still counts, and after a
/// delete and re-create the version is higher than any seen before, so a stale
/// assert never passes again (ABA).
pub async fn version_monotonic(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "version_monotonic").await?;
    let key = "mono";
    let mut expected = 0;
    for n in 1..=3 {
        must_apply(
            backend,
            &[Assert::at(key, Version(expected))],
            &[Mutation::put(key, format!("v{n}"))],
            &format!("put #{n}"),
        )
        .await?;
        expected += 1;
        let entry = get(backend, key).await?;
        ensure!(
            entry.version == Version(expected),
            "after {n} puts of a new key its version is {} (expected v{expected}: +1 per put)",
            entry.version
        );
    }
    must_apply(
        backend,
        &[Assert::at(key, Version(expected))],
        &[Mutation::delete(key)],
        "delete",
    )
    .await?;
    expected += 1;
    let deleted = get(backend, key).await?;
    ensure!(
        deleted == Entry::missing(key),
        "a deleted key reads as {deleted:?} (expected missing: version 0, no value)"
    );
    ensure!(
        backend.keys("").await?.is_empty(),
        "keys() lists a deleted key"
    );
    // Deleting a missing key is allowed and bumps the hidden counter too.
    must_apply(
        backend,
        &[Assert::missing(key)],
        &[Mutation::delete(key)],
        "delete of a missing key",
    )
    .await?;
    expected += 1;
    must_apply(
        backend,
        &[Assert::missing(key)],
        &[Mutation::put(key, "again")],
        "re-create after delete",
    )
    .await?;
    expected += 1;
    let recreated = get(backend, key).await?;
    ensure!(
        recreated.version > Version(3),
        "re-created key got {} although v3 was seen before the delete: versions are reused",
        recreated.version
    );
    ensure!(
        recreated.version == Version(expected),
        "3 puts, 2 deletes and a re-create gave {} (expected v{expected}: every write, \
         deletes included, moves the hidden counter by exactly 1)",
        recreated.version
    );

    // ABA: a stale assert must not pass after delete + re-create reaches the same count.
    let aba = "aba";
    must_apply(
        backend,
        &[Assert::missing(aba)],
        &[Mutation::put(aba, "1")],
        "aba put 1",
    )
    .await?;
    let stale = Version(2);
    must_apply(
        backend,
        &[Assert::at(aba, Version(1))],
        &[Mutation::put(aba, "2")],
        "aba put 2",
    )
    .await?;
    must_apply(
        backend,
        &[Assert::at(aba, stale)],
        &[Mutation::delete(aba)],
        "aba delete",
    )
    .await?;
    must_apply(
        backend,
        &[Assert::missing(aba)],
        &[Mutation::put(aba, "3")],
        "aba re-create",
    )
    .await?;
    let now = get(backend, aba).await?.version;
    must_apply(
        backend,
        &[Assert::at(aba, now)],
        &[Mutation::put(aba, "4")],
        "aba put 4",
    )
    .await?;
    let current = get(backend, aba).await?;
    ensure!(
        current.version > stale,
        "after put, put, delete, put, put the version is {} (must exceed {stale})",
        current.version
    );
    let outcome = backend
        .txn(&[Assert::at(aba, stale)], &[Mutation::put(aba, "stale")])
        .await?;
    ensure!(
        !outcome.applied,
        "a txn asserting the stale {stale} (seen before a delete and re-create) was applied: ABA"
    );
    ensure!(
        get(backend, aba).await? == current,
        "a rejected stale txn changed the key"
    );
    Ok(())
}

fn case_version_monotonic(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        version_monotonic(factory(unique_namespace("version_monotonic")).await?).await
    })
}

/// Create-if-missing (assert version 0) succeeds once, a second one is
/// rejected with the existing entry, and it succeeds again after a delete. A
/// txn with asserts and no mutations applies and writes nothing.
pub async fn assert_missing(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "assert_missing").await?;
    let key = "once";
    must_apply(
        backend,
        &[Assert::missing(key)],
        &[Mutation::put(key, "first")],
        "first create",
    )
    .await?;
    let created = get(backend, key).await?;
    ensure!(
        created == Entry::present(key, Version(1), b"first".to_vec()),
        "after a create the key reads {created:?}"
    );
    let current = must_reject(
        backend,
        &[Assert::missing(key)],
        &[Mutation::put(key, "second")],
        "second create-if-missing",
    )
    .await?;
    ensure!(
        current == vec![created.clone()],
        "the rejected create returned {current:?} (expected the existing entry {created:?})"
    );
    ensure!(
        get(backend, key).await? == created,
        "a rejected create changed the key"
    );
    must_apply(
        backend,
        &[Assert::at(key, Version(1))],
        &[Mutation::delete(key)],
        "delete",
    )
    .await?;
    must_apply(
        backend,
        &[Assert::missing(key)],
        &[Mutation::put(key, "third")],
        "create-if-missing on a deleted key",
    )
    .await?;
    let recreated = get(backend, key).await?;
    ensure!(
        recreated.value.as_deref() == Some(&b"third"[..]),
        "re-created key reads {recreated:?}"
    );
    // Asserts only: applies, writes nothing.
    must_apply(backend, &[Assert::missing("never")], &[], "assert-only txn").await?;
    ensure!(
        get(backend, "never").await? == Entry::missing("never"),
        "an assert-only txn created a key"
    );
    Ok(())
}

fn case_assert_missing(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(
        async move { assert_missing(factory(unique_namespace("assert_missing")).await?).await },
    )
}

fn names(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

/// One false assert among several makes the whole txn write nothing (every key
/// checked unchanged); several puts and deletes of one applied txn all land,
/// each moving its key's version by exactly 1.
pub async fn all_or_nothing(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "all_or_nothing").await?;
    let all = names(&["k1", "k2", "k3", "k4"]);
    must_apply(
        backend,
        &[
            Assert::missing("k1"),
            Assert::missing("k2"),
            Assert::missing("k3"),
        ],
        &[
            Mutation::put("k1", "one"),
            Mutation::put("k2", "two"),
            Mutation::put("k3", "three"),
        ],
        "create three keys in one txn",
    )
    .await?;
    let before = backend.snapshot(&all).await?;
    let expected_before = vec![
        Entry::present("k1", Version(1), b"one".to_vec()),
        Entry::present("k2", Version(1), b"two".to_vec()),
        Entry::present("k3", Version(1), b"three".to_vec()),
        Entry::missing("k4"),
    ];
    ensure!(
        before == expected_before,
        "three puts in one txn read back as {before:?}"
    );
    let writes = [
        Mutation::put("k1", "x"),
        Mutation::delete("k2"),
        Mutation::put("k4", "x"),
        Mutation::delete("k3"),
    ];
    let false_asserts: [&[Assert]; 3] = [
        // the last of several asserts is false
        &[
            Assert::at("k1", Version(1)),
            Assert::at("k2", Version(1)),
            Assert::at("k3", Version(7)),
        ],
        // the first is false
        &[Assert::at("k1", Version(2)), Assert::at("k2", Version(1))],
        // a key that is not written is asserted present but is missing
        &[
            Assert::at("k1", Version(1)),
            Assert::at("k2", Version(1)),
            Assert::at("elsewhere", Version(1)),
        ],
    ];
    for asserts in false_asserts {
        must_reject(backend, asserts, &writes, &format!("asserts {asserts:?}")).await?;
        let after = backend.snapshot(&all).await?;
        ensure!(
            after == before,
            "a txn with one false assert among {asserts:?} changed keys: before {before:?}, \
             after {after:?}"
        );
        ensure!(
            get(backend, "elsewhere").await? == Entry::missing("elsewhere"),
            "a rejected txn created a key"
        );
    }
    must_apply(
        backend,
        &[
            Assert::at("k1", Version(1)),
            Assert::at("k2", Version(1)),
            Assert::at("k3", Version(1)),
            Assert::missing("k4"),
        ],
        &writes,
        "two puts and two deletes with true asserts",
    )
    .await?;
    let after = backend.snapshot(&all).await?;
    let expected = vec![
        Entry::present("k1", Version(2), b"x".to_vec()),
        Entry::missing("k2"),
        Entry::missing("k3"),
        Entry::present("k4", Version(1), b"x".to_vec()),
    ];
    ensure!(
        after == expected,
        "after one txn of puts and deletes: {after:?} (expected {expected:?})"
    );
    let listed = backend.keys("k").await?;
    ensure!(
        listed == names(&["k1", "k4"]),
        "keys(\"k\") lists {listed:?} after deleting k2 and k3"
    );
    // The deletes of the multi-key txn counted: re-creating k2 gives v3.
    must_apply(
        backend,
        &[Assert::missing("k2")],
        &[Mutation::put("k2", "back")],
        "re-create k2",
    )
    .await?;
    let k2 = get(backend, "k2").await?;
    ensure!(
        k2.version == Version(3),
        "k2 (put, deleted in a multi-key txn, re-created) is at {} (expected v3)",
        k2.version
    );
    Ok(())
}

fn case_all_or_nothing(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(
        async move { all_or_nothing(factory(unique_namespace("all_or_nothing")).await?).await },
    )
}

/// A rejected txn returns the TRUE current entries of the asserted keys: one
/// per distinct key, in assert order, with the current version and value,
/// missing and deleted keys as missing; never stale, never empty.
pub async fn rejected_txn_current(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "rejected_txn_current").await?;
    must_apply(
        backend,
        &[],
        &[
            Mutation::put("a", "a1"),
            Mutation::put("b", "b1"),
            Mutation::put("d", vec![0u8, 255, 7]),
        ],
        "setup",
    )
    .await?;
    must_apply(
        backend,
        &[],
        &[Mutation::put("a", "a2"), Mutation::delete("b")],
        "setup 2",
    )
    .await?;
    // a: v2 "a2"; b: deleted (tombstone at v2); c: never written; d: v1.
    let asserts = [
        Assert::at("a", Version(1)), // stale
        Assert::missing("b"),        // true
        Assert::at("c", Version(5)), // false: c is missing
        Assert::at("a", Version(1)), // duplicate, same version
        Assert::at("d", Version(1)), // true
    ];
    let current = must_reject(
        backend,
        &asserts,
        &[Mutation::put("a", "never"), Mutation::put("e", "never")],
        "txn with a stale assert",
    )
    .await?;
    let expected = vec![
        Entry::present("a", Version(2), b"a2".to_vec()),
        Entry::missing("b"),
        Entry::missing("c"),
        Entry::present("d", Version(1), vec![0u8, 255, 7]),
    ];
    ensure!(
        current == expected,
        "a rejected txn returned current entries {current:?}; the store holds {expected:?} \
         (one per distinct asserted key, in assert order)"
    );
    let after = backend.snapshot(&names(&["a", "b", "c", "d", "e"])).await?;
    let mut unchanged = expected.clone();
    unchanged.push(Entry::missing("e"));
    ensure!(
        after == unchanged,
        "the rejected txn changed something: {after:?} (expected {unchanged:?})"
    );
    // After another writer moved the key, the entries are the new ones.
    must_apply(
        backend,
        &[Assert::at("a", Version(2))],
        &[Mutation::put("a", "a3")],
        "move a",
    )
    .await?;
    let current = must_reject(
        backend,
        &[Assert::at("a", Version(2))],
        &[Mutation::delete("a")],
        "txn asserting the previous version",
    )
    .await?;
    let expected = vec![Entry::present("a", Version(3), b"a3".to_vec())];
    ensure!(
        current == expected,
        "after a moved to v3, a rejected txn returned {current:?} (expected {expected:?})"
    );
    Ok(())
}

fn case_rejected_txn_current(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        rejected_txn_current(factory(unique_namespace("rejected_txn_current")).await?).await
    })
}

/// A snapshot returns one entry per distinct key in the order of first
/// appearance, missing keys as version 0 without value, and nothing for an
/// empty key list.
pub async fn snapshot_semantics(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "snapshot_semantics").await?;
    must_apply(
        backend,
        &[],
        &[Mutation::put("x", "vx"), Mutation::put("z", "vz")],
        "setup",
    )
    .await?;
    let empty = backend.snapshot(&[]).await?;
    ensure!(empty.is_empty(), "a snapshot of no keys returned {empty:?}");
    let seen = backend
        .snapshot(&names(&["z", "x", "y", "x", "z", "y"]))
        .await?;
    let expected = vec![
        Entry::present("z", Version(1), b"vz".to_vec()),
        Entry::present("x", Version(1), b"vx".to_vec()),
        Entry::missing("y"),
    ];
    ensure!(
        seen == expected,
        "snapshot [z, x, y, x, z, y] returned {seen:?} (expected {expected:?}: duplicates once, \
         first-appearance order, missing as v0 without value)"
    );
    let missing = backend.snapshot(&names(&["nope"])).await?;
    ensure!(
        missing == vec![Entry::missing("nope")],
        "a never-written key reads as {missing:?}"
    );
    Ok(())
}

fn case_snapshot_semantics(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        snapshot_semantics(factory(unique_namespace("snapshot_semantics")).await?).await
    })
}

/// Keys a LIKE pattern, a glob, a regex or a case-/accent-insensitive
/// collation would confuse with each other.
#[rustfmt::skip]
const LITERAL_KEYS: &[&str] = &[
    "a", "A", "a_", "a_b", "ab", "abc", "a%", "a%c", "a*", "a*x", "aa", "a?", "a?b", "a.b", "a.c",
    "a^", "a|b", "a b", "a[b]", "[a]", "[a]x", "a", "b", "{a}", "{", "}", "\\", "\\x", "x\\y", "%",
    "_", "*", "?", "$", "é", "éa", "É", "e", "ea", "e\u{301}", "中", "中文", "😀", "😀x", "a\u{7f}",
    "a\u{ff}", "a\u{10FFFF}",
];

#[rustfmt::skip]
const LITERAL_PREFIXES: &[&str] = &[
    "", "a", "a_", "a%", "a*", "a?", "a.", "a[", "[a]", "[", "{", "}", "\\", "x\\", "%", "_", "*",
    "?", "é", "e", "É", "E", "中", "😀", "A", "a b", "zzz",
];

/// `keys(prefix)` lists existing keys sorted by bytes, never deleted ones, and
/// matches the prefix literally: `a_` does not match `ab`, `a%` not `abc`,
/// `a*` not `aa`, `[a]` and `\` only themselves, `é` not `e`, `a` not `A`.
/// The empty prefix lists every key of the namespace.
pub async fn keys_literal_prefix(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "keys_literal_prefix").await?;
    let mut stored: Vec<String> = LITERAL_KEYS.iter().map(|k| (*k).to_owned()).collect();
    stored.sort();
    stored.dedup();
    let mutations: Vec<Mutation> = stored
        .iter()
        .map(|k| Mutation::put(k, k.as_bytes().to_vec()))
        .chain(["a_gone", "gone"].map(|k| Mutation::put(k, "x")))
        .collect();
    must_apply(backend, &[], &mutations, "write the literal keys").await?;
    must_apply(
        backend,
        &[],
        &[Mutation::delete("a_gone"), Mutation::delete("gone")],
        "delete two keys",
    )
    .await?;
    let prefixes = LITERAL_PREFIXES
        .iter()
        .copied()
        .chain(stored.iter().map(String::as_str));
    for prefix in prefixes {
        let listed = backend.keys(prefix).await?;
        let expected: Vec<String> = stored
            .iter()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        ensure!(
            listed == expected,
            "keys({prefix:?}) returned {listed:?}, expected {expected:?} (sorted by bytes, \
             prefix matched literally, deleted keys excluded)"
        );
    }
    Ok(())
}

fn case_keys_literal_prefix(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        keys_literal_prefix(factory(unique_namespace("keys_literal_prefix")).await?).await
    })
}

/// Backends of namespaces `<root>a`, `<root>ab` and `<root>a:b` never see each
/// other's keys: not via snapshot, keys or txn asserts. The key sets are chosen
/// so that a store joining namespace and key by concatenation (`a`+`bk` =
/// `ab`+`k`) or with a `:` (`a`:`b:x` = `a:b`:`x`) collides.
pub async fn namespace_isolation(factory: BackendFactory) -> CheckResult {
    let root = unique_namespace("iso");
    // (namespace suffix, [(key, how many puts)]): colliding keys get different versions.
    let plan: [(&str, &[(&str, u64)]); 3] = [
        ("a", &[("k", 3), ("b:x", 1), ("bk", 2), ("b", 1)]),
        ("ab", &[("k", 1), ("x", 2)]),
        ("a:b", &[("x", 3), ("k", 2)]),
    ];
    let mut all_keys: Vec<String> = plan
        .iter()
        .flat_map(|(_, keys)| keys.iter().map(|(k, _)| (*k).to_owned()))
        .collect();
    all_keys.sort();
    all_keys.dedup();
    let mut stores = Vec::new();
    for (suffix, keys) in plan {
        let namespace = format!("{root}{suffix}");
        let backend = factory(namespace.clone()).await?;
        let mut own = BTreeMap::new();
        for (key, puts) in keys {
            for n in 1..=*puts {
                let value = format!("{suffix}/{key}/{n}");
                must_apply(
                    &*backend,
                    &[Assert::at(*key, Version(n - 1))],
                    &[Mutation::put(*key, value.clone())],
                    &format!("namespace {namespace:?}: put #{n} of {key:?} (another namespace's key is visible)"),
                )
                .await?;
                own.insert(
                    (*key).to_owned(),
                    Entry::present(*key, Version(n), value.into_bytes()),
                );
            }
        }
        stores.push((namespace, backend, own));
    }
    for (namespace, backend, own) in &stores {
        let listed = backend.keys("").await?;
        let expected: Vec<String> = own.keys().cloned().collect();
        ensure!(
            listed == expected,
            "namespace {namespace:?}: keys(\"\") returned {listed:?}, it holds {expected:?}"
        );
        for prefix in ["b", "k", "x", "a"] {
            let listed = backend.keys(prefix).await?;
            let expected: Vec<String> = own
                .keys()
                .filter(|k| k.starts_with(prefix))
                .cloned()
                .collect();
            ensure!(
                listed == expected,
                "namespace {namespace:?}: keys({prefix:?}) returned {listed:?}, expected {expected:?}"
            );
        }
        let seen = backend.snapshot(&all_keys).await?;
        let expected: Vec<Entry> = all_keys
            .iter()
            .map(|k| own.get(k).cloned().unwrap_or_else(|| Entry::missing(k)))
            .collect();
        ensure!(
            seen == expected,
            "namespace {namespace:?}: snapshot returned {seen:?}, it holds {expected:?}"
        );
        for key in &all_keys {
            let mine = own.get(key).map_or(Version::MISSING, |e| e.version);
            must_apply(
                &**backend,
                &[Assert::at(key, mine)],
                &[],
                &format!("namespace {namespace:?}: assert {key:?} at its own {mine}"),
            )
            .await?;
            for (other, _, theirs) in stores.iter().filter(|(n, _, _)| n != namespace) {
                let Some(entry) = theirs.get(key) else {
                    continue;
                };
                if entry.version == mine {
                    continue;
                }
                must_reject(
                    &**backend,
                    &[Assert::at(key, entry.version)],
                    &[],
                    &format!(
                        "namespace {namespace:?}: assert {key:?} at {} (its version in {other:?})",
                        entry.version
                    ),
                )
                .await?;
            }
        }
    }
    Ok(())
}

fn case_namespace_isolation(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(namespace_isolation(factory))
}

/// Whether an [`InvalidInput`] is the expected reason.
type IsReason = fn(&InvalidInput) -> bool;

fn expect_invalid<T: fmt::Debug>(
    result: coord_backend::Result<T>,
    what: &str,
    kind: IsReason,
) -> CheckResult {
    match result {
        Err(Error::InvalidInput(reason)) if kind(&reason) => Ok(()),
        Err(Error::InvalidInput(reason)) => Err(Failure::new(format!(
            "{what}: refused as invalid input, but for the wrong reason: {reason}"
        ))),
        other => Err(Failure::new(format!(
            "{what}: expected Error::InvalidInput, got {other:?}"
        ))),
    }
}

/// Bad input (empty key, key over the limit, NUL in a key, value over the
/// limit, one key written twice in a txn, NUL in a prefix) is refused with
/// [`Error::InvalidInput`] and nothing stored changes, also when the txn
/// carried valid writes next to the bad one. A key of exactly the limit is fine.
pub async fn bad_input(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "bad_input").await?;
    let limits = backend.limits();
    must_apply(
        backend,
        &[],
        &[Mutation::put("keep1", "one"), Mutation::put("keep2", "two")],
        "setup",
    )
    .await?;
    let kept = names(&["keep1", "keep2"]);
    let before = backend.snapshot(&kept).await?;
    let long_key = "k".repeat(limits.max_key_bytes + 1);
    let big_value = vec![7u8; limits.max_value_bytes + 1];
    // Each txn asserts the true versions and writes valid keys next to the bad
    // mutation: a store that validated late would apply them.
    let valid_asserts = [
        Assert::at("keep1", Version(1)),
        Assert::at("keep2", Version(1)),
    ];
    let bad: Vec<(&str, Vec<Mutation>, IsReason)> = vec![
        ("empty key", vec![Mutation::put("", "x")], |r| {
            matches!(r, InvalidInput::EmptyKey)
        }),
        (
            "key over max_key_bytes",
            vec![Mutation::put(long_key.clone(), "x")],
            |r| matches!(r, InvalidInput::KeyTooLong { .. }),
        ),
        ("NUL in key", vec![Mutation::put("nul\0key", "x")], |r| {
            matches!(r, InvalidInput::NulByte(_))
        }),
        (
            "value over max_value_bytes",
            vec![Mutation::put("big", big_value)],
            |r| matches!(r, InvalidInput::ValueTooLarge { .. }),
        ),
        (
            "one key written twice",
            vec![Mutation::put("twice", "a"), Mutation::delete("twice")],
            |r| matches!(r, InvalidInput::DuplicateMutation(_)),
        ),
        (
            "delete with an empty key",
            vec![Mutation::delete("")],
            |r| matches!(r, InvalidInput::EmptyKey),
        ),
    ];
    for (what, bad_mutations, kind) in bad {
        let mut mutations = vec![Mutation::put("keep1", "changed"), Mutation::delete("keep2")];
        mutations.extend(bad_mutations);
        expect_invalid(backend.txn(&valid_asserts, &mutations).await, what, kind)?;
        // Also when the bad mutation comes first.
        mutations.rotate_left(2);
        expect_invalid(backend.txn(&valid_asserts, &mutations).await, what, kind)?;
    }
    expect_invalid(
        backend
            .txn(&[Assert::missing("")], &[Mutation::put("keep1", "changed")])
            .await,
        "assert on an empty key",
        |r| matches!(r, InvalidInput::EmptyKey),
    )?;
    expect_invalid(
        backend
            .txn(
                &[Assert::missing("a\0")],
                &[Mutation::put("keep1", "changed")],
            )
            .await,
        "assert on a key with NUL",
        |r| matches!(r, InvalidInput::NulByte(_)),
    )?;
    expect_invalid(
        backend.snapshot(&names(&["keep1", ""])).await,
        "snapshot of an empty key",
        |r| matches!(r, InvalidInput::EmptyKey),
    )?;
    expect_invalid(
        backend.snapshot(std::slice::from_ref(&long_key)).await,
        "snapshot of a key over max_key_bytes",
        |r| matches!(r, InvalidInput::KeyTooLong { .. }),
    )?;
    expect_invalid(
        backend.snapshot(&names(&["x\0"])).await,
        "snapshot of a key with NUL",
        |r| matches!(r, InvalidInput::NulByte(_)),
    )?;
    expect_invalid(
        backend.keys("ke\0").await,
        "keys with NUL in the prefix",
        |r| matches!(r, InvalidInput::NulByte(_)),
    )?;
    let after = backend.snapshot(&kept).await?;
    ensure!(
        after == before,
        "refused txns changed stored keys: before {before:?}, after {after:?}"
    );
    let listed = backend.keys("").await?;
    ensure!(
        listed == kept,
        "refused txns created keys: the namespace holds {listed:?}"
    );
    // The limit itself is allowed.
    let max_key = "m".repeat(limits.max_key_bytes);
    must_apply(
        backend,
        &[Assert::missing(max_key.clone())],
        &[Mutation::put(max_key.clone(), "edge")],
        "key of exactly max_key_bytes",
    )
    .await?;
    let edge = get(backend, &max_key).await?;
    ensure!(
        edge.value.as_deref() == Some(&b"edge"[..]),
        "a key of exactly max_key_bytes reads back as {:?}",
        edge.value
    );
    Ok(())
}

fn case_bad_input(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move { bad_input(factory(unique_namespace("bad_input")).await?).await })
}

fn describe_bytes(expected: &[u8], got: Option<&[u8]>) -> String {
    match got {
        None => format!("missing (expected {} bytes)", expected.len()),
        Some(got) => {
            let first_diff = expected.iter().zip(got).position(|(a, b)| a != b);
            format!(
                "{} bytes read back for {} written, first difference at {first_diff:?}",
                got.len(),
                expected.len()
            )
        }
    }
}

/// A value of exactly `limits().max_value_bytes` random bytes (every byte
/// value, 0x00 and 0xFF included) round-trips byte-exact through a put, a
/// snapshot and a rejected txn's entries; a zero-length value exists (it is
/// not missing).
pub async fn large_values(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "large_values").await?;
    let max = backend.limits().max_value_bytes;
    for round in 1..=2u64 {
        let mut value = vec![0u8; max];
        rand::Rng::fill(&mut rand::rng(), &mut value[..]);
        for (i, byte) in value.iter_mut().take(256).enumerate() {
            *byte = i as u8;
        }
        if let Some(last) = value.last_mut() {
            *last = 0xFF;
        }
        must_apply(
            backend,
            &[Assert::at("big", Version(round - 1))],
            &[Mutation::put("big", value.clone())],
            &format!("put of {max} bytes"),
        )
        .await?;
        let read = get(backend, "big").await?;
        ensure!(
            read.value.as_deref() == Some(&value[..]) && read.version == Version(round),
            "value of {max} bytes: {} (version {})",
            describe_bytes(&value, read.value.as_deref()),
            read.version
        );
        let current = must_reject(
            backend,
            &[Assert::missing("big")],
            &[Mutation::delete("big")],
            "txn asserting the big key missing",
        )
        .await?;
        ensure!(
            current.len() == 1 && current[0].value.as_deref() == Some(&value[..]),
            "a rejected txn's entry for a value of {max} bytes: {}",
            describe_bytes(&value, current.first().and_then(|e| e.value.as_deref()))
        );
    }
    must_apply(
        backend,
        &[Assert::missing("empty")],
        &[Mutation::put("empty", Vec::new())],
        "put of an empty value",
    )
    .await?;
    let empty = get(backend, "empty").await?;
    ensure!(
        empty == Entry::present("empty", Version(1), Vec::new()),
        "an empty value reads back as {empty:?} (expected present at v1 with 0 bytes)"
    );
    ensure!(
        backend.keys("em").await? == names(&["empty"]),
        "keys() does not list a key holding an empty value"
    );
    must_reject(
        backend,
        &[Assert::missing("empty")],
        &[Mutation::put("empty", "x")],
        "assert missing on a key holding an empty value",
    )
    .await?;
    Ok(())
}

fn case_large_values(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move { large_values(factory(unique_namespace("large_values")).await?).await })
}

/// Options of [`model_sequences`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelOptions {
    /// Random sequences to run (each in a fresh namespace).
    pub cases: u32,
    /// Most operations in one sequence.
    pub max_ops: usize,
    /// Seed of the generator; `None` = random (the failure message names the seed used).
    pub seed: Option<u64>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            cases: 64,
            max_ops: 30,
            seed: None,
        }
    }
}

/// A small alphabet with keys that are prefixes of each other and look like patterns.
const MODEL_KEYS: &[&str] = &["a", "ab", "a_b", "a%", "b", "é"];
const MODEL_PREFIXES: &[&str] = &["", "a", "a_", "a%", "ab", "b", "e", "é", "x"];
const MODEL_VALUES: &[&[u8]] = &[b"", b"x", b"yy", &[0, 255]];

/// Which version an assert of a generated txn names, resolved against the
/// model when the operation runs (so "correct" stays correct after shrinking).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The key's current version.
    Current,
    /// Version 0 (true only when the key is missing).
    Missing,
    /// The current version plus this (always false).
    Ahead(u64),
    /// This exact version (true only by coincidence).
    Exactly(u64),
}

/// One generated operation; printed as the minimal failing sequence.
#[derive(Clone, PartialEq, Eq)]
enum Op {
    Snapshot(Vec<&'static str>),
    Txn {
        asserts: Vec<(&'static str, Expect)>,
        /// `None` = delete.
        mutations: Vec<(&'static str, Option<&'static [u8]>)>,
    },
    Keys(&'static str),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Snapshot(keys) => write!(f, "snapshot {keys:?}"),
            Op::Keys(prefix) => write!(f, "keys {prefix:?}"),
            Op::Txn { asserts, mutations } => {
                write!(f, "txn asserts [")?;
                for (i, (key, expect)) in asserts.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    match expect {
                        Expect::Current => write!(f, "{sep}{key:?}@current")?,
                        Expect::Missing => write!(f, "{sep}{key:?}@missing")?,
                        Expect::Ahead(n) => write!(f, "{sep}{key:?}@current+{n}")?,
                        Expect::Exactly(v) => write!(f, "{sep}{key:?}@v{v}")?,
                    }
                }
                write!(f, "] mutations [")?;
                for (i, (key, value)) in mutations.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    match value {
                        Some(v) => write!(f, "{sep}put {key:?}={v:?}")?,
                        None => write!(f, "{sep}delete {key:?}")?,
                    }
                }
                write!(f, "]")
            }
        }
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    use proptest::prelude::*;
    use proptest::sample::select;
    let key = select(MODEL_KEYS);
    let expect = prop_oneof![
        3 => Just(Expect::Current),
        1 => Just(Expect::Missing),
        1 => (1u64..3).prop_map(Expect::Ahead),
        1 => (0u64..4).prop_map(Expect::Exactly),
    ];
    let snapshot = proptest::collection::vec(key.clone(), 0..5).prop_map(Op::Snapshot);
    let txn = (
        proptest::collection::vec((key.clone(), expect), 0..4),
        proptest::collection::vec((key, proptest::option::of(select(MODEL_VALUES))), 0..4),
    )
        .prop_map(|(asserts, mutations)| {
            // A repeated assert repeats the first one's expectation (two
            // different versions for one key would be invalid input); a key is
            // written at most once per txn.
            let mut first: HashMap<&str, Expect> = HashMap::new();
            let asserts = asserts
                .into_iter()
                .map(|(k, e)| (k, *first.entry(k).or_insert(e)))
                .collect();
            let mut written = HashSet::new();
            let mutations = mutations
                .into_iter()
                .filter(|(k, _)| written.insert(*k))
                .collect();
            Op::Txn { asserts, mutations }
        });
    let keys = select(MODEL_PREFIXES).prop_map(Op::Keys);
    prop_oneof![2 => snapshot, 5 => txn, 2 => keys]
}

/// The reference: the memory store's semantics in a few lines.
#[derive(Default)]
struct Model {
    /// key -> (hidden counter, value); `None` = tombstone.
    cells: BTreeMap<String, (u64, Option<Vec<u8>>)>,
}

impl Model {
    fn entry(&self, key: &str) -> Entry {
        match self.cells.get(key) {
            Some((version, Some(value))) => Entry::present(key, Version(*version), value.clone()),
            _ => Entry::missing(key),
        }
    }

    fn snapshot(&self, keys: &[String]) -> Vec<Entry> {
        let mut seen = HashSet::new();
        keys.iter()
            .filter(|k| seen.insert(k.as_str()))
            .map(|k| self.entry(k))
            .collect()
    }

    fn txn(&mut self, asserts: &[Assert], mutations: &[Mutation]) -> TxnOutcome {
        if asserts
            .iter()
            .any(|a| self.entry(&a.key).version != a.version)
        {
            let keys: Vec<String> = asserts.iter().map(|a| a.key.clone()).collect();
            return TxnOutcome::rejected(self.snapshot(&keys));
        }
        for mutation in mutations {
            let cell = self.cells.entry(mutation.key().to_owned()).or_default();
            cell.0 += 1;
            cell.1 = match mutation {
                Mutation::Put { value, .. } => Some(value.clone()),
                Mutation::Delete { .. } => None,
            };
        }
        TxnOutcome::applied()
    }

    fn keys(&self, prefix: &str) -> Vec<String> {
        self.cells
            .iter()
            .filter(|(k, (_, v))| k.starts_with(prefix) && v.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

async fn run_sequence(factory: BackendFactory, ops: Vec<Op>) -> CheckResult {
    let backend = factory(unique_namespace("model")).await?;
    let mut model = Model::default();
    for (i, op) in ops.iter().enumerate() {
        let context =
            |e: coord_backend::Error| Failure::new(format!("op #{i} ({op:?}): store error: {e}"));
        match op {
            Op::Snapshot(keys) => {
                let keys = names(keys);
                let got = backend.snapshot(&keys).await.map_err(context)?;
                let want = model.snapshot(&keys);
                ensure!(
                    got == want,
                    "op #{i} ({op:?}): the store returned {got:?}, the model {want:?}"
                );
            }
            Op::Keys(prefix) => {
                let got = backend.keys(prefix).await.map_err(context)?;
                let want = model.keys(prefix);
                ensure!(
                    got == want,
                    "op #{i} ({op:?}): the store listed {got:?}, the model {want:?}"
                );
            }
            Op::Txn { asserts, mutations } => {
                let asserts: Vec<Assert> = asserts
                    .iter()
                    .map(|(key, expect)| {
                        let current = model.entry(key).version.0;
                        let version = match expect {
                            Expect::Current => current,
                            Expect::Missing => 0,
                            Expect::Ahead(n) => current + n,
                            Expect::Exactly(v) => *v,
                        };
                        Assert::at(*key, Version(version))
                    })
                    .collect();
                let mutations: Vec<Mutation> = mutations
                    .iter()
                    .map(|(key, value)| match value {
                        Some(v) => Mutation::put(*key, v.to_vec()),
                        None => Mutation::delete(*key),
                    })
                    .collect();
                let got = backend.txn(&asserts, &mutations).await.map_err(context)?;
                let want = model.txn(&asserts, &mutations);
                ensure!(
                    got == want,
                    "op #{i} ({op:?}, asserts resolved to {asserts:?}): the store answered \
                     {got:?}, the model {want:?}"
                );
            }
        }
    }
    Ok(())
}

/// Random sequences of snapshot / txn (asserts at current, missing, wrong and
/// arbitrary versions; puts and deletes) / keys(prefix) on a small key
/// alphabet, each in a fresh namespace, compared answer by answer with a
/// reference model (a map with tombstone counters). On a difference proptest
/// shrinks the sequence and the failure names the minimal one and the seed.
///
/// Needs a multi-thread tokio runtime: proptest's runner is synchronous, so
/// it runs inside [`tokio::task::block_in_place`] and drives each sequence
/// with the current runtime's handle (stores whose clients are bound to the
/// runtime keep working).
///
/// ```
/// use std::sync::Arc;
/// use coord_backend::Backend;
/// use coord_conformance::backend::{model_sequences, ModelOptions};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() {
/// let factory = coord_conformance::factory(|namespace| async move {
///     Ok(Arc::new(SingleProcessMemoryBackend::new(&namespace)?) as Arc<dyn Backend>)
/// });
/// let mut options = ModelOptions::default();
/// options.cases = 8;
/// options.seed = Some(7); // replay the seed a failure message named
/// model_sequences(factory, options).await.unwrap();
/// # }
/// ```
pub async fn model_sequences(factory: BackendFactory, options: ModelOptions) -> CheckResult {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|e| Failure::new(format!("model_sequences needs a tokio runtime: {e}")))?;
    ensure!(
        handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread,
        "model_sequences needs a multi-thread tokio runtime \
         (#[tokio::test(flavor = \"multi_thread\")]): it blocks one worker while proptest runs"
    );
    let seed = options.seed.unwrap_or_else(rand::random);
    let config = Config {
        cases: options.cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        // Bounded so a broken network store cannot shrink for minutes.
        max_shrink_iters: 2_000,
        max_shrink_time: 60_000,
        ..Config::default()
    };
    let strategy = proptest::collection::vec(op_strategy(), 1..=options.max_ops.max(1));
    let result = tokio::task::block_in_place(|| {
        let mut runner = TestRunner::new(config);
        runner.run(&strategy, |ops| {
            handle
                .block_on(run_sequence(factory.clone(), ops))
                .map_err(|failure| TestCaseError::fail(failure.message))
        })
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(reason, ops)) => {
            let listing: String = ops
                .iter()
                .enumerate()
                .map(|(i, op)| format!("\n  #{i}: {op:?}"))
                .collect();
            Err(Failure::new(format!(
                "a random sequence failed against the reference model (seed {seed}): {reason}\n\
                 minimal failing sequence ({} ops, each in a fresh namespace):{listing}",
                ops.len()
            )))
        }
        Err(TestError::Abort(reason)) => Err(Failure::new(format!(
            "model test aborted (seed {seed}): {reason}"
        ))),
    }
}

fn case_model_sequences(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(model_sequences(factory, ModelOptions::default()))
}

/// Every case of the backend suite.
pub fn cases() -> Vec<Case> {
    fn case(
        name: &'static str,
        run: fn(BackendFactory) -> BoxFuture<'static, CheckResult>,
    ) -> Case {
        Case {
            suite: "backend",
            name,
            run,
        }
    }
    vec![
        case("concurrent_txn", case_concurrent_txn),
        case("increment_race", case_increment_race),
        case("snapshot_consistency", case_snapshot_consistency),
        case("disjoint_write_skew", case_disjoint_write_skew),
        case("version_monotonic", case_version_monotonic),
        case("assert_missing", case_assert_missing),
        case("all_or_nothing", case_all_or_nothing),
        case("rejected_txn_current", case_rejected_txn_current),
        case("snapshot_semantics", case_snapshot_semantics),
        case("keys_literal_prefix", case_keys_literal_prefix),
        case("namespace_isolation", case_namespace_isolation),
        case("bad_input", case_bad_input),
        case("large_values", case_large_values),
        case("model_sequences", case_model_sequences),
    ]
}

/// Expand the backend suite into one `#[tokio::test]` per case for a
/// [`BackendFactory`] expression (evaluated once per test).
#[macro_export]
macro_rules! backend_tests {
    ($factory:expr) => {
        $crate::__cases_as_tests!($crate::backend::cases, $factory;
            concurrent_txn,
            increment_race,
            snapshot_consistency,
            disjoint_write_skew,
            version_monotonic,
            assert_missing,
            all_or_nothing,
            rejected_txn_current,
            snapshot_semantics,
            keys_literal_prefix,
            namespace_isolation,
            bad_input,
            large_values,
            model_sequences,
        );
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn macro_lists_every_case() {
        let source = include_str!("backend.rs");
        for case in super::cases() {
            assert!(
                source.contains(&format!("            {},\n", case.name)),
                "backend_tests! does not list {}",
                case.name
            );
        }
    }
}
