use std::time::Duration;

/// Errors of the run store and of the scheduler runtime.
///
/// Variants name what the caller does next: retry later or page someone
/// ([`Error::Store`]), stop acting as the owner of a run ([`Error::NotOwner`]),
/// fix the job or the call (everything else). Losing a claim is **not** an
/// error: it is a [`crate::Claim`] with `won = false`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store failed (unreachable, indeterminate, malformed record,
    /// too much contention). Nothing is known to have changed unless the
    /// inner error says so.
    #[error("run store: {0}")]
    Store(#[from] coord_backend::Error),

    /// The token does not own this run: it never did, the run was finished
    /// or released, or another instance took the slot over after the lease
    /// expired. Stop acting as the owner; nothing was changed.
    #[error("token does not own run {job:?} slot {slot} (finished, released or taken over)")]
    NotOwner {
        /// The job.
        job: String,
        /// The slot (scheduled instant, UTC milliseconds).
        slot: u64,
    },

    /// A job name the store cannot key safely (empty, too long, or with a
    /// character outside `A-Z a-z 0-9 . _ : -`).
    #[error("invalid job name {0:?}: use 1 to 128 characters of A-Z a-z 0-9 . _ : -")]
    InvalidJobName(String),

    /// A schedule could not be understood.
    #[error("invalid schedule {schedule:?}: {reason}")]
    InvalidSchedule {
        /// The schedule as written.
        schedule: String,
        /// Why it was refused.
        reason: String,
    },

    /// An argument was out of range (zero lease, zero history size, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The store forgets claims sooner than this job could still claim a
    /// slot, so a late instance could run a slot again. Lower the job's
    /// jitter / max lateness / lease, or make the store remember longer.
    #[error(
        "job {job:?} needs claims remembered for more than {needed:?} ({reason}), \
         but the run store forgets them after {window:?}"
    )]
    DedupeWindowTooShort {
        /// The job refused.
        job: String,
        /// How long the job needs claims remembered.
        needed: Duration,
        /// What `needed` is made of.
        reason: &'static str,
        /// How long the store remembers claims.
        window: Duration,
    },

    /// A job that requires global coordination was added to a scheduler
    /// without a run store.
    #[error(
        "job {0:?} requires global coordination (RequireGlobal) but no run store is configured"
    )]
    NoStore(String),

    /// A job with this name is already registered.
    #[error("job {0:?} is already registered")]
    DuplicateJob(String),

    /// No job with this name is registered.
    #[error("no job named {0:?}")]
    UnknownJob(String),

    /// The scheduler was shut down.
    #[error("the scheduler is shut down")]
    ShutDown,
}

impl From<coord_adapters::runs::RunError> for Error {
    fn from(error: coord_adapters::runs::RunError) -> Self {
        use coord_adapters::runs::RunError;
        match error {
            RunError::Store(e) => Error::Store(e),
            RunError::NotOwner { job, slot } => Error::NotOwner { job, slot },
            RunError::InvalidJobName(name) => Error::InvalidJobName(name),
            RunError::InvalidArgument(what) => Error::InvalidArgument(what),
            // `RunError` is non_exhaustive: a newer variant is still a store failure.
            other => Error::Store(coord_backend::Error::Unavailable {
                message: other.to_string(),
                source: Some(Box::new(other)),
            }),
        }
    }
}

impl Error {
    /// Whether this is [`Error::NotOwner`].
    pub fn is_not_owner(&self) -> bool {
        matches!(self, Error::NotOwner { .. })
    }
}
