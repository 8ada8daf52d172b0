//! How a [`Scheduler`](super::Scheduler) behaves: its instance name and
//! the bounds that keep one slow store or one backlog from stalling it.

use std::time::Duration;

use coord_adapters::mint_token;

#[cfg(doc)]
use super::Scheduler;

/// Options of a [`Scheduler`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// This instance's name in history and logs (default: `$HOSTNAME-<random>`).
    pub instance_id: String,
    /// Longest sleep of the tick loop (default 500 ms): how soon a retried
    /// slot is looked at again.
    pub poll_interval: Duration,
    /// Skipped slots recorded one by one per job and tick (default 20); more
    /// are logged as one line (after a long stall or a big clock jump).
    pub max_skips_recorded_per_tick: usize,
    /// Due slots started per job and tick (default 100); the rest wait for
    /// the next tick (and may become late).
    pub max_starts_per_tick: usize,
    /// Longest wait for one store call (default 10 s): a claim, skip record,
    /// finish or release that does not answer by then is treated as failed
    /// (a claim is retried with the same token, so one that landed late is
    /// still recognised as ours). Heartbeats are bounded by a third of the
    /// job's lease. A store that hangs (a stopped
    /// process holding its write lock, a dead connection) must not stall
    /// every job of the instance.
    pub store_timeout: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "instance".into());
        SchedulerOptions {
            instance_id: format!("{host}-{}", &mint_token()[..8]),
            poll_interval: Duration::from_millis(500),
            max_skips_recorded_per_tick: 20,
            max_starts_per_tick: 100,
            store_timeout: Duration::from_secs(10),
        }
    }
}

impl SchedulerOptions {
    /// Options with this instance id.
    pub fn instance(id: impl Into<String>) -> Self {
        SchedulerOptions {
            instance_id: id.into(),
            ..SchedulerOptions::default()
        }
    }
}

coord_backend::setters! {
    SchedulerOptions {
        /// Set the poll interval.
        with_poll_interval(interval: Duration) => poll_interval = interval;
        /// Set the longest wait for one store call.
        with_store_timeout(timeout: Duration) => store_timeout = timeout;
    }
}
