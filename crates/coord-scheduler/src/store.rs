//! The run store: who runs `(job, slot)`, decided once, atomically, over the
//! three primitives.
//!
//! # Contract ([`SlotStore`])
//!
//! - [`claim`](SlotStore::claim) is ONE atomic decision: for a `(job, slot)`
//!   it answers `won = true` for exactly one token, and `true` again when the
//!   same token asks again while its run is unfinished (a client retrying
//!   after a lost reply still owns its run). Any other token gets
//!   `won = false` with the reason: the run is live elsewhere, done, or
//!   blocked by a live run of another slot (overlap protection).
//! - A run whose lease expired without finishing, or that was released, is
//!   **taken over** by the next claimer; the record counts takeovers.
//! - [`heartbeat`](SlotStore::heartbeat), [`finish`](SlotStore::finish) and
//!   [`release`](SlotStore::release) act only with the owning token; anything
//!   else is [`Error::NotOwner`] and changes nothing. An expired lease that
//!   nobody took over yet still belongs to its holder (expiry only opens the
//!   door to a takeover).
//! - [`history`](SlotStore::history) lists recent runs of a job from every
//!   instance, newest slot first, bounded by the store's history size.
//! - [`dedupe_window`](SlotStore::dedupe_window) says how long finished
//!   claims are remembered; the scheduler refuses jobs that could still
//!   claim a slot after that.
//!
//! # The implementation ([`RunStore`])
//!
//! Three keys per job, each decision a single [`CasEngine::decide`] call that
//! asserts every key it read (never read-decide-write in separate calls):
//!
//! | key | holds |
//! | --- | --- |
//! | `sched/{job}/slot/{slot:020}` | one record per claimed slot: token, instance, state, takeovers (the dedupe memory) |
//! | `sched/{job}/running` | every unfinished run of the job with its lease: the overlap check and [`SlotStore::active`] |
//! | `sched/{job}/history` | the last `history_size` runs (JSON list), newest slot first |
//!
//! A claim reads all three and writes all three, so two slots of one job
//! serialize on the `running` key (that is what makes overlap protection
//! atomic); different jobs never contend. Expiry is judged with the store's
//! [`Clock`]: instances must agree on time to within a small fraction of the
//! lease TTL; a skewed clock can only cause an early takeover (a liveness /
//! duplicate-work risk bounded by the lease), never two winners of one claim.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_adapters::{CasEngine, CasOptions, Decision, View};
use coord_backend::{Backend, Clock, Mutation};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::Error;

/// A slot: the scheduled instant in UTC milliseconds since the Unix epoch.
pub type Slot = u64;

const PREFIX: &str = "sched/";
const MAX_NAME: usize = 128;
const PRUNE_BATCH: usize = 64;

/// What one instance asks for when it wants to run `(job, slot)`.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The job name.
    pub job: String,
    /// The slot (scheduled instant, UTC ms).
    pub slot: Slot,
    /// A random value unique to this attempt ([`coord_adapters::mint_token`]);
    /// sending the same token again is a retry of the same attempt.
    pub token: String,
    /// Who asks (shown in history and `active`).
    pub instance: String,
    /// How long the lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// Whether this slot may run while another slot of the job is running.
    pub allow_overlap: bool,
    /// When a lease of another token that expired by the store's clock may
    /// be taken over (default [`Takeover::WhenExpired`]).
    pub takeover: Takeover,
}

impl std::fmt::Debug for ClaimRequest {
    // The token is the run's credential: it never appears in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimRequest")
            .field("job", &self.job)
            .field("slot", &self.slot)
            .field("token", &coord_backend::redact::Hidden)
            .field("instance", &self.instance)
            .field("lease_ttl", &self.lease_ttl)
            .field("allow_overlap", &self.allow_overlap)
            .field("takeover", &self.takeover)
            .finish()
    }
}

/// When [`SlotStore::claim`] may take over another token's unfinished run
/// whose lease expired by the store's clock. A released run is free for
/// any claimer whatever the rule.
///
/// Expiry read from one instance's wall clock alone is not enough: a clock
/// stepped forward (e.g. +1 h) makes every live lease look expired. The
/// scheduler therefore first observes a lease, and takes it over only once
/// that lease stayed the same for a full lease duration on its own monotonic
/// clock (as Kubernetes leader election does): the holder, which counts its
/// own lease from when its last confirmed heartbeat was *sent*, has given
/// it up locally by then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Takeover {
    /// The store's clock alone decides (expired = takeable).
    #[default]
    WhenExpired,
    /// Only when the expired lease still ends at this instant (UTC ms): the
    /// `lease_until_ms` the caller saw unchanged for a full lease duration.
    IfUnchanged(u64),
    /// Never take over an unreleased run: only learn who holds it and until when.
    Never,
}

impl Takeover {
    fn allows(self, lease_until_ms: u64) -> bool {
        match self {
            Takeover::WhenExpired => true,
            Takeover::IfUnchanged(seen) => seen == lease_until_ms,
            Takeover::Never => false,
        }
    }
}

impl ClaimRequest {
    /// A claim without overlap.
    pub fn new(
        job: impl Into<String>,
        slot: Slot,
        token: impl Into<String>,
        instance: impl Into<String>,
        lease_ttl: Duration,
    ) -> Self {
        ClaimRequest {
            job: job.into(),
            slot,
            token: token.into(),
            instance: instance.into(),
            lease_ttl,
            allow_overlap: false,
            takeover: Takeover::WhenExpired,
        }
    }

    /// Set when an expired lease of another token may be taken over.
    pub fn takeover(mut self, rule: Takeover) -> Self {
        self.takeover = rule;
        self
    }

    /// Allow (or not) this slot to run while another slot of the job runs.
    pub fn allow_overlap(mut self, allow: bool) -> Self {
        self.allow_overlap = allow;
        self
    }
}

/// Why a claim was won or lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// Won a slot nobody had claimed (or the same token asked again).
    Won,
    /// Won a slot whose previous holder's lease expired or who released it.
    TakenOver,
    /// Lost: another token holds a live lease on this slot (or an expired
    /// one that the request's [`Takeover`] rule did not allow to take over).
    Running,
    /// Lost: the slot's run is finished, or its claim was forgotten
    /// ([`SlotStore::prune`]): a forgotten slot is never claimable again.
    Done,
    /// Lost: another slot of the job is running with a live lease and the
    /// job does not allow overlap.
    Overlap {
        /// The running slot that blocks this one.
        running_slot: Slot,
    },
}

/// The answer of [`SlotStore::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// Whether the asking token owns the run.
    pub won: bool,
    /// Why.
    pub outcome: ClaimOutcome,
    /// How many times this slot was taken over (0 for a first run).
    pub takeovers: u32,
    /// The instance holding the slot (or the blocking slot, for `Overlap`).
    pub holder: Option<String>,
    /// When the holder's lease expires (UTC ms), when there is a live holder.
    pub lease_until_ms: Option<u64>,
}

/// How a run ended, as its owner reports it to [`SlotStore::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinalStatus {
    /// The handler returned success.
    Succeeded,
    /// The handler failed (with its message).
    Failed(String),
    /// The handler ran longer than the job's timeout and was stopped.
    TimedOut,
}

/// Why a slot was skipped without running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SkipReason {
    /// Nobody claimed it within the job's maximum lateness.
    Late,
    /// It stayed blocked by a running slot of the same job until it was too late.
    Overlap,
}

/// The state of one run in [`SlotStore::history`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Claimed and not finished (its lease may have expired; see `active`).
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Stopped by the job's timeout.
    TimedOut,
    /// Given up by its holder (graceful shutdown) and not taken over yet.
    Released,
    /// Not run.
    Skipped(SkipReason),
}

/// One run as [`SlotStore::history`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The slot (for a manual run: when it started).
    pub slot: Slot,
    /// The instance that ran (or skipped) it.
    pub instance: String,
    /// Its state.
    pub status: RunStatus,
    /// The failure message, when there is one.
    pub message: Option<String>,
    /// When the current holder started it (UTC ms).
    pub started_ms: u64,
    /// How long it ran, once finished.
    pub duration_ms: Option<u64>,
    /// How many times the slot was taken over.
    pub takeovers: u32,
    /// Whether it was started by `run_now` (never deduplicated).
    pub manual: bool,
}

/// An unfinished run, as [`SlotStore::active`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActiveRun {
    /// The slot.
    pub slot: Slot,
    /// Its holder.
    pub instance: String,
    /// When the holder started it (UTC ms).
    pub started_ms: u64,
    /// When its lease expires (UTC ms).
    pub lease_until_ms: u64,
    /// Whether the lease is still live by the store's clock.
    pub live: bool,
}

/// A renewed lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// When it now expires (UTC ms).
    pub lease_until_ms: u64,
}

/// A manual run (`run_now`), recorded without deduplication.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManualRun {
    /// The job.
    pub job: String,
    /// When it started (UTC ms); also its slot in history.
    pub slot: Slot,
    /// The run's token (used to finish it).
    pub token: String,
    /// Who runs it.
    pub instance: String,
}

impl std::fmt::Debug for ManualRun {
    // The token is the run's credential: it never appears in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualRun")
            .field("job", &self.job)
            .field("slot", &self.slot)
            .field("token", &coord_backend::redact::Hidden)
            .field("instance", &self.instance)
            .finish()
    }
}

impl ManualRun {
    /// A manual run.
    pub fn new(
        job: impl Into<String>,
        slot: Slot,
        token: impl Into<String>,
        instance: impl Into<String>,
    ) -> Self {
        ManualRun {
            job: job.into(),
            slot,
            token: token.into(),
            instance: instance.into(),
        }
    }
}

/// The contract a scheduler coordinates through.
/// [`RunStore`] implements it over any [`Backend`]; the conformance suite
/// checks any implementation.
#[async_trait]
pub trait SlotStore: Send + Sync + fmt::Debug {
    /// How long a finished claim is remembered (`None` = forever).
    fn dedupe_window(&self) -> Option<Duration>;

    /// Decide, atomically, whether `request.token` runs `(job, slot)`.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, Error>;

    /// Extend the lease to now + `ttl`, only for the owning token.
    async fn heartbeat(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        ttl: Duration,
    ) -> Result<Lease, Error>;

    /// Mark the run finished, only for the owning token (idempotent for it).
    async fn finish(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        status: FinalStatus,
    ) -> Result<(), Error>;

    /// End the lease now so a backup can take over, only for the owning token.
    async fn release(&self, job: &str, slot: Slot, token: &str) -> Result<(), Error>;

    /// The unfinished runs of `job` and whether each lease is live.
    async fn active(&self, job: &str) -> Result<Vec<ActiveRun>, Error>;

    /// Record a manual run (no deduplication); finish it with [`SlotStore::finish`].
    async fn record_manual(&self, run: &ManualRun) -> Result<(), Error>;

    /// Record that `slot` was skipped, unless it was claimed or already
    /// recorded. Returns whether this call recorded it. A skip record does
    /// not block a later claim of the slot (by an instance still on time).
    async fn record_skip(
        &self,
        job: &str,
        slot: Slot,
        instance: &str,
        reason: SkipReason,
    ) -> Result<bool, Error>;

    /// Recent runs of `job` from every instance, newest slot first, at most `limit`.
    async fn history(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>, Error>;

    /// Forget finished claims older than the dedupe window; returns how many.
    async fn prune(&self, _job: &str) -> Result<usize, Error> {
        Ok(0)
    }
}

/// Options of a [`RunStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunStoreOptions {
    /// Runs kept in each job's history (at least 1; default 50).
    pub history_size: usize,
    /// Forget finished claims this long after they finished (`None`, the
    /// default, = remember forever: one small key per run accumulates).
    /// Forgetting is done by [`SlotStore::prune`], which the scheduler calls
    /// after each run it finishes.
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

impl RunStoreOptions {
    /// Keep `size` runs per job.
    pub fn history_size(mut self, size: usize) -> Self {
        self.history_size = size;
        self
    }

    /// Forget finished claims after `window` (`None` = never).
    pub fn forget_claims_after(mut self, window: Option<Duration>) -> Self {
        self.forget_claims_after = window;
        self
    }
}

/// [`SlotStore`] over any [`Backend`], every decision through one [`CasEngine`].
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_backend::{Backend, ManualClock};
/// use coord_memory::SingleProcessMemoryBackend;
/// use coord_scheduler::{ClaimRequest, FinalStatus, RunStore, RunStoreOptions, SlotStore};
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

// ----- stored records (JSON; field names are the storage format) -----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SlotState {
    Running,
    Done,
    Released,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Serialize, Deserialize)]
struct SlotRecord {
    token: String,
    instance: String,
    state: SlotState,
    started_ms: u64,
    #[serde(default)]
    finished_ms: Option<u64>,
    #[serde(default)]
    takeovers: u32,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Serialize, Deserialize)]
struct RunningEntry {
    token: String,
    instance: String,
    started_ms: u64,
    lease_until_ms: u64,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Default, Serialize, Deserialize)]
struct RunningSet {
    runs: BTreeMap<Slot, RunningEntry>,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Serialize, Deserialize)]
struct HistoryEntry {
    slot: Slot,
    #[serde(default)]
    manual: bool,
    /// Only for manual runs (they have no slot record to hold it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    instance: String,
    status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_ms: Option<u64>,
    #[serde(default)]
    takeovers: u32,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Default, Serialize, Deserialize)]
struct History {
    runs: Vec<HistoryEntry>,
    /// Slots below this were forgotten by [`SlotStore::prune`] (their claims
    /// deleted): never claimable again. Kept in the store, not judged by any
    /// instance's clock, so an instance whose clock lags the pruner's cannot
    /// claim and run a forgotten slot a second time.
    #[serde(default, skip_serializing_if = "is_zero")]
    forgotten_below: Slot,
}

fn is_zero(n: &Slot) -> bool {
    *n == 0
}

impl History {
    fn scheduled_mut(&mut self, slot: Slot) -> Option<&mut HistoryEntry> {
        self.runs.iter_mut().find(|e| !e.manual && e.slot == slot)
    }

    /// Insert or replace the scheduled entry of `entry.slot`, keep newest
    /// slot first, drop the oldest beyond `size`.
    fn upsert(&mut self, entry: HistoryEntry, size: usize) {
        if let Some(existing) = self.scheduled_mut(entry.slot).filter(|_| !entry.manual) {
            *existing = entry;
        } else {
            let at = self
                .runs
                .iter()
                .position(|e| e.slot < entry.slot)
                .unwrap_or(self.runs.len());
            self.runs.insert(at, entry);
        }
        self.runs.truncate(size);
    }
}

fn decode<T: DeserializeOwned>(view: &View, key: &str) -> Result<Option<T>, Error> {
    match view.value(key) {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|e| coord_backend::Error::malformed(key, e.to_string()).into()),
    }
}

fn encode<T: Serialize>(key: &str, value: &T) -> Mutation {
    // Plain structs with string / integer map keys always serialize.
    Mutation::put(
        key,
        serde_json::to_vec(value).expect("run records serialize"),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Check a job name: 1..=128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn validate_job_name(job: &str) -> Result<(), Error> {
    let ok = !job.is_empty()
        && job.len() <= MAX_NAME
        && job
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidJobName(job.to_owned()))
    }
}

fn validate_label(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() || value.len() > MAX_NAME || value.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "{what} must be 1 to {MAX_NAME} bytes without NUL"
        )));
    }
    Ok(())
}

enum Owned<T> {
    Yes(T),
    No,
}

impl RunStore {
    /// A run store over `backend`, judging lease expiry with `clock`.
    pub fn new(
        backend: Arc<dyn Backend>,
        clock: Arc<dyn Clock>,
        options: RunStoreOptions,
    ) -> Result<Self, Error> {
        if options.history_size == 0 {
            return Err(Error::InvalidArgument(
                "history_size must be at least 1".into(),
            ));
        }
        if options.forget_claims_after == Some(Duration::ZERO) {
            return Err(Error::InvalidArgument(
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

    fn slot_prefix(job: &str) -> String {
        format!("{PREFIX}{job}/slot/")
    }

    fn slot_key(job: &str, slot: Slot) -> String {
        format!("{PREFIX}{job}/slot/{slot:020}")
    }

    fn running_key(job: &str) -> String {
        format!("{PREFIX}{job}/running")
    }

    fn history_key(job: &str) -> String {
        format!("{PREFIX}{job}/history")
    }

    fn owner_check(job: &str, token: &str) -> Result<(), Error> {
        validate_job_name(job)?;
        validate_label("token", token)
    }
}

#[async_trait]
impl SlotStore for RunStore {
    fn dedupe_window(&self) -> Option<Duration> {
        self.options.forget_claims_after
    }

    #[tracing::instrument(name = "scheduler.claim", skip_all, fields(
        key = %request.job, slot = request.slot, store = self.engine.backend().store_name(),
        takeovers = tracing::field::Empty,
    ))]
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, Error> {
        validate_job_name(&request.job)?;
        validate_label("token", &request.token)?;
        validate_label("instance", &request.instance)?;
        if request.lease_ttl.is_zero() {
            return Err(Error::InvalidArgument("lease_ttl must be positive".into()));
        }
        let job = request.job.as_str();
        let slot = request.slot;
        let (slot_key, running_key, history_key) = (
            Self::slot_key(job, slot),
            Self::running_key(job),
            Self::history_key(job),
        );
        let keys = [slot_key.clone(), running_key.clone(), history_key.clone()];
        let now = self.clock.now_millis();
        let lease_until = now.saturating_add(millis(request.lease_ttl));
        let history_size = self.options.history_size;
        let claim = self
            .engine
            .decide(&keys, |view| {
                let record: Option<SlotRecord> = decode(view, &slot_key)?;
                let mut running: RunningSet = decode(view, &running_key)?.unwrap_or_default();
                let mut history: History = decode(view, &history_key)?.unwrap_or_default();
                if slot < history.forgotten_below {
                    return Ok(Decision::Return(Claim {
                        won: false,
                        outcome: ClaimOutcome::Done,
                        takeovers: 0,
                        holder: None,
                        lease_until_ms: None,
                    }));
                }
                let lease = running.runs.get(&slot).cloned();
                let takeovers = match &record {
                    None => 0,
                    Some(r) if r.state == SlotState::Running && r.token == request.token => {
                        // The same attempt asking again: still ours. Renew an
                        // expired lease so the answer is not stale on arrival.
                        let outcome = if r.takeovers > 0 {
                            ClaimOutcome::TakenOver
                        } else {
                            ClaimOutcome::Won
                        };
                        let claim = |until| Claim {
                            won: true,
                            outcome,
                            takeovers: r.takeovers,
                            holder: Some(r.instance.clone()),
                            lease_until_ms: Some(until),
                        };
                        return Ok(match lease {
                            Some(l) if l.token == request.token && l.lease_until_ms > now => {
                                Decision::Return(claim(l.lease_until_ms))
                            }
                            _ => {
                                running.runs.insert(
                                    slot,
                                    RunningEntry {
                                        token: r.token.clone(),
                                        instance: r.instance.clone(),
                                        started_ms: r.started_ms,
                                        lease_until_ms: lease_until,
                                    },
                                );
                                Decision::Commit {
                                    mutations: vec![encode(&running_key, &running)],
                                    then: claim(lease_until),
                                }
                            }
                        });
                    }
                    Some(r) if r.state == SlotState::Done => {
                        return Ok(Decision::Return(Claim {
                            won: false,
                            outcome: ClaimOutcome::Done,
                            takeovers: r.takeovers,
                            holder: Some(r.instance.clone()),
                            lease_until_ms: None,
                        }));
                    }
                    Some(r) if r.state == SlotState::Running => match &lease {
                        Some(l)
                            if l.token == r.token
                                && (l.lease_until_ms > now
                                    || !request.takeover.allows(l.lease_until_ms)) =>
                        {
                            return Ok(Decision::Return(Claim {
                                won: false,
                                outcome: ClaimOutcome::Running,
                                takeovers: r.takeovers,
                                holder: Some(r.instance.clone()),
                                lease_until_ms: Some(l.lease_until_ms),
                            }));
                        }
                        // Lease expired (or lost from the running set): take over.
                        _ => r.takeovers.saturating_add(1),
                    },
                    // Released: free for the next claimer.
                    Some(r) => r.takeovers.saturating_add(1),
                };
                if !request.allow_overlap {
                    if let Some((other, entry)) = running
                        .runs
                        .iter()
                        .find(|(s, e)| **s != slot && e.lease_until_ms > now)
                    {
                        return Ok(Decision::Return(Claim {
                            won: false,
                            outcome: ClaimOutcome::Overlap {
                                running_slot: *other,
                            },
                            takeovers,
                            holder: Some(entry.instance.clone()),
                            lease_until_ms: Some(entry.lease_until_ms),
                        }));
                    }
                }
                let new_record = SlotRecord {
                    token: request.token.clone(),
                    instance: request.instance.clone(),
                    state: SlotState::Running,
                    started_ms: now,
                    finished_ms: None,
                    takeovers,
                };
                running.runs.insert(
                    slot,
                    RunningEntry {
                        token: request.token.clone(),
                        instance: request.instance.clone(),
                        started_ms: now,
                        lease_until_ms: lease_until,
                    },
                );
                history.upsert(
                    HistoryEntry {
                        slot,
                        manual: false,
                        token: None,
                        instance: request.instance.clone(),
                        status: RunStatus::Running,
                        message: None,
                        started_ms: now,
                        finished_ms: None,
                        takeovers,
                    },
                    history_size,
                );
                Ok(Decision::Commit {
                    mutations: vec![
                        encode(&slot_key, &new_record),
                        encode(&running_key, &running),
                        encode(&history_key, &history),
                    ],
                    then: Claim {
                        won: true,
                        outcome: if takeovers > 0 {
                            ClaimOutcome::TakenOver
                        } else {
                            ClaimOutcome::Won
                        },
                        takeovers,
                        holder: Some(request.instance.clone()),
                        lease_until_ms: Some(lease_until),
                    },
                })
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
    ) -> Result<Lease, Error> {
        Self::owner_check(job, token)?;
        if ttl.is_zero() {
            return Err(Error::InvalidArgument("lease ttl must be positive".into()));
        }
        let running_key = Self::running_key(job);
        let now = self.clock.now_millis();
        let until = now.saturating_add(millis(ttl));
        let answer = self
            .engine
            .decide(std::slice::from_ref(&running_key), |view| {
                let mut running: RunningSet = decode(view, &running_key)?.unwrap_or_default();
                match running.runs.get_mut(&slot) {
                    Some(entry) if entry.token == token => {
                        entry.lease_until_ms = until;
                        Ok::<_, Error>(Decision::Commit {
                            mutations: vec![encode(&running_key, &running)],
                            then: Owned::Yes(Lease {
                                lease_until_ms: until,
                            }),
                        })
                    }
                    _ => Ok(Decision::Return(Owned::No)),
                }
            })
            .await?;
        match answer {
            Owned::Yes(lease) => Ok(lease),
            Owned::No => Err(Error::NotOwner {
                job: job.to_owned(),
                slot,
            }),
        }
    }

    async fn finish(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        status: FinalStatus,
    ) -> Result<(), Error> {
        Self::owner_check(job, token)?;
        let (slot_key, running_key, history_key) = (
            Self::slot_key(job, slot),
            Self::running_key(job),
            Self::history_key(job),
        );
        let keys = [slot_key.clone(), running_key.clone(), history_key.clone()];
        let now = self.clock.now_millis();
        let (run_status, message) = match &status {
            FinalStatus::Succeeded => (RunStatus::Succeeded, None),
            FinalStatus::Failed(m) => (RunStatus::Failed, Some(m.clone())),
            FinalStatus::TimedOut => (RunStatus::TimedOut, None),
        };
        let history_size = self.options.history_size;
        let answer = self
            .engine
            .decide(&keys, |view| {
                let record: Option<SlotRecord> = decode(view, &slot_key)?;
                let mut running: RunningSet = decode(view, &running_key)?.unwrap_or_default();
                let mut history: History = decode(view, &history_key)?.unwrap_or_default();
                match record {
                    Some(r) if r.token == token && r.state == SlotState::Done => {
                        return Ok::<_, Error>(Decision::Return(Owned::Yes(())));
                    }
                    Some(mut r) if r.token == token && r.state == SlotState::Running => {
                        r.state = SlotState::Done;
                        r.finished_ms = Some(now);
                        running.runs.remove(&slot);
                        let entry = HistoryEntry {
                            slot,
                            manual: false,
                            token: None,
                            instance: r.instance.clone(),
                            status: run_status,
                            message: message.clone(),
                            started_ms: r.started_ms,
                            finished_ms: Some(now),
                            takeovers: r.takeovers,
                        };
                        history.upsert(entry, history_size);
                        return Ok(Decision::Commit {
                            mutations: vec![
                                encode(&slot_key, &r),
                                encode(&running_key, &running),
                                encode(&history_key, &history),
                            ],
                            then: Owned::Yes(()),
                        });
                    }
                    _ => {}
                }
                // A manual run: it lives in history only.
                let manual = history
                    .runs
                    .iter_mut()
                    .find(|e| e.manual && e.slot == slot && e.token.as_deref() == Some(token));
                match manual {
                    Some(e) if e.status != RunStatus::Running => {
                        Ok(Decision::Return(Owned::Yes(())))
                    }
                    Some(e) => {
                        e.status = run_status;
                        e.message = message.clone();
                        e.finished_ms = Some(now);
                        Ok(Decision::Commit {
                            mutations: vec![encode(&history_key, &history)],
                            then: Owned::Yes(()),
                        })
                    }
                    None => Ok(Decision::Return(Owned::No)),
                }
            })
            .await?;
        match answer {
            Owned::Yes(()) => Ok(()),
            Owned::No => Err(Error::NotOwner {
                job: job.to_owned(),
                slot,
            }),
        }
    }

    async fn release(&self, job: &str, slot: Slot, token: &str) -> Result<(), Error> {
        Self::owner_check(job, token)?;
        let (slot_key, running_key, history_key) = (
            Self::slot_key(job, slot),
            Self::running_key(job),
            Self::history_key(job),
        );
        let keys = [slot_key.clone(), running_key.clone(), history_key.clone()];
        let now = self.clock.now_millis();
        let history_size = self.options.history_size;
        let answer = self
            .engine
            .decide(&keys, |view| {
                let record: Option<SlotRecord> = decode(view, &slot_key)?;
                let mut running: RunningSet = decode(view, &running_key)?.unwrap_or_default();
                let mut history: History = decode(view, &history_key)?.unwrap_or_default();
                match record {
                    Some(r) if r.token == token && r.state == SlotState::Released => {
                        Ok::<_, Error>(Decision::Return(Owned::Yes(())))
                    }
                    Some(mut r) if r.token == token && r.state == SlotState::Running => {
                        r.state = SlotState::Released;
                        r.finished_ms = Some(now);
                        running.runs.remove(&slot);
                        history.upsert(
                            HistoryEntry {
                                slot,
                                manual: false,
                                token: None,
                                instance: r.instance.clone(),
                                status: RunStatus::Released,
                                message: None,
                                started_ms: r.started_ms,
                                finished_ms: Some(now),
                                takeovers: r.takeovers,
                            },
                            history_size,
                        );
                        Ok(Decision::Commit {
                            mutations: vec![
                                encode(&slot_key, &r),
                                encode(&running_key, &running),
                                encode(&history_key, &history),
                            ],
                            then: Owned::Yes(()),
                        })
                    }
                    _ => Ok(Decision::Return(Owned::No)),
                }
            })
            .await?;
        match answer {
            Owned::Yes(()) => Ok(()),
            Owned::No => Err(Error::NotOwner {
                job: job.to_owned(),
                slot,
            }),
        }
    }

    async fn active(&self, job: &str) -> Result<Vec<ActiveRun>, Error> {
        validate_job_name(job)?;
        let running_key = Self::running_key(job);
        let entries = self
            .engine
            .snapshot(std::slice::from_ref(&running_key))
            .await?;
        let now = self.clock.now_millis();
        let view_value = entries.first().and_then(|e| e.value.as_deref());
        let running: RunningSet = match view_value {
            None => RunningSet::default(),
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| coord_backend::Error::malformed(&running_key, e.to_string()))?,
        };
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

    async fn record_manual(&self, run: &ManualRun) -> Result<(), Error> {
        validate_job_name(&run.job)?;
        validate_label("token", &run.token)?;
        validate_label("instance", &run.instance)?;
        let history_key = Self::history_key(&run.job);
        let now = self.clock.now_millis();
        let history_size = self.options.history_size;
        self.engine
            .decide(std::slice::from_ref(&history_key), |view| {
                let mut history: History = decode(view, &history_key)?.unwrap_or_default();
                if history
                    .runs
                    .iter()
                    .any(|e| e.manual && e.token.as_deref() == Some(run.token.as_str()))
                {
                    // The same manual run recorded again (a retry): nothing to do.
                    return Ok::<_, Error>(Decision::Return(()));
                }
                history.upsert(
                    HistoryEntry {
                        slot: run.slot,
                        manual: true,
                        token: Some(run.token.clone()),
                        instance: run.instance.clone(),
                        status: RunStatus::Running,
                        message: None,
                        started_ms: now,
                        finished_ms: None,
                        takeovers: 0,
                    },
                    history_size,
                );
                Ok(Decision::Commit {
                    mutations: vec![encode(&history_key, &history)],
                    then: (),
                })
            })
            .await
    }

    async fn record_skip(
        &self,
        job: &str,
        slot: Slot,
        instance: &str,
        reason: SkipReason,
    ) -> Result<bool, Error> {
        validate_job_name(job)?;
        validate_label("instance", instance)?;
        let (slot_key, history_key) = (Self::slot_key(job, slot), Self::history_key(job));
        let keys = [slot_key.clone(), history_key.clone()];
        let now = self.clock.now_millis();
        let history_size = self.options.history_size;
        self.engine
            .decide(&keys, |view| {
                if view.value(&slot_key).is_some() {
                    return Ok::<_, Error>(Decision::Return(false));
                }
                let mut history: History = decode(view, &history_key)?.unwrap_or_default();
                if history.scheduled_mut(slot).is_some() {
                    return Ok(Decision::Return(false));
                }
                if history.runs.len() >= history_size
                    && history.runs.last().is_some_and(|e| e.slot > slot)
                {
                    // Older than everything kept: recording it would drop it at once.
                    return Ok(Decision::Return(false));
                }
                history.upsert(
                    HistoryEntry {
                        slot,
                        manual: false,
                        token: None,
                        instance: instance.to_owned(),
                        status: RunStatus::Skipped(reason),
                        message: None,
                        started_ms: now,
                        finished_ms: Some(now),
                        takeovers: 0,
                    },
                    history_size,
                );
                Ok(Decision::Commit {
                    mutations: vec![encode(&history_key, &history)],
                    then: true,
                })
            })
            .await
    }

    async fn history(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>, Error> {
        validate_job_name(job)?;
        let history_key = Self::history_key(job);
        let entries = self
            .engine
            .snapshot(std::slice::from_ref(&history_key))
            .await?;
        let history: History = match entries.first().and_then(|e| e.value.as_deref()) {
            None => History::default(),
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| coord_backend::Error::malformed(&history_key, e.to_string()))?,
        };
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
                manual: e.manual,
            })
            .collect())
    }

    async fn prune(&self, job: &str) -> Result<usize, Error> {
        validate_job_name(job)?;
        let Some(window) = self.options.forget_claims_after else {
            return Ok(0);
        };
        let now = self.clock.now_millis();
        let horizon = now.saturating_sub(millis(window));
        let prefix = Self::slot_prefix(job);
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
        let history_key = Self::history_key(job);
        let mut forgotten = 0;
        for batch in old.chunks(PRUNE_BATCH) {
            let mut keys = batch.to_vec();
            keys.push(history_key.clone());
            forgotten += self
                .engine
                .decide(&keys, |view| {
                    let mut deletes = Vec::new();
                    let mut below = 0;
                    for key in batch {
                        let Some(record) = decode::<SlotRecord>(view, key)? else {
                            continue;
                        };
                        // Remember a claim for the whole window after it ended,
                        // so a backup still following it sees it done.
                        let ended = record.finished_ms.unwrap_or(u64::MAX);
                        if record.state != SlotState::Running && ended < horizon {
                            deletes.push(Mutation::delete(key.clone()));
                            if let Ok(slot) = key[prefix.len()..].parse::<u64>() {
                                below = below.max(slot.saturating_add(1));
                            }
                        }
                    }
                    let n = deletes.len();
                    if n == 0 {
                        return Ok::<_, Error>(Decision::Return(0));
                    }
                    // Raise the floor in the same txn as the deletes.
                    let mut history: History = decode(view, &history_key)?.unwrap_or_default();
                    history.forgotten_below = history.forgotten_below.max(below);
                    deletes.push(encode(&history_key, &history));
                    Ok(Decision::Commit {
                        mutations: deletes,
                        then: n,
                    })
                })
                .await?;
        }
        Ok(forgotten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_backend::ManualClock;
    use coord_memory::SingleProcessMemoryBackend;

    fn store(clock: Arc<ManualClock>, options: RunStoreOptions) -> RunStore {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("unit").unwrap());
        RunStore::new(backend, clock, options).unwrap()
    }

    #[tokio::test]
    async fn prune_forgets_only_old_finished_claims() {
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        let s = store(
            clock.clone(),
            RunStoreOptions::default().forget_claims_after(Some(Duration::from_secs(60))),
        );
        let ttl = Duration::from_secs(30);
        for slot in [1_000_000u64, 1_001_000] {
            let req =
                ClaimRequest::new("j", slot, format!("t{slot}"), "a", ttl).allow_overlap(true);
            assert!(s.claim(&req).await.unwrap().won);
        }
        s.finish("j", 1_000_000, "t1000000", FinalStatus::Succeeded)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(59));
        assert_eq!(s.prune("j").await.unwrap(), 0, "inside the window");
        clock.advance(Duration::from_secs(2));
        assert_eq!(s.prune("j").await.unwrap(), 1, "the running claim stays");
        // Forgotten, yet never claimable again: the floor kept in the store
        // refuses it whatever the claimer's clock says.
        let again = ClaimRequest::new("j", 1_000_000, "late", "b", ttl).allow_overlap(true);
        let refused = s.claim(&again).await.unwrap();
        assert!(
            !refused.won && refused.outcome == ClaimOutcome::Done,
            "{refused:?}"
        );
        // A later slot than the forgotten ones is claimable as usual.
        let later = ClaimRequest::new("j", 1_002_000, "next", "b", ttl).allow_overlap(true);
        assert!(s.claim(&later).await.unwrap().won);
    }

    #[tokio::test]
    async fn bad_input_is_refused_before_the_store() {
        let s = store(
            Arc::new(ManualClock::at_millis(0)),
            RunStoreOptions::default(),
        );
        let ttl = Duration::from_secs(1);
        for job in ["", "a/b", "ünïcode", &"x".repeat(129)] {
            let req = ClaimRequest::new(job, 1, "t", "a", ttl);
            assert!(
                matches!(s.claim(&req).await, Err(Error::InvalidJobName(_))),
                "{job:?}"
            );
        }
        let req = ClaimRequest::new("j", 1, "", "a", ttl);
        assert!(matches!(
            s.claim(&req).await,
            Err(Error::InvalidArgument(_))
        ));
        let req = ClaimRequest::new("j", 1, "t", "a", Duration::ZERO);
        assert!(matches!(
            s.claim(&req).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(s.engine().stats().round_trips() == 0);
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("unit").unwrap());
        let clock = Arc::new(ManualClock::at_millis(0));
        assert!(RunStore::new(
            backend.clone(),
            clock.clone(),
            RunStoreOptions::default().history_size(0)
        )
        .is_err());
        assert!(RunStore::new(
            backend,
            clock,
            RunStoreOptions::default().forget_claims_after(Some(Duration::ZERO))
        )
        .is_err());
    }

    #[tokio::test]
    async fn history_is_bounded_and_skips_do_not_block_claims() {
        let clock = Arc::new(ManualClock::at_millis(10_000));
        let s = store(clock, RunStoreOptions::default().history_size(3));
        let ttl = Duration::from_secs(30);
        for slot in 1..=5u64 {
            assert!(s
                .record_skip("j", slot, "a", SkipReason::Late)
                .await
                .unwrap());
        }
        assert!(
            !s.record_skip("j", 5, "b", SkipReason::Late).await.unwrap(),
            "recorded once"
        );
        assert!(
            !s.record_skip("j", 1, "b", SkipReason::Late).await.unwrap(),
            "older than kept"
        );
        let h = s.history("j", 10).await.unwrap();
        assert_eq!(h.iter().map(|r| r.slot).collect::<Vec<_>>(), vec![5, 4, 3]);
        let req = ClaimRequest::new("j", 4, "t", "b", ttl);
        assert!(
            s.claim(&req).await.unwrap().won,
            "a skip record does not block an on-time claim"
        );
        let h = s.history("j", 10).await.unwrap();
        assert_eq!(h[1].status, RunStatus::Running);
        assert_eq!(h[1].instance, "b");
        assert!(!s.record_skip("j", 4, "c", SkipReason::Late).await.unwrap());
    }
}
