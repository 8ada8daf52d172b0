//! The errors of a [`SlotStore`](super::SlotStore).

/// What a run-store call can fail with. Losing a claim is **not** an error:
/// it is a [`Claim`](super::Claim) with `won = false`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
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

    /// An argument was out of range (zero lease, zero history size, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl RunError {
    /// Whether this is [`RunError::NotOwner`].
    pub fn is_not_owner(&self) -> bool {
        matches!(self, RunError::NotOwner { .. })
    }

    pub(super) fn not_owner(job: &str, slot: u64) -> RunError {
        RunError::NotOwner {
            job: job.to_owned(),
            slot,
        }
    }
}
