//! The scheduler's jobs and runs (`coordctl cron history --json`,
//! `/api/jobs`, `/api/jobs/<job>/runs`): a job's runs newest slot first, as
//! `cron history` shows them, and its unfinished runs with their leases.

use coord_backend::Error;
use coord_scheduler::{ActiveRun, RunRecord, RunStatus, RunStore, SkipReason, SlotStore, Tz};
use serde::Serialize;

use super::{list_names, scheduler_error, Names, Page, Paged, Row, Stores};

/// The scheduler's records (`sched/<job>/…`, see coord-scheduler's store module).
const SCHED_PREFIX: &str = "sched/";

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
    /// Attempts the slot started: 1 + retries + takeovers (0 for a skipped slot).
    pub(crate) attempts: u32,
    /// The failure message, when there is one (while a run is retried: the
    /// last attempt's failure).
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

impl Row for JobView {
    const FIELD: &'static str = "jobs";
}

/// The jobs of one page.
pub(crate) type JobsView = Paged<JobView>;

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
        attempts: r.attempts,
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
    let names = list_names(&stores.backend, SCHED_PREFIX, None).await?.names;
    let jobs = names.into_iter().filter_map(|rest| {
        rest.strip_suffix("/history")
            .filter(|job| !job.contains('/'))
            .map(str::to_owned)
    });
    Names::window(jobs, page)
        .read(stores, |job| async move {
            let view = runs(&stores.runs, &job, recent, None).await?;
            Ok(Some(JobView {
                recent_skipped: view.runs.iter().filter(|r| r.status == "skipped").count(),
                job: view.job,
                active: view.active,
                recent: view.runs,
            }))
        })
        .await
}
