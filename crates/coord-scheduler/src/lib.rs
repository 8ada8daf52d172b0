//! Cron and interval jobs that run **exactly once per (job, slot)** across
//! every instance sharing a store.
//!
//! - A [`Schedule`] turns a cron expression (with a time zone and an explicit
//!   DST policy) or an epoch-aligned interval into **slots**: scheduled
//!   instants in UTC milliseconds, identical on every instance.
//! - A [`SlotStore`] decides who runs a slot. [`RunStore`] implements it over
//!   any `coord_backend::Backend`, every decision one
//!   [`coord_adapters::CasEngine::decide`] call: `claim` is atomic, true for
//!   exactly one token per `(job, slot)` and true again for the same token;
//!   leases with heartbeat / finish / release by token; takeover of expired
//!   leases; overlap protection; bounded history from all instances.
//! - A [`Scheduler`] ticks on an injectable [`coord_backend::Clock`], claims
//!   due slots, runs handlers with heartbeats, catches up missed slots within
//!   `max_late`, records skipped ones, runs [`Scheduler::run_now`], and
//!   releases its leases on [`Scheduler::shutdown`]. [`LockingHint`] picks
//!   per job between no coordination, required coordination, and
//!   coordination when a store is configured.
//! - A job with a retry policy ([`JobOptions::with_retry`]: `max_attempts`,
//!   an exponential [`Backoff`] with jitter and a cap) runs a failed handler
//!   again after the backoff, only while the retry still starts within the
//!   slot's lateness bound (`slot + jitter + max_late`, by the instance's
//!   clock), holding the slot's lease through the wait and recording each
//!   attempt in the store by token first ([`SlotStore::record_attempt`]).
//!   A takeover starts the next attempt too; past `max_attempts` it
//!   finishes the run failed instead of running it. History
//!   ([`RunRecord::attempts`]) shows how many attempts a slot started.
//! - [`Config`] reads the TOML configuration (`[store] url = ...`: swapping
//!   the store is one line).
//!
//! **Boundary.** Exactly-once is about *starting* a slot's handler: a claim
//! is won once, and a run is taken over only after its lease expired (or it
//! was released), so a holder that stalls longer than its lease without a
//! heartbeat can overlap with its backup; the handler learns it through
//! [`RunContext::is_lease_lost`]. Use a lock with fencing tokens
//! (`coord-adapters`) downstream when the work itself must be fenced.
//! Expiry and lateness are judged by each instance's clock: keep clocks
//! synchronized to well within the lease TTL.
//!
//! Retries keep that boundary: a retry runs only on the instance that
//! still holds the slot's lease, after the store accepted its attempt for
//! that instance's token (a takeover, or a prune, makes the store refuse
//! it), and not once the instance's lease is lost (no heartbeat confirmed
//! within the lease). An attempt whose recording got no answer is not run
//! until the store answers the same question (asking again is safe: the
//! store answers an attempt it already recorded). So two attempts of one
//! slot never overlap unless a holder stalls past its lease mid-attempt,
//! the same case as above.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use coord_backend::{Backend, SystemClock};
//! use coord_memory::SingleProcessMemoryBackend;
//! use coord_scheduler::{handler, Job, JobOptions, LockingHint, RunStore, RunStoreOptions, Schedule, Scheduler, SchedulerOptions};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("app").unwrap());
//! let clock = Arc::new(SystemClock);
//! let store = RunStore::new(backend, clock.clone(), RunStoreOptions::default()).unwrap();
//! let scheduler = Scheduler::new(Some(Arc::new(store)), clock, SchedulerOptions::instance("web-1"));
//! scheduler.add_job(
//!     Job::new(
//!         "report",
//!         Schedule::parse("0 */5 * * * *", Some("Europe/Paris")).unwrap(),
//!         handler(|ctx| async move {
//!             println!("report for slot {}", ctx.slot);
//!             Ok(())
//!         }),
//!     )
//!     .with_options(JobOptions::default().with_hint(LockingHint::RequireGlobal).with_max_late(Duration::from_secs(30))),
//! ).unwrap();
//! scheduler.start();
//! scheduler.shutdown().await;
//! # });
//! ```

mod config;
mod error;
mod job;
mod schedule;
mod scheduler;
pub mod telemetry;

pub use config::{Config, ConfigError, JobConfig, SchedulerConfig, StoreConfig};
/// The run store lives with the other adapters; re-exported here, where
/// the scheduler's users look for it.
pub use coord_adapters::runs::{
    validate_job_name, ActiveRun, Claim, ClaimOutcome, ClaimRequest, FinalStatus, Lease, ManualRun,
    RunError, RunRecord, RunStatus, RunStore, RunStoreOptions, SkipReason, Slot, SlotStore,
    Takeover,
};
pub use error::Error;
pub use job::{
    handler, Backoff, BoxFuture, Handler, HandlerResult, Job, JobOptions, LockingHint, Retry,
    RunContext,
};
pub use schedule::{jitter_for, parse_duration, parse_time_zone, Schedule};
pub use scheduler::{ManualReport, Scheduler, SchedulerOptions, TickAction, TickEvent, TickReport};

/// Re-exported so callers can name time zones without a direct dependency.
pub use chrono_tz::Tz;
