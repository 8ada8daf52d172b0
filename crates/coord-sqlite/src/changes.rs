//! Change notifications for SQLite: **local polling of one cheap query**.
//!
//! SQLite has no notification mechanism that reaches other processes, so a
//! backend with live watches runs one background task that holds a dedicated
//! connection (outside the pool) and asks `PRAGMA data_version` every
//! [`POLL_INTERVAL`]. SQLite changes that number whenever *another*
//! connection committed to the file since the previous ask, whichever
//! process it belongs to, so this covers every writer on the same file on
//! this host; the poller itself never writes. The pragma reads a counter in
//! the WAL index (shared memory): no table is read.
//!
//! What it reports is "the file changed", not which keys: every watch of the
//! backend wakes, whatever its prefix (also for other namespaces of the
//! file), and re-reads. Nothing is lost while the poller runs; if the
//! pragma fails for any reason but a busy file, the poller stops and its
//! watches fail (`Unavailable`), so their waiters fall back to polling. The
//! task and its connection end once the backend has no watch left.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{ChangeWatch, Error, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, Row};
use tokio::sync::{watch, Mutex};

/// How often the poller asks `PRAGMA data_version` while watches are alive.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// The poller of one backend (shared by its clones): a generation counter
/// bumped on every change seen, present while the poller runs.
#[derive(Debug, Default)]
pub(crate) struct Poller {
    running: Mutex<Option<Arc<watch::Sender<u64>>>>,
}

impl Poller {
    /// A watch of the file, starting the poller (and reading the current
    /// `data_version` before returning) when it is not running.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        path: &Path,
        connect: SqliteConnectOptions,
    ) -> Result<Box<dyn ChangeWatch>> {
        let mut running = self.running.lock().await;
        if let Some(sender) = running.as_ref() {
            return Ok(Box::new(SqliteWatch(sender.subscribe())));
        }
        let unavailable = |e: sqlx::Error| {
            Error::unavailable(
                format!("sqlite: watching {} for changes", path.display()),
                e,
            )
        };
        let mut conn = SqliteConnection::connect_with(&connect)
            .await
            .map_err(unavailable)?;
        let baseline = data_version(&mut conn).await.map_err(unavailable)?;
        let sender = Arc::new(watch::Sender::new(0u64));
        let receiver = sender.subscribe();
        *running = Some(sender.clone());
        tokio::spawn(poll(self.clone(), conn, baseline, sender));
        Ok(Box::new(SqliteWatch(receiver)))
    }

    /// Forget `sender` (the poller is stopping) unless a newer one replaced it.
    fn stop(
        &self,
        running: &mut Option<Arc<watch::Sender<u64>>>,
        sender: &Arc<watch::Sender<u64>>,
    ) {
        if running.as_ref().is_some_and(|r| Arc::ptr_eq(r, sender)) {
            *running = None;
        }
    }
}

async fn data_version(conn: &mut SqliteConnection) -> std::result::Result<i64, sqlx::Error> {
    sqlx::query("PRAGMA data_version")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)
}

async fn poll(
    poller: Arc<Poller>,
    mut conn: SqliteConnection,
    mut seen: i64,
    sender: Arc<watch::Sender<u64>>,
) {
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        if sender.receiver_count() == 0 {
            // Watches subscribe under this lock: none can appear while we decide.
            let mut running = poller.running.lock().await;
            if sender.receiver_count() == 0 {
                poller.stop(&mut running, &sender);
                break;
            }
        }
        match data_version(&mut conn).await {
            Ok(version) if version != seen => {
                seen = version;
                sender.send_modify(|generation| *generation = generation.wrapping_add(1));
            }
            Ok(_) => {}
            // Another connection holds an exclusive lock for a moment: ask again next tick.
            Err(error) if crate::is_busy(&error) => {}
            Err(error) => {
                tracing::debug!(%error, "sqlite change poller stopped: watches fall back to polling");
                let mut running = poller.running.lock().await;
                poller.stop(&mut running, &sender);
                break;
            }
        }
    }
    // The watches' `changed()` fail once the last sender is gone.
    drop(sender);
    let _ = conn.close().await;
}

/// One watch: wakes on every change of the file.
#[derive(Debug)]
struct SqliteWatch(watch::Receiver<u64>);

#[async_trait]
impl ChangeWatch for SqliteWatch {
    async fn changed(&mut self) -> Result<()> {
        self.0.changed().await.map_err(|_| Error::Unavailable {
            message: "sqlite: the change poller stopped".to_owned(),
            source: None,
        })
    }
}
