//! The machine-readable views of a store: one set of serde types, built by
//! one set of functions, behind both `coordctl … --json` and the web
//! console (`coordctl serve`: its `/api/` answers and its HTML pages), so
//! the two can never disagree. The schema is documented field by field in
//! docs/console.md ("Machine-readable output").
//!
//! # Contract
//!
//! - Records are decoded by their adapters only (`GenericLock::status`,
//!   `GenericRwLock::status`, `GenericElection::status`, `FairLock::status`,
//!   `GenericSemaphore::status`, `BoardAdapter::get`, `SideEffectAdapter::key_status` /
//!   `resource_status`, `RunStore::history` / `active`); these functions
//!   only list keys under the adapters' documented prefixes (AGENTS.md,
//!   "Where records live") and arrange the answers.
//! - Nothing here carries a token or a record value beyond what the text
//!   tables of `coordctl inspect` and `cron history` show: no lock or lease
//!   token, no task payload or result, no side-effect payload; a completed
//!   side-effect key's result only in `inspect --all` (cut to 80 characters,
//!   as the table shows it).
//! - Each row is its own consistent read; a view as a whole is not one
//!   snapshot (a key may move between two rows). Views report, they never
//!   decide.
//! - A listing is bounded by a [`Page`]: at most `limit` names after the
//!   cursor `after` (names sort by bytes); `truncated` says more exist and
//!   `next_after` is the cursor of the next page.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use coord_adapters::board::{Board, BoardAdapter, BoardError, TaskState};
use coord_adapters::election::{ElectionError, GenericElection};
use coord_adapters::lock::{FairLock, GenericLock, GenericSemaphore, LockError};
use coord_adapters::rwlock::{GenericRwLock, RwLock, RwMode};
use coord_adapters::sideeffect::{KeyStatus, SideEffectAdapter, SideEffectError};
use coord_backend::{Backend, Error, SystemClock};
use coord_scheduler::{
    ActiveRun, RunRecord, RunStatus, RunStore, RunStoreOptions, SkipReason, SlotStore, Tz,
};
use serde::Serialize;

/// Side-effect intents per idempotency key (the adapter's documented layout).
pub(crate) const ACT_PREFIX: &str = "se/act/";
/// Side-effect resources (fence counter and lease per resource).
pub(crate) const RES_PREFIX: &str = "se/res/";
/// Task records of the default board (`BoardOptions::default`, prefix `board/`).
const TASK_PREFIX: &str = "board/task/";
/// The scheduler's records (`sched/<job>/…`, see coord-scheduler's store module).
const SCHED_PREFIX: &str = "sched/";

/// The largest `limit` a listing accepts (the console refuses more with 400).
pub(crate) const MAX_LIMIT: usize = 500;

/// A bounded window of a listing: at most `limit` names after `after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Page {
    /// At most this many names (1..=[`MAX_LIMIT`]).
    pub(crate) limit: usize,
    /// Only names sorting after this one (exclusive).
    pub(crate) after: Option<String>,
}

impl Page {
    /// The first `limit` names.
    pub(crate) fn first(limit: usize) -> Self {
        Page { limit, after: None }
    }
}

/// The names under `prefix` (prefix stripped), bounded by `page` (`None`:
/// every name), with `(truncated, next_after)`.
async fn list_names(
    backend: &Arc<dyn Backend>,
    prefix: &str,
    page: Option<&Page>,
) -> Result<(Vec<String>, bool, Option<String>), Error> {
    let names = backend
        .keys(prefix)
        .await?
        .into_iter()
        .filter_map(|k| k.strip_prefix(prefix).map(str::to_owned))
        // No adapter stores a record under an empty name.
        .filter(|name| !name.is_empty());
    let Some(page) = page else {
        return Ok((names.collect(), false, None));
    };
    let mut names = names.filter(|n| page.after.as_deref().is_none_or(|after| n.as_str() > after));
    let taken: Vec<String> = names.by_ref().take(page.limit).collect();
    let truncated = names.next().is_some();
    let next_after = if truncated {
        taken.last().cloned()
    } else {
        None
    };
    Ok((taken, truncated, next_after))
}

/// UTC milliseconds since the epoch (0 before it).
pub(crate) fn ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    ms(SystemTime::now())
}

/// Store errors pass through; every other side-effect error is unexpected
/// for a read and is reported as a config error with its text.
pub(crate) fn side_effect_error(e: SideEffectError) -> Error {
    match e {
        SideEffectError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

fn lock_error(e: LockError) -> Error {
    match e {
        LockError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

fn board_error(e: BoardError) -> Error {
    match e {
        BoardError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

pub(crate) fn scheduler_error(e: coord_scheduler::Error) -> Error {
    match e {
        coord_scheduler::Error::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

/// The adapters over one store that the views read through.
#[derive(Clone, Debug)]
pub(crate) struct Stores {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) locks: GenericLock,
    pub(crate) fair_locks: FairLock,
    pub(crate) semaphores: GenericSemaphore,
    pub(crate) board: BoardAdapter,
    pub(crate) effects: SideEffectAdapter,
    pub(crate) runs: Arc<RunStore>,
}

impl Stores {
    /// Every adapter with its default options (default record prefixes, system clock).
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Result<Self, Error> {
        let runs = RunStore::new(
            backend.clone(),
            Arc::new(SystemClock),
            RunStoreOptions::default(),
        )
        .map_err(scheduler_error)?;
        Ok(Stores {
            locks: GenericLock::new(backend.clone()),
            fair_locks: FairLock::new(backend.clone()),
            semaphores: GenericSemaphore::new(backend.clone()),
            board: BoardAdapter::new(backend.clone()),
            effects: SideEffectAdapter::new(backend.clone()),
            runs: Arc::new(runs),
            backend,
        })
    }
}

// ----- side effects (`coordctl inspect --json`, /api/sideeffects, /api/resources) -----

/// Why an uncertain key is uncertain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum UncertainKind {
    /// Marked uncertain (an apply whose result is unknown).
    Marked,
    /// An intent whose lease ended before it completed (holder died or released).
    LeaseLost,
}

/// A key `acquire` answers `Uncertain` for: reconcile it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct UncertainKey {
    pub(crate) key: String,
    pub(crate) kind: UncertainKind,
    pub(crate) reason: String,
    /// The intent's resource (`lease_lost` only): `reconcile` defaults to it.
    pub(crate) resource: Option<String>,
    /// The intent's fence (`lease_lost` only).
    pub(crate) fence: Option<u64>,
}

/// An open execution intent.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct InFlightKey {
    pub(crate) key: String,
    pub(crate) resource: String,
    pub(crate) fence: u64,
    /// Whether the intent's lease is held and unexpired (false: the key reads as uncertain).
    pub(crate) live: bool,
    /// The key holding the resource now (it may since be another key's).
    pub(crate) resource_holder: Option<String>,
    /// When the resource holder's lease ends (UTC ms).
    pub(crate) lease_expires_ms: Option<u64>,
}

/// A key that needs nothing (listed with `inspect --all` only).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SettledKey {
    pub(crate) key: String,
    /// `completed` or `idle`.
    pub(crate) state: &'static str,
    /// A completed key's result as the text table shows it (lossy UTF-8, cut to 80 characters).
    pub(crate) result: Option<String>,
}

/// The side-effect keys of one page (or every key, for `inspect`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SideEffectsView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    /// How many keys were read.
    pub(crate) examined: usize,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) uncertain: Vec<UncertainKey>,
    pub(crate) in_flight: Vec<InFlightKey>,
    pub(crate) completed: usize,
    pub(crate) idle: usize,
    /// Completed and idle keys (only when asked for: `inspect --all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) settled: Option<Vec<SettledKey>>,
}

/// One side-effect resource: its fence counter and lease.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResourceView {
    pub(crate) resource: String,
    pub(crate) highest_fence: u64,
    /// The idempotency key holding it, if any (expired or not).
    pub(crate) holder: Option<String>,
    pub(crate) lease_expires_ms: Option<u64>,
    /// `free`, `live` or `expired`.
    pub(crate) state: &'static str,
}

/// The side-effect resources of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResourcesView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) resources: Vec<ResourceView>,
}

/// `coordctl inspect --json`: the keys and the resources of the text report.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct InspectView {
    #[serde(flatten)]
    pub(crate) keys: SideEffectsView,
    pub(crate) resources: Vec<ResourceView>,
}

/// A string cut to `max` characters, ending in `…` when cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// The side-effect keys: the named ones, or those of `page` (`None`: all).
pub(crate) async fn side_effects(
    stores: &Stores,
    named: Option<&[String]>,
    page: Option<&Page>,
    settled: bool,
) -> Result<SideEffectsView, Error> {
    let (keys, truncated, next_after) = match named {
        Some(named) => (named.to_vec(), false, None),
        None => list_names(&stores.backend, ACT_PREFIX, page).await?,
    };
    let adapter = &stores.effects;
    let mut view = SideEffectsView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: 0,
        examined: keys.len(),
        truncated,
        next_after,
        uncertain: Vec::new(),
        in_flight: Vec::new(),
        completed: 0,
        idle: 0,
        settled: settled.then(Vec::new),
    };
    for key in keys {
        match adapter.key_status(&key).await.map_err(side_effect_error)? {
            KeyStatus::Uncertain { reason } => view.uncertain.push(UncertainKey {
                key,
                kind: UncertainKind::Marked,
                reason,
                resource: None,
                fence: None,
            }),
            KeyStatus::InFlight {
                resource,
                fence,
                live,
            } => {
                let res = adapter
                    .resource_status(&resource)
                    .await
                    .map_err(side_effect_error)?;
                // What `acquire` answers `Uncertain` for: an intent whose lease is gone.
                if !live {
                    view.uncertain.push(UncertainKey {
                        key: key.clone(),
                        kind: UncertainKind::LeaseLost,
                        reason: format!(
                            "intent ({fence}) lost its lease before completing: the holder died or released"
                        ),
                        resource: Some(resource.clone()),
                        fence: Some(fence.0),
                    });
                }
                view.in_flight.push(InFlightKey {
                    key,
                    resource,
                    fence: fence.0,
                    live,
                    resource_holder: res.holder,
                    lease_expires_ms: res.expires_at.map(ms),
                });
            }
            KeyStatus::Completed { result } => {
                view.completed += 1;
                if let Some(settled) = view.settled.as_mut() {
                    settled.push(SettledKey {
                        key,
                        state: "completed",
                        result: Some(shorten(&String::from_utf8_lossy(result.as_bytes()), 80)),
                    });
                }
            }
            KeyStatus::Idle => {
                view.idle += 1;
                if let Some(settled) = view.settled.as_mut() {
                    settled.push(SettledKey {
                        key,
                        state: "idle",
                        result: None,
                    });
                }
            }
            // A state this coordctl does not know: neither invented nor hidden.
            _ => view.uncertain.push(UncertainKey {
                key,
                kind: UncertainKind::Marked,
                reason: "in a state this coordctl does not know".into(),
                resource: None,
                fence: None,
            }),
        }
    }
    view.now_ms = ms(adapter.clock().now());
    Ok(view)
}

async fn resource_row(stores: &Stores, resource: String) -> Result<ResourceView, Error> {
    let s = stores
        .effects
        .resource_status(&resource)
        .await
        .map_err(side_effect_error)?;
    let state = match (&s.holder, s.live) {
        (None, _) => "free",
        (Some(_), true) => "live",
        (Some(_), false) => "expired",
    };
    Ok(ResourceView {
        resource,
        highest_fence: s.highest_fence.0,
        holder: s.holder,
        lease_expires_ms: s.expires_at.map(ms),
        state,
    })
}

/// The named resources, or those of `page` (`None`: all).
pub(crate) async fn resources(
    stores: &Stores,
    named: Option<Vec<String>>,
    page: Option<&Page>,
) -> Result<ResourcesView, Error> {
    let (names, truncated, next_after) = match named {
        Some(named) => (named, false, None),
        None => list_names(&stores.backend, RES_PREFIX, page).await?,
    };
    let mut rows = Vec::with_capacity(names.len());
    for name in names {
        rows.push(resource_row(stores, name).await?);
    }
    Ok(ResourcesView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: ms(stores.effects.clock().now()),
        truncated,
        next_after,
        resources: rows,
    })
}

// ----- locks (/api/locks) -----

/// One lock record of `GenericLock` (`lock/<key>`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct LockView {
    pub(crate) key: String,
    /// The fence of the latest grant.
    pub(crate) fence: u64,
    /// `held` (live lease), `expired` (a holder whose lease ran out) or `free`.
    pub(crate) state: &'static str,
    pub(crate) lease_expires_ms: Option<u64>,
}

/// The lock records of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct LocksView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) locks: Vec<LockView>,
}

/// The lock records of `page`.
pub(crate) async fn locks(stores: &Stores, page: &Page) -> Result<LocksView, Error> {
    let prefix = stores.locks.key_prefix().to_owned();
    let (keys, truncated, next_after) = list_names(&stores.backend, &prefix, Some(page)).await?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        // A key listed but gone (or unreadable as a lock key) is skipped, not invented.
        let Some(status) = stores.locks.status(&key).await.map_err(lock_error)? else {
            continue;
        };
        rows.push(LockView {
            state: match (status.expires_at, status.live) {
                (None, _) => "free",
                (Some(_), true) => "held",
                (Some(_), false) => "expired",
            },
            key: status.key,
            fence: status.fence,
            lease_expires_ms: status.expires_at.map(ms),
        });
    }
    Ok(LocksView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        locks: rows,
    })
}

// ----- read-write locks and elections (/api/rwlocks, /api/elections) -----

/// One holder of a read-write lock (no token: it is a credential).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RwHolderView {
    /// `read` or `write`.
    pub(crate) mode: &'static str,
    pub(crate) fence: u64,
    /// `held` (live lease) or `expired` (dropped at the record's next write).
    pub(crate) state: &'static str,
    pub(crate) lease_expires_ms: u64,
}

/// One record of `GenericRwLock` (`rwlock/<key>`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RwLockView {
    pub(crate) key: String,
    /// The fence of the latest grant (readers and writers share the counter).
    pub(crate) fence: u64,
    /// `read` (live readers only), `write`, or `free`.
    pub(crate) state: &'static str,
    pub(crate) holders: Vec<RwHolderView>,
    /// Live writers waiting in `write` (new readers wait behind them).
    pub(crate) queued_writers: usize,
}

/// The read-write lock records of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RwLocksView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) rwlocks: Vec<RwLockView>,
}

/// The read-write lock records of `page` (default prefix `rwlock/`).
pub(crate) async fn rwlocks(stores: &Stores, page: &Page) -> Result<RwLocksView, Error> {
    let rw = GenericRwLock::new(stores.backend.clone());
    let prefix = rw.key_prefix().to_owned();
    let (keys, truncated, next_after) = list_names(&stores.backend, &prefix, Some(page)).await?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(status) = rw.status(&key).await.map_err(lock_error)? else {
            continue;
        };
        let live = |mode| status.holders.iter().any(|h| h.live && h.mode == mode);
        rows.push(RwLockView {
            state: if live(RwMode::Write) {
                "write"
            } else if live(RwMode::Read) {
                "read"
            } else {
                "free"
            },
            holders: status
                .holders
                .iter()
                .map(|h| RwHolderView {
                    mode: match h.mode {
                        RwMode::Read => "read",
                        RwMode::Write => "write",
                    },
                    fence: h.fence,
                    state: if h.live { "held" } else { "expired" },
                    lease_expires_ms: ms(h.expires_at),
                })
                .collect(),
            key: status.key,
            fence: status.fence,
            queued_writers: status.queued_writers,
        });
    }
    Ok(RwLocksView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        rwlocks: rows,
    })
}

/// One election of `GenericElection` (`election/<name>`). The leader's
/// announced value is the application's: not shown.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ElectionView {
    pub(crate) name: String,
    /// The latest term granted (0: never won).
    pub(crate) term: u64,
    /// The live leader's candidate id; `None` when nobody leads (resigned, expired, never).
    pub(crate) leader: Option<String>,
    pub(crate) lease_expires_ms: Option<u64>,
}

/// The elections of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ElectionsView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) elections: Vec<ElectionView>,
}

/// The elections of `page` (default prefix `election/`).
pub(crate) async fn elections(stores: &Stores, page: &Page) -> Result<ElectionsView, Error> {
    let election = GenericElection::new(stores.backend.clone());
    let prefix = election.key_prefix().to_owned();
    let (names, truncated, next_after) = list_names(&stores.backend, &prefix, Some(page)).await?;
    let mut rows = Vec::with_capacity(names.len());
    for name in names {
        // A name listed but gone is skipped, not invented.
        let Some(status) = election.status(&name).await.map_err(election_error)? else {
            continue;
        };
        rows.push(ElectionView {
            name,
            term: status.term,
            lease_expires_ms: status.leader.as_ref().map(|l| ms(l.expires_at)),
            leader: status.leader.map(|l| l.candidate),
        });
    }
    Ok(ElectionsView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        elections: rows,
    })
}

fn election_error(e: ElectionError) -> Error {
    match e {
        ElectionError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

// ----- fair locks and semaphores (/api/fairlocks, /api/semaphores) -----

/// `limit` names of `names` (sorted) after the cursor, with `(truncated, next_after)`.
fn paged(names: Vec<String>, page: &Page) -> (Vec<String>, bool, Option<String>) {
    let mut names = names
        .into_iter()
        .filter(|n| page.after.as_deref().is_none_or(|after| n.as_str() > after));
    let taken: Vec<String> = names.by_ref().take(page.limit).collect();
    let truncated = names.next().is_some();
    let next_after = truncated.then(|| taken.last().cloned()).flatten();
    (taken, truncated, next_after)
}

/// One waiter's ticket of a fair lock (no token).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TicketView {
    /// The ticket's number: its place in line.
    pub(crate) seq: u64,
    /// Whether the ticket's lease is live (a dead one is skipped and removed).
    pub(crate) live: bool,
    pub(crate) lease_expires_ms: Option<u64>,
}

/// One `FairLock` key: the holder's lease and the waiters in line.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FairLockView {
    pub(crate) key: String,
    /// The fence of the latest grant.
    pub(crate) fence: u64,
    /// `held`, `expired` or `free`, as for `GenericLock`.
    pub(crate) state: &'static str,
    pub(crate) lease_expires_ms: Option<u64>,
    /// The waiters, in queue order.
    pub(crate) waiting: Vec<TicketView>,
}

/// The fair locks of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FairLocksView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) locks: Vec<FairLockView>,
}

/// The fair locks of `page` (keys with a lock record `fairlock/<key>/m` or
/// a line record `fairlock/<key>/n`).
pub(crate) async fn fair_locks(stores: &Stores, page: &Page) -> Result<FairLocksView, Error> {
    let prefix = stores.fair_locks.key_prefix().to_owned();
    let (names, _, _) = list_names(&stores.backend, &prefix, None).await?;
    // Ticket keys end in `/q/<20 digits>`, lock records in `/m`, lines in `/n`.
    let mut keys: Vec<String> = names
        .into_iter()
        .filter_map(|n| {
            n.strip_suffix("/m")
                .or_else(|| n.strip_suffix("/n"))
                .map(str::to_owned)
        })
        .filter(|k| !k.is_empty())
        .collect();
    keys.sort();
    keys.dedup();
    let (keys, truncated, next_after) = paged(keys, page);
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(status) = stores.fair_locks.status(&key).await.map_err(lock_error)? else {
            continue;
        };
        rows.push(FairLockView {
            state: match (status.expires_at, status.live) {
                (None, _) => "free",
                (Some(_), true) => "held",
                (Some(_), false) => "expired",
            },
            key: status.key,
            fence: status.fence,
            lease_expires_ms: status.expires_at.map(ms),
            waiting: status
                .waiting
                .into_iter()
                .map(|t| TicketView {
                    seq: t.seq,
                    live: t.live,
                    lease_expires_ms: t.expires_at.map(ms),
                })
                .collect(),
        });
    }
    Ok(FairLocksView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        locks: rows,
    })
}

/// One permit of a semaphore (no token).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PermitView {
    pub(crate) fence: u64,
    pub(crate) live: bool,
    pub(crate) lease_expires_ms: u64,
}

/// One `GenericSemaphore` key: its permits and their holders.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SemaphoreView {
    pub(crate) key: String,
    /// The fence of the latest permit.
    pub(crate) fence: u64,
    /// How many permits the holders asked for.
    pub(crate) permits: u32,
    /// How many permits are held now (live leases).
    pub(crate) held: usize,
    pub(crate) holders: Vec<PermitView>,
}

/// The semaphores of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SemaphoresView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) semaphores: Vec<SemaphoreView>,
}

/// The semaphores of `page` (records `sem/<key>`).
pub(crate) async fn semaphores(stores: &Stores, page: &Page) -> Result<SemaphoresView, Error> {
    let prefix = stores.semaphores.key_prefix().to_owned();
    let (keys, truncated, next_after) = list_names(&stores.backend, &prefix, Some(page)).await?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(status) = stores.semaphores.status(&key).await.map_err(lock_error)? else {
            continue;
        };
        let holders: Vec<PermitView> = status
            .holders
            .iter()
            .map(|h| PermitView {
                fence: h.fence,
                live: h.live,
                lease_expires_ms: ms(h.expires_at),
            })
            .collect();
        rows.push(SemaphoreView {
            held: holders.iter().filter(|h| h.live).count(),
            key: status.key,
            fence: status.fence,
            permits: status.permits,
            holders,
        });
    }
    Ok(SemaphoresView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        semaphores: rows,
    })
}

// ----- the task board (/api/tasks) -----

/// One task of the board (no payload, no result: those are the application's values).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TaskView {
    pub(crate) id: String,
    /// `open`, `claimed`, `expired` or `completed`.
    pub(crate) state: &'static str,
    /// Who holds (claimed), held (expired) or completed it.
    pub(crate) agent: Option<String>,
    /// When the claim's lease ends (claimed) or ended (expired), UTC ms.
    pub(crate) lease_expires_ms: Option<u64>,
    /// The generation of the latest claim (0 = never claimed).
    pub(crate) generation: u64,
    pub(crate) deps: Vec<String>,
}

/// The tasks of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TasksView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) tasks: Vec<TaskView>,
}

/// The tasks of `page`.
pub(crate) async fn tasks(stores: &Stores, page: &Page) -> Result<TasksView, Error> {
    let (ids, truncated, next_after) = list_names(&stores.backend, TASK_PREFIX, Some(page)).await?;
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        let task = match stores.board.get(&id).await {
            Ok(task) => task,
            // Listed but gone: skipped, not invented.
            Err(BoardError::NotFound { .. }) => continue,
            Err(e) => return Err(board_error(e)),
        };
        let (state, agent, lease) = match task.state {
            TaskState::Open => ("open", None, None),
            TaskState::Claimed { agent, expires_at } => ("claimed", Some(agent), Some(expires_at)),
            TaskState::Expired { agent, expired_at } => ("expired", Some(agent), Some(expired_at)),
            TaskState::Completed { agent, .. } => ("completed", Some(agent), None),
            _ => ("unknown", None, None),
        };
        rows.push(TaskView {
            id: task.id,
            state,
            agent,
            lease_expires_ms: lease.map(ms),
            generation: task.generation,
            deps: task.deps,
        });
    }
    Ok(TasksView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        tasks: rows,
    })
}

// ----- the scheduler (`coordctl cron history --json`, /api/jobs, /api/jobs/<job>/runs) -----

/// One run of a job, as `cron history` shows it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunView {
    /// The slot, UTC ms (for a manual run: when it started).
    pub(crate) slot_ms: u64,
    /// The slot in the view's time zone (ISO 8601).
    pub(crate) slot: String,
    pub(crate) instance: String,
    /// `running`, `succeeded`, `failed`, `timed_out`, `released` or `skipped`.
    pub(crate) status: String,
    /// `late` or `overlap` for a skipped slot.
    pub(crate) skip_reason: Option<&'static str>,
    /// A running run whose lease expired (another instance may take it over).
    pub(crate) lease_expired: bool,
    pub(crate) manual: bool,
    pub(crate) started_ms: u64,
    pub(crate) started: String,
    pub(crate) duration_ms: Option<u64>,
    pub(crate) takeovers: u32,
    /// The failure message, when there is one.
    pub(crate) message: Option<String>,
}

/// An unfinished run and its lease.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ActiveView {
    pub(crate) slot_ms: u64,
    pub(crate) instance: String,
    pub(crate) started_ms: u64,
    pub(crate) lease_until_ms: u64,
    pub(crate) live: bool,
}

/// The recent runs of one job.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunsView {
    pub(crate) job: String,
    /// The zone of `slot` / `started` (`UTC` unless the job's config names one).
    pub(crate) time_zone: String,
    /// Newest slot first.
    pub(crate) runs: Vec<RunView>,
    pub(crate) active: Vec<ActiveView>,
}

/// One job's summary: its unfinished runs and its most recent runs.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct JobView {
    pub(crate) job: String,
    pub(crate) active: Vec<ActiveView>,
    /// The most recent runs, newest slot first.
    pub(crate) recent: Vec<RunView>,
    /// How many of `recent` were skipped.
    pub(crate) recent_skipped: usize,
}

/// The jobs of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct JobsView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) jobs: Vec<JobView>,
}

fn status_word(status: RunStatus) -> (String, Option<&'static str>) {
    match status {
        RunStatus::Running => ("running".into(), None),
        RunStatus::Succeeded => ("succeeded".into(), None),
        RunStatus::Failed => ("failed".into(), None),
        RunStatus::TimedOut => ("timed_out".into(), None),
        RunStatus::Released => ("released".into(), None),
        RunStatus::Skipped(SkipReason::Late) => ("skipped".into(), Some("late")),
        RunStatus::Skipped(SkipReason::Overlap) => ("skipped".into(), Some("overlap")),
        other => (format!("{other:?}").to_lowercase(), None),
    }
}

fn active_view(a: &ActiveRun) -> ActiveView {
    ActiveView {
        slot_ms: a.slot,
        instance: a.instance.clone(),
        started_ms: a.started_ms,
        lease_until_ms: a.lease_until_ms,
        live: a.live,
    }
}

fn run_view(r: &RunRecord, active: &[ActiveRun], tz: Option<Tz>) -> RunView {
    let (status, skip_reason) = status_word(r.status);
    RunView {
        slot_ms: r.slot,
        slot: crate::cron::fmt_time(r.slot, tz),
        instance: r.instance.clone(),
        status,
        skip_reason,
        lease_expired: r.status == RunStatus::Running
            && active.iter().any(|a| a.slot == r.slot && !a.live),
        manual: r.manual,
        started_ms: r.started_ms,
        started: crate::cron::fmt_time(r.started_ms, tz),
        duration_ms: r.duration_ms,
        takeovers: r.takeovers,
        message: r.message.clone(),
    }
}

/// The recent runs of `job` (at most `limit`), times shown in `tz` (UTC when `None`).
pub(crate) async fn runs(
    store: &RunStore,
    job: &str,
    limit: usize,
    tz: Option<Tz>,
) -> Result<RunsView, Error> {
    let records = store.history(job, limit).await.map_err(scheduler_error)?;
    let active = store.active(job).await.map_err(scheduler_error)?;
    Ok(RunsView {
        job: job.to_owned(),
        time_zone: tz.map(|t| t.name().to_owned()).unwrap_or("UTC".into()),
        runs: records.iter().map(|r| run_view(r, &active, tz)).collect(),
        active: active.iter().map(active_view).collect(),
    })
}

/// The jobs with records in the store (a page of them), each with its
/// `recent` newest runs.
pub(crate) async fn jobs(stores: &Stores, page: &Page, recent: usize) -> Result<JobsView, Error> {
    // Every job has a `sched/<job>/history` record once it ran or skipped a slot.
    let mut names: Vec<String> = stores
        .backend
        .keys(SCHED_PREFIX)
        .await?
        .into_iter()
        .filter_map(|k| {
            k.strip_prefix(SCHED_PREFIX)
                .and_then(|rest| rest.strip_suffix("/history"))
                .filter(|job| !job.contains('/'))
                .map(str::to_owned)
        })
        .filter(|n| page.after.as_deref().is_none_or(|after| n.as_str() > after))
        .collect();
    let truncated = names.len() > page.limit;
    names.truncate(page.limit);
    let next_after = if truncated {
        names.last().cloned()
    } else {
        None
    };
    let mut jobs = Vec::with_capacity(names.len());
    for job in names {
        let view = runs(&stores.runs, &job, recent, None).await?;
        jobs.push(JobView {
            recent_skipped: view.runs.iter().filter(|r| r.status == "skipped").count(),
            job: view.job,
            active: view.active,
            recent: view.runs,
        });
    }
    Ok(JobsView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        jobs,
    })
}

// ----- conformance (`coordctl conformance --json`) -----

/// One conformance case.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CaseView {
    pub(crate) suite: &'static str,
    pub(crate) name: &'static str,
    pub(crate) ms: u64,
    pub(crate) passed: bool,
    /// Why it failed.
    pub(crate) failure: Option<String>,
}

/// `coordctl conformance --json`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ConformanceView {
    /// The store URL without namespace, credentials hidden.
    pub(crate) store: String,
    pub(crate) cases: Vec<CaseView>,
    pub(crate) passed: usize,
    pub(crate) failed: usize,
}

/// The conformance reports as a view.
pub(crate) fn conformance(
    store: String,
    reports: &[coord_conformance::CaseReport],
) -> ConformanceView {
    let cases: Vec<CaseView> = reports
        .iter()
        .map(|r| CaseView {
            suite: r.suite,
            name: r.name,
            ms: u64::try_from(r.elapsed.as_millis()).unwrap_or(u64::MAX),
            passed: r.result.is_ok(),
            failure: r.result.as_ref().err().map(|f| f.to_string()),
        })
        .collect();
    let failed = cases.iter().filter(|c| !c.passed).count();
    ConformanceView {
        store,
        passed: cases.len() - failed,
        failed,
        cases,
    }
}

/// Print one view as one line of JSON on stdout.
pub(crate) fn print_json<T: Serialize>(view: &T) -> Result<(), Error> {
    let line = serde_json::to_string(view)
        .map_err(|e| Error::Config(format!("cannot encode the JSON output: {e}")))?;
    println!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_adapters::lock::{Lock, LockExt, Semaphore, WaitOptions};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fair_locks_and_semaphores_show_holders_and_waiters_without_tokens() {
        let backend = coord::connect("memory://?namespace=views-recipes")
            .await
            .unwrap();
        let stores = Stores::new(backend.clone()).unwrap();
        let ttl = Duration::from_secs(60);
        let fair = FairLock::new(backend.clone());
        let held = fair.try_lock("jobs/a", ttl).await.unwrap().unwrap();
        let waiter = fair.clone();
        let waiting = tokio::spawn(async move {
            waiter
                .lock_with(
                    "jobs/a",
                    ttl,
                    &WaitOptions::with_timeout(Duration::from_secs(30)),
                )
                .await
        });
        // Wait until the waiter is in line.
        while stores
            .fair_locks
            .status("jobs/a")
            .await
            .unwrap()
            .is_none_or(|s| s.waiting.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let sem = GenericSemaphore::new(backend.clone());
        let permit = sem.try_acquire("pool", 3, ttl).await.unwrap().unwrap();

        let view = fair_locks(&stores, &Page::first(10)).await.unwrap();
        assert_eq!(view.locks.len(), 1, "{view:?}");
        let row = &view.locks[0];
        assert_eq!(
            (row.key.as_str(), row.fence, row.state),
            ("jobs/a", 1, "held")
        );
        assert_eq!(row.waiting.len(), 1);
        assert!(row.waiting[0].live);

        let view = semaphores(&stores, &Page::first(10)).await.unwrap();
        assert_eq!(view.semaphores.len(), 1, "{view:?}");
        let row = &view.semaphores[0];
        assert_eq!(
            (row.key.as_str(), row.permits, row.held, row.fence),
            ("pool", 3, 1, 1)
        );

        let json = serde_json::to_string(&(
            fair_locks(&stores, &Page::first(10)).await.unwrap(),
            semaphores(&stores, &Page::first(10)).await.unwrap(),
        ))
        .unwrap();
        assert!(
            !json.contains(held.token()) && !json.contains(permit.token()),
            "{json}"
        );

        fair.release(held).await.unwrap();
        let next = waiting.await.unwrap().unwrap();
        assert_eq!(next.fence(), 2);
        let view = fair_locks(&stores, &Page::first(10)).await.unwrap();
        assert!(view.locks[0].waiting.is_empty());
    }
}
