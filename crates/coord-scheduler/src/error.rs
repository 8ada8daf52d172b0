use std::time::Duration;

use coord_adapters::runs::RunError;

/// Errors of the scheduler runtime.
///
/// Variants name what the caller does next: retry later or page someone,
/// or stop acting as the owner of a run (both [`Error::Runs`], a call of
/// the run store that failed: [`RunError`] says which), or fix the job or
/// the call (everything else). A caller's mistake is said one way whoever
/// caught it: the run store's [`RunError::InvalidJobName`] and
/// [`RunError::InvalidArgument`] arrive as [`Error::InvalidJobName`] and
/// [`Error::InvalidArgument`]. Losing a claim is **not** an error: it is a
/// [`crate::Claim`] with `won = false`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A run-store call failed at the store, or for a run this instance
    /// does not own (any more).
    #[error(transparent)]
    Runs(RunError),

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

impl From<RunError> for Error {
    fn from(error: RunError) -> Self {
        match error {
            RunError::InvalidJobName(name) => Error::InvalidJobName(name),
            RunError::InvalidArgument(reason) => Error::InvalidArgument(reason),
            other => Error::Runs(other),
        }
    }
}

impl From<coord_backend::Error> for Error {
    fn from(error: coord_backend::Error) -> Self {
        Error::Runs(RunError::Store(error))
    }
}

impl Error {
    /// Whether this is [`RunError::NotOwner`]: stop acting as the owner of the run.
    pub fn is_not_owner(&self) -> bool {
        matches!(self, Error::Runs(error) if error.is_not_owner())
    }

    /// The store's error, when the run store failed at the store.
    pub fn store_error(self) -> Result<coord_backend::Error, Error> {
        match self {
            Error::Runs(RunError::Store(error)) => Ok(error),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_mistake_is_said_one_way_whoever_caught_it() {
        let from_store = |e: RunError| -> Error { e.into() };
        assert!(matches!(
            from_store(RunError::InvalidArgument("zero lease".into())),
            Error::InvalidArgument(_)
        ));
        assert!(matches!(
            from_store(RunError::InvalidJobName("a/b".into())),
            Error::InvalidJobName(_)
        ));
        let not_owner = from_store(RunError::NotOwner {
            job: "j".into(),
            slot: 1,
        });
        assert!(not_owner.is_not_owner(), "{not_owner:?}");
    }
}
