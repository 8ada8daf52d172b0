//! The one connection a backend writes through, and its change
//! notifications: **exact keys for this backend's own commits, a
//! "something changed" for everyone else's**.
//!
//! Every txn of a backend (and of its clones) runs on one dedicated writer
//! connection, one at a time: SQLite lets one writer commit at a time
//! anyway, and an in-process queue is fairer than SQLite's busy handler.
//! That connection buys exact notifications:
//!
//! - **Own commits**: after an applied txn the backend publishes the keys it
//!   wrote to its [`ChangeFeed`]; watches whose prefix they concern wake, no
//!   other. No read is needed.
//! - **Everyone else's** (other processes, other backends on the same file):
//!   while watches are alive, a background task asks `PRAGMA data_version`
//!   on the writer connection every [`POLL_INTERVAL`]. SQLite changes that
//!   number when *another* connection committed to the file since the
//!   previous ask, never for the connection's own commits, so a change is
//!   surely foreign: every watch wakes ([`Changed::Anything`]; the pragma
//!   does not say which keys). The pragma reads a counter in the WAL index
//!   (shared memory): no table is read.
//!
//! When the writer connection is replaced (after a failed txn left it in an
//! unknown state), or the pragma fails, every watch wakes once: what
//! happened meanwhile is unknown. The task ends once no watch is left.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{ChangeFeed, ChangeWatch, Changed, Error, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, Row};
use tokio::sync::{Mutex, MutexGuard};

/// How often the poller asks `PRAGMA data_version` while watches are alive.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// The writer connection of one backend (shared by its clones), its feed of
/// notifications, and whether the poller runs.
#[derive(Debug)]
pub(crate) struct Writer {
    path: PathBuf,
    connect: SqliteConnectOptions,
    acquire_timeout: Duration,
    slot: Mutex<Slot>,
    feed: ChangeFeed,
    polling: Mutex<bool>,
}

/// The writer connection, if open.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    conn: Option<SqliteConnection>,
    /// Bumped each time a connection is opened: the poller's baseline is
    /// per connection.
    generation: u64,
    /// Set while a txn runs, cleared when it ended cleanly: a txn cancelled
    /// or failed half way leaves it set, and the connection is replaced.
    dirty: bool,
    closed: bool,
}

/// The writer connection, held: one txn (or one poll) at a time.
pub(crate) struct Held<'a> {
    slot: MutexGuard<'a, Slot>,
}

impl Held<'_> {
    /// The connection; the caller must [`Held::finished`] when it ended cleanly.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        self.slot.dirty = true;
        self.slot
            .conn
            .as_mut()
            .expect("a held writer has a connection")
    }

    /// The last use of [`Held::conn`] left no transaction open.
    pub(crate) fn finished(&mut self) {
        self.slot.dirty = false;
    }
}

impl Writer {
    pub(crate) fn new(
        path: PathBuf,
        connect: SqliteConnectOptions,
        acquire_timeout: Duration,
    ) -> Self {
        Writer {
            path,
            connect,
            acquire_timeout,
            slot: Mutex::default(),
            feed: ChangeFeed::new(),
            polling: Mutex::new(false),
        }
    }

    /// Take the writer connection, opening it (again) if needed.
    pub(crate) async fn hold(&self) -> std::result::Result<Held<'_>, sqlx::Error> {
        let slot = tokio::time::timeout(self.acquire_timeout, self.slot.lock())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?;
        let mut held = Held { slot };
        if held.slot.closed {
            return Err(sqlx::Error::PoolClosed);
        }
        if held.slot.dirty {
            if let Some(conn) = held.slot.conn.take() {
                // Its transaction state is unknown: never reuse it.
                let _ = conn.close_hard().await;
            }
            held.slot.dirty = false;
        }
        if held.slot.conn.is_none() {
            held.slot.conn = Some(SqliteConnection::connect_with(&self.connect).await?);
            held.slot.generation += 1;
        }
        Ok(held)
    }

    /// Close the connection; later txns fail.
    pub(crate) async fn close(&self) {
        let mut slot = self.slot.lock().await;
        slot.closed = true;
        if let Some(conn) = slot.conn.take() {
            let _ = conn.close().await;
        }
        // Watches hear of it: they re-read, and meet the closed store.
        self.feed.publish(Changed::Anything);
    }

    /// This backend committed writes to `keys`.
    pub(crate) fn committed(&self, keys: Arc<[String]>) {
        self.feed.publish(Changed::Keys(keys));
    }

    /// A watch of `prefix`, starting the poller (which reads its baseline
    /// before this returns) when it is not running.
    pub(crate) async fn watch(self: &Arc<Self>, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        let mut polling = self.polling.lock().await;
        let watch = self.feed.watch(prefix);
        if !*polling {
            let baseline = self.baseline().await.map_err(|e| {
                Error::unavailable(
                    format!("sqlite: watching {} for changes", self.path.display()),
                    e,
                )
            })?;
            *polling = true;
            tokio::spawn(poll(self.clone(), baseline));
        }
        Ok(watch)
    }

    /// The writer connection's generation and `data_version` now.
    async fn baseline(&self) -> std::result::Result<(u64, i64), sqlx::Error> {
        let mut held = self.hold().await?;
        let version = data_version(held.conn()).await?;
        held.finished();
        Ok((held.slot.generation, version))
    }
}

async fn data_version(conn: &mut SqliteConnection) -> std::result::Result<i64, sqlx::Error> {
    sqlx::query("PRAGMA data_version")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)
}

async fn poll(writer: Arc<Writer>, mut seen: (u64, i64)) {
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        if writer.feed.watchers() == 0 {
            // Watches subscribe under this lock: none can appear while we decide.
            let mut polling = writer.polling.lock().await;
            if writer.feed.watchers() == 0 {
                *polling = false;
                return;
            }
        }
        match writer.baseline().await {
            Ok(now) if now != seen => {
                seen = now;
                writer.feed.publish(Changed::Anything);
            }
            Ok(_) => {}
            // Another connection holds an exclusive lock for a moment: ask again next tick.
            Err(error) if crate::is_busy(&error) => {}
            Err(error) => {
                // Unknown what changed meanwhile: wake everyone, and keep
                // asking (the next hold opens a fresh connection).
                tracing::debug!(%error, "sqlite change poller: data_version failed");
                writer.feed.publish(Changed::Anything);
                if matches!(error, sqlx::Error::PoolClosed) {
                    *writer.polling.lock().await = false;
                    return;
                }
            }
        }
    }
}
