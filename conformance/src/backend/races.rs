//! Checks that race several clients on one namespace: one winner among
//! writers of one version, compare-and-swap increments that add up exactly,
//! snapshots that never see a txn half applied, and no write skew between
//! two txns asserting the same keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Mutation, Version};

use super::get;
use crate::{ensure, joined, unique_namespace, BackendFactory, BoxFuture, CheckResult, Failure};

/// Await every one of `tasks` (each named `who` and its index), also after
/// one failed, so that none outlives the check: the answers of those that
/// succeeded; the first failure goes to `failure` unless one is there.
async fn settle<T>(
    who: &str,
    tasks: Vec<tokio::task::JoinHandle<Result<T, Failure>>>,
    failure: &mut Option<Failure>,
) -> Vec<T> {
    let mut answers = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        match joined(task, format!("{who} {i}")).await.and_then(|r| r) {
            Ok(answer) => answers.push(answer),
            Err(f) => {
                failure.get_or_insert(f);
            }
        }
    }
    answers
}

/// The first client of `namespace`, where none of `keys` may exist yet
/// (`check` needs an empty namespace).
async fn first_of_empty(
    factory: &BackendFactory,
    namespace: &str,
    keys: &[String],
    check: &str,
) -> Result<Arc<dyn Backend>, Failure> {
    let first = factory(namespace.to_owned()).await?;
    let initial = first.snapshot(keys).await?;
    ensure!(
        initial.iter().all(|e| e.version == Version::MISSING),
        "{check} needs an empty namespace, found {initial:?}"
    );
    Ok(first)
}

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
        if joined(task, format!("worker {worker}")).await??.applied {
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

pub(super) fn case_concurrent_txn(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
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
    let mut first_failure = None;
    let attempts: usize = settle("worker", tasks, &mut first_failure)
        .await
        .into_iter()
        .sum();
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

pub(super) fn case_increment_race(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
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
    let _first = first_of_empty(&factory, namespace, &keys, "snapshot_consistency").await?;
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
    settle("reader", readers, &mut first_failure).await;
    // Stop the writers also when a reader failed, so no task outlives the check.
    stop.store(true, Ordering::SeqCst);
    settle("writer", writers, &mut first_failure).await;
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

pub(super) fn case_snapshot_consistency(
    factory: BackendFactory,
) -> BoxFuture<'static, CheckResult> {
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
    let first = first_of_empty(&factory, namespace, &keys, "disjoint_write_skew").await?;
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
            if joined(task, format!("writer {writer}")).await??.applied {
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

pub(super) fn case_disjoint_write_skew(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        let namespace = unique_namespace("disjoint_write_skew");
        disjoint_write_skew(factory, &namespace, 64).await
    })
}
