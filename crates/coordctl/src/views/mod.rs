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
//!
//! # Layout
//!
//! This file holds what every family shares: [`Stores`], [`Page`], the
//! listing of names under a prefix and the [`Paged`] view of its records,
//! time and error conversions, and [`print_json`]. Each family of records has its own file, re-exported
//! here so callers name everything as `views::…`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use coord_adapters::board::{BoardAdapter, BoardError};
use coord_adapters::lock::{FairLock, GenericLock, GenericSemaphore, LockError};
use coord_adapters::sideeffect::{SideEffectAdapter, SideEffectError};
use coord_backend::{Backend, Error, SystemClock};
use coord_scheduler::{RunStore, RunStoreOptions};
use serde::Serialize;

mod conformance;
mod elections;
mod fair_locks;
mod jobs;
mod locks;
mod rwlocks;
mod semaphores;
mod side_effects;
mod tasks;

pub(crate) use conformance::conformance;
pub(crate) use elections::{elections, ElectionsView};
pub(crate) use fair_locks::{fair_locks, FairLocksView};
pub(crate) use jobs::{jobs, runs, JobsView, RunView, RunsView};
pub(crate) use locks::{locks, LockView, LocksView};
pub(crate) use rwlocks::{rwlocks, RwLocksView};
pub(crate) use semaphores::{semaphores, SemaphoresView};
pub(crate) use side_effects::{
    resources, side_effects, InspectView, ResourcesView, SideEffectsView, UncertainKind,
};
pub(crate) use tasks::{
    dead_tasks, queues, task, task_page, tasks, DeadTasksView, QueuesView, TaskPageView, TaskView,
    TasksView,
};

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

/// Names listed for one view, with where the listing stopped.
#[derive(Debug)]
struct Names {
    names: Vec<String>,
    /// More names follow the last one of `names`.
    truncated: bool,
    /// The cursor of the next page (`Some` only when `truncated`).
    next_after: Option<String>,
}

impl Names {
    /// Every name of `names`, none left out.
    fn all(names: Vec<String>) -> Names {
        Names {
            names,
            truncated: false,
            next_after: None,
        }
    }

    /// The first `page.limit` names of `names` (sorted) after `page.after`.
    fn window(names: impl IntoIterator<Item = String>, page: &Page) -> Names {
        let mut names = names
            .into_iter()
            .filter(|n| page.after.as_deref().is_none_or(|after| n.as_str() > after));
        let taken: Vec<String> = names.by_ref().take(page.limit).collect();
        let truncated = names.next().is_some();
        let next_after = truncated.then(|| taken.last().cloned()).flatten();
        Names {
            names: taken,
            truncated,
            next_after,
        }
    }

    /// Each name read by `read` (`None`: listed but gone since, or not such
    /// a record: skipped, never invented), as a page of `stores`' namespace.
    async fn read<R, Fut>(
        self,
        stores: &Stores,
        read: impl Fn(String) -> Fut,
    ) -> Result<Paged<R>, Error>
    where
        Fut: std::future::Future<Output = Result<Option<R>, Error>>,
    {
        let mut rows = Vec::with_capacity(self.names.len());
        for name in self.names {
            rows.extend(read(name).await?);
        }
        Ok(Paged {
            listing: Listing {
                namespace: stores.backend.namespace().to_owned(),
                now_ms: now_ms(),
                truncated: self.truncated,
                next_after: self.next_after,
            },
            rows,
        })
    }
}

/// The names under `prefix` (prefix stripped), bounded by `page` (`None`:
/// every name).
async fn list_names(
    backend: &Arc<dyn Backend>,
    prefix: &str,
    page: Option<&Page>,
) -> Result<Names, Error> {
    let names = backend
        .keys(prefix)
        .await?
        .into_iter()
        .filter_map(|k| k.strip_prefix(prefix).map(str::to_owned))
        // No adapter stores a record under an empty name.
        .filter(|name| !name.is_empty());
    Ok(match page {
        Some(page) => Names::window(names, page),
        None => Names::all(names.collect()),
    })
}

/// Where a page of records came from, when it was read, and whether more
/// follow: beside every listing view's rows (flattened into its JSON).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Listing {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
}

/// One row of a listing view: the JSON field its page lists it under.
pub(crate) trait Row: Serialize {
    /// The field of [`Paged`]'s JSON holding the rows (docs/console.md:
    /// `locks`, `tasks`, ...).
    const FIELD: &'static str;
}

/// A page of one kind of record: the [`Listing`]'s fields, then the rows
/// under [`Row::FIELD`] (`{"namespace": …, "next_after": …, "locks": […]}`),
/// the shape every `/api/` listing shares.
#[derive(Clone, Debug, Serialize)]
#[serde(bound = "R: Row")]
pub(crate) struct Paged<R> {
    #[serde(flatten)]
    pub(crate) listing: Listing,
    #[serde(flatten, serialize_with = "rows_under_field")]
    pub(crate) rows: Vec<R>,
}

/// `rows` as the one entry `R::FIELD` of the page's JSON object.
fn rows_under_field<R: Row, S: serde::Serializer>(rows: &[R], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap as _;
    let mut map = s.serialize_map(Some(1))?;
    map.serialize_entry(R::FIELD, rows)?;
    map.end()
}

/// The records of `page` under `prefix`, each read by `read` (see
/// [`Names::read`]).
async fn read_page<R, Fut>(
    stores: &Stores,
    prefix: &str,
    page: &Page,
    read: impl Fn(String) -> Fut,
) -> Result<Paged<R>, Error>
where
    Fut: std::future::Future<Output = Result<Option<R>, Error>>,
{
    list_names(&stores.backend, prefix, Some(page))
        .await?
        .read(stores, read)
        .await
}

/// A lock's state as the views name it: `free` (nobody holds it), `held`
/// (a live lease) or `expired` (a holder whose lease ran out).
pub(crate) fn lock_state(expires_at: Option<SystemTime>, live: bool) -> &'static str {
    match (expires_at, live) {
        (None, _) => "free",
        (Some(_), true) => "held",
        (Some(_), false) => "expired",
    }
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

pub(crate) fn board_error(e: BoardError) -> Error {
    match e {
        BoardError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

pub(crate) fn scheduler_error(e: impl Into<coord_scheduler::Error>) -> Error {
    e.into()
        .store_error()
        .unwrap_or_else(|other| Error::Config(other.to_string()))
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

/// A length of time in ms as the tables show it: "1h 2m", "9m 53s", "4.2s".
pub(crate) fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{:.1}s", ms as f64 / 1000.0),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
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

/// Print a command's report as one pretty JSON document (`--json`), or else
/// as its text (`text`), on stdout.
pub(crate) fn print_report<T: Serialize>(
    report: &T,
    json: bool,
    text: impl FnOnce(&T),
) -> Result<(), Error> {
    if json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| Error::Config(format!("cannot encode the report: {e}")))?;
        println!("{text}");
    } else {
        text(report);
    }
    Ok(())
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
        let patiently = || WaitOptions::with_timeout(Duration::from_secs(30));
        let fair = FairLock::new(backend.clone());
        let held = fair.try_lock("jobs/a", ttl).await.unwrap().unwrap();
        let waiter = fair.clone();
        let waiting =
            tokio::spawn(async move { waiter.lock_with("jobs/a", ttl, &patiently()).await });
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
        assert_eq!(view.rows.len(), 1, "{view:?}");
        let row = &view.rows[0];
        assert_eq!(
            (row.lock.key.as_str(), row.lock.fence, row.lock.state),
            ("jobs/a", 1, "held")
        );
        assert_eq!(row.waiting.len(), 1);
        assert!(row.waiting[0].live);

        let view = semaphores(&stores, &Page::first(10)).await.unwrap();
        assert_eq!(view.rows.len(), 1, "{view:?}");
        let row = &view.rows[0];
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
        assert!(view.rows[0].waiting.is_empty());

        // A semaphore waiter in line shows as `waiting` until it is served.
        let only = sem.try_acquire("single", 1, ttl).await.unwrap().unwrap();
        let in_line = sem.clone();
        let queued =
            tokio::spawn(async move { in_line.acquire("single", 1, ttl, &patiently()).await });
        let waiting_in = |view: &SemaphoresView| {
            view.rows
                .iter()
                .find(|s| s.key == "single")
                .map_or(0, |s| s.waiting)
        };
        while waiting_in(&semaphores(&stores, &Page::first(10)).await.unwrap()) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sem.release(only).await.unwrap();
        let served = queued.await.unwrap().unwrap();
        assert_eq!(
            waiting_in(&semaphores(&stores, &Page::first(10)).await.unwrap()),
            0
        );
        sem.release(served).await.unwrap();
    }
}
