//! Maintenance of a namespace: prune completed records past their
//! retention, then reclaim the store's tombstones, in bounded passes; once
//! ([`run_once`], what `coordctl gc` runs) or in the background
//! ([`spawn_maintenance`], for library users and `coordctl cron`).
//!
//! Both steps are safe with any number of instances running them at once
//! (see [`crate::retention`] and `coord_backend::reclaim`), so every
//! instance of a service may run the background task.

use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Backend, Error, ReclaimOptions};

use crate::board::{BoardAdapter, BoardOptions};
use crate::retention::{PruneOptions, Pruned};
use crate::sideeffect::SideEffectAdapter;

/// What to maintain, and how much per round.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaintenanceOptions {
    /// Remove side-effect keys completed longer ago than this; `None`
    /// (the default) keeps them, so at-most-once holds forever.
    pub side_effects_retention: Option<Duration>,
    /// Remove board tasks completed longer ago than this; `None` (the
    /// default) keeps them.
    pub board_retention: Option<Duration>,
    /// The key prefixes of the boards to prune (default: `board/`, the
    /// default of `BoardOptions::key_prefix`).
    pub board_prefixes: Vec<String>,
    /// Records or tombstones one pass removes at most.
    pub per_pass: usize,
    /// Passes per step in one round (the rest waits for the next round).
    pub max_passes: u32,
    /// The pause between two background rounds (jittered by ±25%).
    pub every: Duration,
    /// Passed to every reclaim ([`ReclaimOptions::older_clients_stopped`]):
    /// the operator's word that no client older than this one writes the
    /// namespace. Default `false`.
    pub older_clients_stopped: bool,
}

impl Default for MaintenanceOptions {
    fn default() -> Self {
        MaintenanceOptions {
            side_effects_retention: None,
            board_retention: None,
            board_prefixes: vec![BoardOptions::default().key_prefix],
            per_pass: 1000,
            max_passes: 100,
            every: Duration::from_secs(600),
            older_clients_stopped: false,
        }
    }
}

impl MaintenanceOptions {
    /// Prune the boards under these key prefixes (instead of `board/`).
    pub fn with_board_prefixes<I, S>(mut self, prefixes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.board_prefixes = prefixes.into_iter().map(Into::into).collect();
        self
    }
}

coord_backend::setters! {
    MaintenanceOptions {
        /// With a retention for completed side-effect keys.
        with_side_effects_retention(retention: Duration) => side_effects_retention = Some(retention);
        /// With a retention for completed board tasks.
        with_board_retention(retention: Duration) => board_retention = Some(retention);
        /// With another budget per pass (at least 1).
        with_per_pass(per_pass: usize) => per_pass = per_pass.max(1);
        /// With another number of passes per step and round (at least 1).
        with_max_passes(passes: u32) => max_passes = passes.max(1);
        /// With another pause between background rounds.
        with_every(every: Duration) => every = every;
        /// With the operator's word that older clients are stopped.
        with_older_clients_stopped(stopped: bool) => older_clients_stopped = stopped;
    }
}

/// What one round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaintenanceReport {
    /// Completed side-effect keys removed.
    pub pruned: u64,
    /// Completed board tasks removed.
    pub pruned_tasks: u64,
    /// Tombstones reclaimed.
    pub reclaimed: u64,
    /// Reclaim passes run.
    pub reclaim_passes: u64,
    /// Whether a step stopped at its pass budget.
    pub more: bool,
}

/// One round on `backend`'s namespace: prune (when a retention is set),
/// then reclaim, each until done or `max_passes` passes.
pub async fn run_once(
    backend: &Arc<dyn Backend>,
    options: &MaintenanceOptions,
) -> Result<MaintenanceReport, Error> {
    let mut report = MaintenanceReport::default();
    let passes = options.max_passes.max(1);
    // Pruning writes tombstones: it runs first, so this round reclaims them.
    if let Some(retention) = options.side_effects_retention {
        let adapter = SideEffectAdapter::new(backend.clone());
        let prune = PruneOptions::after(retention).with_max_records(options.per_pass);
        let (removed, more) = in_passes(passes, "side effects", || adapter.prune(&prune)).await?;
        report.pruned += removed;
        report.more |= more;
    }
    if let Some(retention) = options.board_retention {
        let prune = PruneOptions::after(retention).with_max_records(options.per_pass);
        for prefix in &options.board_prefixes {
            let board = BoardAdapter::with_options(
                backend.clone(),
                BoardOptions::default().with_key_prefix(prefix.clone()),
            );
            let (removed, more) = in_passes(passes, "board tasks", || board.prune(&prune)).await?;
            report.pruned_tasks += removed;
            report.more |= more;
        }
    }
    let reclaim = ReclaimOptions::DEFAULT
        .with_max_tombstones(options.per_pass)
        .with_older_clients_stopped(options.older_clients_stopped);
    for pass in 1..=passes {
        let done = backend.reclaim(&reclaim).await?;
        report.reclaim_passes += 1;
        report.reclaimed += done.removed;
        if !done.more {
            break;
        }
        report.more |= pass == passes;
    }
    Ok(report)
}

/// Prune passes until one says nothing is left or `passes` ran: the
/// records removed, and whether the budget stopped it.
async fn in_passes<F, Fut, E>(passes: u32, what: &str, mut pass: F) -> Result<(u64, bool), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Pruned, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut removed = 0;
    for n in 1..=passes {
        let done = pass().await.map_err(|e| Error::Unavailable {
            message: format!("pruning {what} failed: {e}"),
            source: Some(Box::new(e)),
        })?;
        removed += done.removed;
        if !done.more {
            return Ok((removed, false));
        }
        if n == passes {
            return Ok((removed, true));
        }
    }
    Ok((removed, false))
}

/// A background maintenance loop; dropping it stops the loop.
#[derive(Debug)]
pub struct MaintenanceTask {
    handle: tokio::task::JoinHandle<()>,
}

impl Drop for MaintenanceTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Run [`run_once`] every `options.every` (jittered) until the returned
/// task is dropped. A failed round is logged and retried next round (also
/// a reclaim refused beside older clients, [`Error::FormatMismatch`]: the
/// warning says what to do); a store without reclaim
/// ([`Error::Unsupported`]) ends the loop with a warning. Needs a tokio
/// runtime.
pub fn spawn_maintenance(
    backend: Arc<dyn Backend>,
    options: MaintenanceOptions,
) -> MaintenanceTask {
    let handle = tokio::spawn(async move {
        loop {
            // 0.75 to 1.25 of `every`, saturating (`every` may be Duration::MAX).
            let every = options.every;
            let pause =
                (every - every / 4).saturating_add((every / 2).mul_f64(crate::jitter::unit()));
            tokio::time::sleep(pause).await;
            match run_once(&backend, &options).await {
                Ok(report) => tracing::debug!(?report, "coord maintenance round"),
                Err(Error::Unsupported { what, store }) => {
                    tracing::warn!(what, store, "coord maintenance stops: the store lacks it");
                    return;
                }
                Err(error) => tracing::warn!(%error, "coord maintenance round failed"),
            }
        }
    });
    MaintenanceTask { handle }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use async_trait::async_trait;
    use coord_backend::{Assert, Entry, Mutation, Reclaimed, Result, TxnOutcome};
    use coord_memory::SingleProcessMemoryBackend;

    use super::*;

    /// The memory store, counting reclaim calls.
    #[derive(Debug)]
    struct Counting(SingleProcessMemoryBackend, AtomicU64);

    #[async_trait]
    impl Backend for Counting {
        fn namespace(&self) -> &str {
            self.0.namespace()
        }
        async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
            self.0.raw_snapshot(keys).await
        }
        async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
            self.0.raw_txn(asserts, mutations).await
        }
        async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
            self.0.raw_keys(prefix).await
        }
        async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.reclaim(options).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_reclaim_in_bounded_passes_until_dropped() {
        let store = Arc::new(Counting(
            SingleProcessMemoryBackend::new("maintenance").unwrap(),
            AtomicU64::new(0),
        ));
        for i in 0..25 {
            let key = format!("k{i}");
            store.txn(&[], &[Mutation::delete(key)]).await.unwrap();
        }
        let backend: Arc<dyn Backend> = store.clone();
        let options = MaintenanceOptions {
            per_pass: 10,
            max_passes: 2,
            ..MaintenanceOptions::default()
        };
        let first = run_once(&backend, &options).await.unwrap();
        assert_eq!((first.reclaimed, first.more), (20, true));
        let task = spawn_maintenance(
            backend.clone(),
            options.clone().with_every(Duration::from_secs(10)),
        );
        tokio::time::sleep(Duration::from_secs(13)).await;
        let calls = store.1.load(Ordering::SeqCst);
        assert_eq!(calls, 3, "one more round, one pass: the last 5");
        let again = run_once(&backend, &options).await.unwrap();
        assert_eq!(again.reclaimed, 0);
        drop(task);
        let before = store.1.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            store.1.load(Ordering::SeqCst),
            before,
            "a dropped task stops"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_every_duration_max_waits_instead_of_panicking() {
        let store = Arc::new(Counting(
            SingleProcessMemoryBackend::new("maintenance").unwrap(),
            AtomicU64::new(0),
        ));
        // A draw that stretches the pause past `every` (the task runs on
        // this thread: a current-thread runtime).
        let seed = (0..)
            .find(|s| {
                use rand::{Rng, SeedableRng};
                rand::rngs::StdRng::seed_from_u64(*s).random::<f64>() >= 0.5
            })
            .unwrap();
        crate::jitter::seed_thread_jitter(Some(seed));
        let options = MaintenanceOptions::default().with_every(Duration::MAX);
        let task = spawn_maintenance(store.clone(), options);
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        assert!(!task.handle.is_finished(), "the maintenance task ended");
        assert_eq!(store.1.load(Ordering::SeqCst), 0);
        crate::jitter::seed_thread_jitter(None);
    }
}
