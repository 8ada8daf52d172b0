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

impl SqliteOptions {
    /// With another [`max_connections`](Self::max_connections) (at least 1).
    pub fn with_max_connections(mut self, max: u32) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// With another [`busy_timeout`](Self::busy_timeout).
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// With another [`busy_retries`](Self::busy_retries).
    pub fn with_busy_retries(mut self, retries: u32) -> Self {
        self.busy_retries = retries;
        self
    }

    /// With another [`acquire_timeout`](Self::acquire_timeout).
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// With another [`durability`](Self::durability).
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// With another [`limits`](Self::limits).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
}
