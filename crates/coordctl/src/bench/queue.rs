//! `coordctl bench --queue`: the board as a work queue under 1, 8 and 32
//! workers, each figure beside the store's conditional write at the same
//! concurrency, measured in the same run.
//!
//! For each worker count: `--tasks` tasks are added (with `add_many`, not
//! measured), then that many workers (each its own `BoardAdapter`, as
//! separate processes would be) loop `claim_next` + `complete` until the
//! queue is empty. Store calls are counted under the adapters (snapshots,
//! txns, key listings, rejected txns). The baseline: the same number of
//! concurrent callers, each writing its own key with the store's
//! one-round-trip conditional write (assert the version, put), for as long
//! as the queue run took.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::board::{Board, BoardAdapter, BoardOptions, TaskSpec};
use coord_adapters::lock::async_trait;
use coord_backend::{Assert, Backend, Entry, Error, Mutation, TxnOutcome, Version};
use serde::Serialize;

/// Counts the store calls under the adapters (all workers of one run).
#[derive(Debug)]
pub(super) struct Counted {
    inner: Arc<dyn Backend>,
    pub(super) calls: AtomicU64,
    rejected: AtomicU64,
}

impl Counted {
    pub(super) fn new(inner: Arc<dyn Backend>) -> Self {
        Counted {
            inner,
            calls: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// Count from zero again.
    pub(super) fn reset(&self) {
        self.calls.store(0, Ordering::Relaxed);
        self.rejected.store(0, Ordering::Relaxed);
    }
}

#[async_trait]
impl Backend for Counted {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn limits(&self) -> coord_backend::Limits {
        self.inner.limits()
    }

    fn store_name(&self) -> &'static str {
        self.inner.store_name()
    }

    fn changes(&self) -> Option<&dyn coord_backend::Changes> {
        self.inner.changes()
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> coord_backend::Result<Vec<Entry>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.raw_snapshot(keys).await
    }

    async fn raw_txn(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<TxnOutcome> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.raw_txn(asserts, mutations).await?;
        if !outcome.applied {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.raw_keys(prefix).await
    }

    async fn raw_first_keys(
        &self,
        prefix: &str,
        limit: usize,
    ) -> coord_backend::Result<Vec<String>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.raw_first_keys(prefix, limit).await
    }
}

/// One worker count's figures.
#[derive(Debug, Serialize)]
pub(crate) struct QueueRow {
    pub(crate) workers: usize,
    pub(crate) tasks: usize,
    pub(crate) seconds: f64,
    pub(crate) tasks_per_sec: f64,
    /// Store calls per completed task (snapshots, txns, listings).
    pub(crate) round_trips_per_task: f64,
    /// (Lost races + rejected txns) per claim.
    pub(crate) conflicts_per_claim: f64,
    /// The store's conditional write, as many callers at once.
    pub(crate) raw_writes_per_sec: f64,
    /// tasks_per_sec / raw_writes_per_sec.
    pub(crate) ratio: f64,
}

/// Run the queue bench for each of `workers` over `store`, `tasks` tasks each.
pub(crate) async fn measure(
    store: &Arc<dyn Backend>,
    tasks: usize,
    workers: &[usize],
    progress: impl Fn(&str),
) -> Result<Vec<QueueRow>, Error> {
    let mut rows = Vec::new();
    for &n in workers {
        progress(&format!("queue, {n} workers"));
        let counted = Arc::new(Counted::new(store.clone()));
        let options = BoardOptions::default().with_key_prefix(format!("bench-queue-{n}/"));
        let setup = BoardAdapter::with_options(counted.clone(), options.clone());
        // As many per add_many as one txn takes (each task: its record, its
        // marker, its queue entry).
        let per_batch = ((store.limits().max_keys_per_call - 1) / 3).max(1);
        let ids: Vec<String> = (0..tasks).map(|i| format!("t{i:06}")).collect();
        for batch in ids.chunks(per_batch) {
            let specs = batch
                .iter()
                .map(|id| TaskSpec::new(id.as_str(), b"job".to_vec()).in_queue("bench"))
                .collect();
            setup.add_many(specs).await.map_err(board_error)?;
        }
        counted.reset();
        let boards: Vec<BoardAdapter> = (0..n)
            .map(|_| BoardAdapter::with_options(counted.clone(), options.clone()))
            .collect();
        let started = Instant::now();
        let mut running = Vec::new();
        for (w, board) in boards.iter().cloned().enumerate() {
            running.push(tokio::spawn(async move {
                let agent = format!("worker-{w}");
                let mut done = 0u64;
                let ttl = Duration::from_secs(60);
                while let Some(task) = board.claim_next("bench", &agent, ttl).await? {
                    board.complete(&task.id, &task.token, Vec::new()).await?;
                    done += 1;
                }
                Ok::<u64, coord_adapters::board::BoardError>(done)
            }));
        }
        let mut completed = 0;
        for worker in running {
            completed += worker
                .await
                .map_err(|e| Error::Config(format!("a bench worker panicked: {e}")))?
                .map_err(board_error)?;
        }
        let elapsed = started.elapsed();
        if completed != tasks as u64 {
            return Err(Error::Config(format!(
                "{n} workers completed {completed} of {tasks} tasks"
            )));
        }
        let (claims, lost) = boards.iter().fold((0, 0), |(c, l), b| {
            let stats = b.queue_stats();
            (c + stats.claims, l + stats.lost_races)
        });
        let rejected = counted.rejected.load(Ordering::Relaxed);
        let calls = counted.calls.load(Ordering::Relaxed);
        progress(&format!("conditional writes, {n} callers"));
        let raw = raw_writes(store, n, elapsed.max(Duration::from_secs(1))).await?;
        let tasks_per_sec = completed as f64 / elapsed.as_secs_f64();
        rows.push(QueueRow {
            workers: n,
            tasks,
            seconds: elapsed.as_secs_f64(),
            tasks_per_sec,
            round_trips_per_task: calls as f64 / completed as f64,
            conflicts_per_claim: (lost + rejected) as f64 / claims.max(1) as f64,
            raw_writes_per_sec: raw,
            ratio: tasks_per_sec / raw.max(f64::EPSILON),
        });
    }
    Ok(rows)
}

/// Conditional writes per second by `callers` at once, each on its own key,
/// for `during`.
pub(super) async fn raw_writes(
    store: &Arc<dyn Backend>,
    callers: usize,
    during: Duration,
) -> Result<f64, Error> {
    let run = coord_adapters::mint_token()[..8].to_owned();
    let started = Instant::now();
    let mut running = Vec::new();
    for c in 0..callers {
        let store = store.clone();
        let key = format!("bench-raw/{run}/{c}");
        running.push(tokio::spawn(async move {
            let mut version = Version::MISSING;
            let mut writes = 0u64;
            while started.elapsed() < during {
                let outcome = store
                    .txn(
                        &[Assert::at(key.as_str(), version)],
                        &[Mutation::put(key.as_str(), b"v".to_vec())],
                    )
                    .await?;
                if !outcome.applied {
                    return Err(Error::Config(format!(
                        "{key}: a private key changed under the bench"
                    )));
                }
                // The store's reported version when it gives one (etcd's are
                // its own counters), else the next one.
                version = outcome
                    .written
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map_or(Version(version.0 + 1), |(_, v)| *v);
                writes += 1;
            }
            store.txn(&[], &[Mutation::delete(key.as_str())]).await?;
            Ok::<u64, Error>(writes)
        }));
    }
    let mut writes = 0;
    for caller in running {
        writes += caller
            .await
            .map_err(|e| Error::Config(format!("a bench caller panicked: {e}")))??;
    }
    Ok(writes as f64 / started.elapsed().as_secs_f64())
}

pub(super) fn board_error(error: coord_adapters::board::BoardError) -> Error {
    match error {
        coord_adapters::board::BoardError::Store(e) => e,
        other => Error::Config(format!("queue bench: {other}")),
    }
}

/// The queue rows as a table.
pub(crate) fn print(store: &str, rows: &[QueueRow]) {
    println!("coordctl bench --queue: {store}; each worker count: tasks added, then drained by claim_next + complete");
    println!(
        "{:>7} {:>7} {:>8} {:>9} {:>8} {:>10} | {:>22} {:>7}",
        "workers",
        "tasks",
        "seconds",
        "tasks/s",
        "RT/task",
        "confl/claim",
        "cond. writes/s (same n)",
        "ratio"
    );
    for r in rows {
        println!(
            "{:>7} {:>7} {:>8.2} {:>9.0} {:>8.2} {:>10.3} | {:>22.0} {:>7.2}",
            r.workers,
            r.tasks,
            r.seconds,
            r.tasks_per_sec,
            r.round_trips_per_task,
            r.conflicts_per_claim,
            r.raw_writes_per_sec,
            r.ratio
        );
    }
}
