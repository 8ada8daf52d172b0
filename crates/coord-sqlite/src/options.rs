//! Tuning knobs of [`SqliteBackend`](crate::SqliteBackend).

use std::time::Duration;

use coord_backend::Limits;

/// How hard SQLite works to keep a commit across a power loss (`PRAGMA synchronous`).
///
/// Both levels keep every commit across a crash of the *application*; they
/// differ only when the machine loses power or the OS crashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// `synchronous = FULL` (the default): the WAL is fsynced at every
    /// commit, so an acknowledged txn survives a power loss. Needed when the
    /// store hands out fencing tokens: losing the last commits would let the
    /// same token be granted twice.
    #[default]
    Full,
    /// `synchronous = NORMAL`: the WAL is fsynced only at checkpoints. Faster,
    /// but the last acknowledged txns may roll back after a power loss or OS
    /// crash. Only for data that may be rebuilt.
    Normal,
}

/// Options of [`SqliteBackend::open_with`](crate::SqliteBackend::open_with).
///
/// ```
/// use std::time::Duration;
/// use coord_sqlite::SqliteOptions;
///
/// let options = SqliteOptions::default()
///     .with_max_connections(8)
///     .with_busy_timeout(Duration::from_secs(10));
/// assert_eq!(options.max_connections, 8);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// Connections of this backend's pool (each is one SQLite connection with
    /// its own worker thread). Writes are serialized by the file anyway; more
    /// connections only let snapshots run beside a writer. Default 4.
    pub max_connections: u32,
    /// How long one statement waits for another connection's lock before
    /// SQLite reports it busy (`sqlite3_busy_timeout`). Default 5 s.
    pub busy_timeout: Duration,
    /// How many times a call that still found the file busy is retried as a
    /// whole (with jittered backoff) before it fails with
    /// [`Error::Unavailable`](coord_backend::Error::Unavailable). Default 8.
    pub busy_retries: u32,
    /// How long a call waits for a free pooled connection. Default 30 s.
    pub acquire_timeout: Duration,
    /// `PRAGMA synchronous`. Default [`Durability::Full`].
    pub durability: Durability,
    /// What this store accepts. Default [`Limits::DEFAULT`].
    pub limits: Limits,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            max_connections: 4,
            busy_timeout: Duration::from_secs(5),
            busy_retries: 8,
            acquire_timeout: Duration::from_secs(30),
            durability: Durability::Full,
            limits: Limits::DEFAULT,
        }
    }
}

coord_backend::setters! {
    SqliteOptions {
        /// With another [`max_connections`](Self::max_connections) (at least 1).
        with_max_connections(max: u32) => max_connections = max.max(1);
        /// With another [`busy_timeout`](Self::busy_timeout).
        with_busy_timeout(timeout: Duration) => busy_timeout = timeout;
        /// With another [`busy_retries`](Self::busy_retries).
        with_busy_retries(retries: u32) => busy_retries = retries;
        /// With another [`acquire_timeout`](Self::acquire_timeout).
        with_acquire_timeout(timeout: Duration) => acquire_timeout = timeout;
        /// With another [`durability`](Self::durability).
        with_durability(durability: Durability) => durability = durability;
        /// With another [`limits`](Self::limits).
        with_limits(limits: Limits) => limits = limits;
    }
}
