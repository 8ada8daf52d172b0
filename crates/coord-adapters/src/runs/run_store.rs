//! [`RunStore`]: the [`SlotStore`] contract over any backend. Each
//! operation validates its input before touching the store, then makes one
//! engine call whose decision lives in `decide`; the reads of `active` and
//! `history` are plain snapshots, since they decide nothing.

use std::sync::Arc;
use std::time::Duration;

use crate::cas::{whole_millis, CasEngine, CasOptions, Decision, Record, View};
use async_trait::async_trait;
use coord_backend::{Backend, Clock};

use super::decide;
use super::records::{history_key, running_key, slot_prefix, History, RunningSet, SlotKeys};
use super::RunError;
use super::{
    validate_job_name, validate_label, ActiveRun, Claim, ClaimRequest, FinalStatus, Lease,
    ManualRun, RunRecord, RunStatus, SkipReason, Slot, SlotStore,
};

/// Claims forgotten per txn by `prune`: a long backlog is split so that no
/// txn grows with it.
const PRUNE_BATCH: usize = 64;

/// Options of a [`RunStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunStoreOptions {
    /// Runs kept in each job's history (at least 1; default 50).
    pub history_size: usize,
    /// Forget a claim this long after its run ended: it finished or was
    /// released, or its lease ran out and nobody took it over (an abandoned
    /// run: its holder died or went silent; history then shows it failed,
    /// with a message saying so). `None`, the default, = remember forever:
    /// one small key per run accumulates. Forgetting is done by
    /// [`SlotStore::prune`], which the scheduler calls after each run it
    /// finishes. The pruner's clock judges the window: a clock ahead by more
    /// than the window forgets a run still live, which then loses its lease
    /// (its heartbeat is refused) and is not run again by anyone.
    pub forget_claims_after: Option<Duration>,
    /// Tuning of the CAS engine.
    pub cas: CasOptions,
}

impl Default for RunStoreOptions {
    fn default() -> Self {
        RunStoreOptions {
            history_size: 50,
            forget_claims_after: None,
            cas: CasOptions::default(),
        }
    }
}

coord_backend::setters! {
    RunStoreOptions {
        /// Keep `size` runs per job.
        with_history_size(size: usize) => history_size = size;
        /// Forget claims `window` after their run ended (`None` = never).
        with_forget_claims_after(window: Option<Duration>) => forget_claims_after = window;
    }
}

/// [`SlotStore`] over any [`Backend`], every decision through one [`CasEngine`].
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_backend::{Backend, ManualClock};
/// use coord_memory::SingleProcessMemoryBackend;
/// use coord_adapters::runs::{ClaimRequest, FinalStatus, RunStore, RunStoreOptions, SlotStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("doc").unwrap());
/// let clock = Arc::new(ManualClock::at_millis(60_000));
/// let store = RunStore::new(backend, clock, RunStoreOptions::default()).unwrap();
///
/// let a = ClaimRequest::new("report", 60_000, "token-a", "node-a", Duration::from_secs(30));
/// let b = ClaimRequest::new("report", 60_000, "token-b", "node-b", Duration::from_secs(30));
/// assert!(store.claim(&a).await.unwrap().won);
/// assert!(store.claim(&a).await.unwrap().won, "the same token asking again still wins");
/// assert!(!store.claim(&b).await.unwrap().won);
/// store.finish("report", 60_000, "token-a", FinalStatus::Succeeded).await.unwrap();
/// assert_eq!(store.history("report", 10).await.unwrap()[0].instance, "node-a");
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct RunStore {
    engine: CasEngine,
    clock: Arc<dyn Clock>,
    options: RunStoreOptions,
}

impl RunStore {
    /// A run store over `backend`, judging lease expiry with `clock`.
    pub fn new(
        backend: Arc<dyn Backend>,
        clock: Arc<dyn Clock>,
        options: RunStoreOptions,
    ) -> Result<Self, RunError> {
        if options.history_size == 0 {
            return Err(RunError::InvalidArgument(
                "history_size must be at least 1".into(),
            ));
        }
        if options.forget_claims_after == Some(Duration::ZERO) {
            return Err(RunError::InvalidArgument(
                "forget_claims_after must be positive (None = forever)".into(),
            ));
        }
        Ok(RunStore {
            engine: CasEngine::with_options(backend, options.cas.clone()),
            clock,
            options,
        })
    }

    /// The options this store was built with.
    pub fn options(&self) -> &RunStoreOptions {
        &self.options
    }

    /// The CAS engine (for its round-trip counters).
    pub fn engine(&self) -> &CasEngine {
        &self.engine
    }

    fn owner_check(job: &str, token: &str) -> Result<(), RunError> {
        validate_job_name(job)?;
        validate_label("token", token)
    }

    /// A decision of the owner `token` over the records of `(job, slot)`
    /// (`finish`, `release`): `decide` gets the view, the slot's keys, now
    /// and the history size.
    async fn decide_owned(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        mut decide: impl FnMut(&View, &SlotKeys, u64, usize) -> Result<Decision<()>, RunError>,
    ) -> Result<(), RunError> {
        Self::owner_check(job, token)?;
        let keys = SlotKeys::new(job, slot);
        let now = self.clock.now_millis();
        let history_size = self.options.history_size;
        self.engine
            .decide(&keys.all(), |view| decide(view, &keys, now, history_size))
            .await
    }

    /// The record at `key` from one plain read (nothing to decide, so
    /// nothing to assert), or its default when there is none.
    async fn read<T: Record + Default>(&self, key: &str) -> Result<T, RunError> {
        let entries = self.engine.snapshot(&[key.to_owned()]).await?;
        Ok(
            T::from_value(key, entries.first().and_then(|e| e.value.as_deref()))?
                .unwrap_or_default(),
        )
    }
}

#[async_trait]
impl SlotStore for RunStore {
    fn dedupe_window(&self) -> Option<Duration> {
        self.options.forget_claims_after
    }

    #[tracing::instrument(name = "scheduler.claim", skip_all, fields(
        key = %request.job, slot = request.slot, store = self.engine.store_name(),
        takeovers = tracing::field::Empty,
    ))]
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, RunError> {
        validate_job_name(&request.job)?;
        validate_label("token", &request.token)?;
        validate_label("instance", &request.instance)?;
        if request.lease_ttl.is_zero() {
            return Err(RunError::InvalidArgument(
                "lease_ttl must be positive".into(),
            ));
        }
        let keys = SlotKeys::new(&request.job, request.slot);
        let now = self.clock.now_millis();
        let lease_until = now.saturating_add(whole_millis(request.lease_ttl));
        let history_size = self.options.history_size;
        let claim = self
            .engine
            .decide(&keys.all(), |view| {
                decide::claim(view, &keys, request, now, lease_until, history_size)
            })
            .await;
        if let Ok(claim) = &claim {
            tracing::Span::current().record("takeovers", claim.takeovers);
        }
        claim
    }

    async fn heartbeat(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        ttl: Duration,
    ) -> Result<Lease, RunError> {
        Self::owner_check(job, token)?;
        if ttl.is_zero() {
            return Err(RunError::InvalidArgument(
                "lease ttl must be positive".into(),
            ));
        }
        let running_key = running_key(job);
        let now = self.clock.now_millis();
        let until = now.saturating_add(whole_millis(ttl));
        self.engine
            .decide(std::slice::from_ref(&running_key), |view| {
                decide::heartbeat(view, job, &running_key, slot, token, until)
            })
            .await
    }

    async fn finish(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        status: FinalStatus,
    ) -> Result<(), RunError> {
        self.decide_owned(job, slot, token, |view, keys, now, history_size| {
            decide::finish(view, keys, token, &status, now, history_size)
        })
        .await
    }

    async fn record_attempt(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        attempt: u32,
        failure: &str,
    ) -> Result<(), RunError> {
        if attempt < 2 {
            return Err(RunError::InvalidArgument(
                "a recorded attempt is a retry: 2 or more".into(),
            ));
        }
        self.decide_owned(job, slot, token, |view, keys, _now, history_size| {
            decide::record_attempt(view, keys, token, attempt, failure, history_size)
        })
        .await
    }

    async fn release(&self, job: &str, slot: Slot, token: &str) -> Result<(), RunError> {
        self.decide_owned(job, slot, token, |view, keys, now, history_size| {
            decide::release(view, keys, token, now, history_size)
        })
        .await
    }

    async fn active(&self, job: &str) -> Result<Vec<ActiveRun>, RunError> {
        validate_job_name(job)?;
        let running_key = running_key(job);
        let running: RunningSet = self.read(&running_key).await?;
        let now = self.clock.now_millis();
        Ok(running
            .runs
            .into_iter()
            .map(|(slot, e)| ActiveRun {
                slot,
                instance: e.instance,
                started_ms: e.started_ms,
                lease_until_ms: e.lease_until_ms,
                live: e.lease_until_ms > now,
            })
            .collect())
    }

    async fn record_manual(&self, run: &ManualRun) -> Result<(), RunError> {
        validate_job_name(&run.job)?;
        validate_label("token", &run.token)?;
        validate_label("instance", &run.instance)?;
        let history_key = history_key(&run.job);
        let now = self.clock.now_millis();
        let history_size = self.options.history_size;
        self.engine
            .decide(std::slice::from_ref(&history_key), |view| {
                decide::record_manual(view, &history_key, run, now, history_size)
            })
            .await
    }

    async fn record_skip(
        &self,
        job: &str,
        slot: Slot,
        instance: &str,
        reason: SkipReason,
    ) -> Result<bool, RunError> {
        validate_job_name(job)?;
        validate_label("instance", instance)?;
        let keys = SlotKeys::new(job, slot);
        let read = [keys.slot_key.clone(), keys.history_key.clone()];
        let now = self.clock.now_millis();
        let history_size = self.options.history_size;
        self.engine
            .decide(&read, |view| {
                decide::record_skip(view, &keys, instance, reason, now, history_size)
            })
            .await
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>, RunError> {
        validate_job_name(job)?;
        let history_key = history_key(job);
        let history: History = self.read(&history_key).await?;
        Ok(history
            .runs
            .into_iter()
            .take(limit)
            .map(|e| RunRecord {
                slot: e.slot,
                instance: e.instance,
                status: e.status,
                message: e.message,
                started_ms: e.started_ms,
                duration_ms: e.finished_ms.map(|f| f.saturating_sub(e.started_ms)),
                takeovers: e.takeovers,
                // A skipped slot started nothing (its record says 1, the
                // default that is never written).
                attempts: match e.status {
                    RunStatus::Skipped(_) => 0,
                    _ => e.attempts,
                },
                manual: e.manual,
            })
            .collect())
    }

    async fn prune(&self, job: &str) -> Result<usize, RunError> {
        validate_job_name(job)?;
        let Some(window) = self.options.forget_claims_after else {
            return Ok(0);
        };
        let now = self.clock.now_millis();
        let horizon = now.saturating_sub(whole_millis(window));
        let prefix = slot_prefix(job);
        let keys = self.engine.backend().keys(&prefix).await?;
        // Slot keys sort by slot (zero-padded): only the old ones can go.
        let old: Vec<String> = keys
            .into_iter()
            .filter(|k| {
                k[prefix.len()..]
                    .parse::<u64>()
                    .is_ok_and(|slot| slot < horizon)
            })
            .collect();
        let (running_key, history_key) = (running_key(job), history_key(job));
        let mut forgotten = 0;
        for batch in old.chunks(PRUNE_BATCH) {
            // The running set is read only when the batch holds a run that
            // may be abandoned (`decide::forget` expands to it).
            let mut keys = batch.to_vec();
            keys.push(history_key.clone());
            forgotten += self
                .engine
                .decide(&keys, |view| {
                    decide::forget(view, batch, &prefix, horizon, &running_key, &history_key)
                })
                .await?;
        }
        Ok(forgotten)
    }
}
