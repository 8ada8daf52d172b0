//! Change notifications: `pg_notify` from inside `coord_txn`, and one
//! `LISTEN` connection per backend fanning out to its watches.
//!
//! - **Sending.** `coord_txn` and the single-key statements (schema r4, `coord_notify` in `schema.rs`) end an applied
//!   txn that wrote something with `pg_notify('coord_' || md5(ns), keys)`:
//!   one channel per namespace, the written keys one per line as payload
//!   (empty, meaning "anything", when a key holds a newline or the list
//!   would pass NOTIFY's 8000-byte limit). PostgreSQL delivers a
//!   notification only when its transaction commits, so a rejected or rolled
//!   back txn wakes nobody.
//! - **Listening.** The first watch of a backend opens one connection of its
//!   own (a pool of one, outside the store's pool, with the same connect
//!   options), `LISTEN`s on the namespace's channel and returns once the
//!   server confirmed it; later watches share it. It is closed once no watch
//!   is left (checked every [`IDLE_CHECK`]).
//! - **What can be lost.** Notifications sent while the listening connection
//!   is down. sqlx reconnects and listens again by itself; the reconnect
//!   wakes every watch (something may have been missed). If reconnecting
//!   fails, the watches fail and their waiters fall back to polling. An r2
//!   `coord_txn` installed by an older client sends nothing.
//! - **Cost.** One `pg_notify` per writing txn (unless the client set
//!   `PostgresOptions::with_notify_changes(false)`). PostgreSQL serialises the
//!   commits of notifying transactions on one global lock (the notification
//!   queue), which bounds the commit rate of writing txns across the whole
//!   cluster.

use std::sync::Arc;
use std::time::Duration;

use coord_backend::{ChangeFeed, ChangeWatch, Changed, Error, Result};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::Mutex;

/// How often the listener checks whether it still has watches.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// The listener of one backend (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Listener {
    running: Mutex<Option<ChangeFeed>>,
}

impl Listener {
    /// A watch on `prefix`; starts listening first when no watch of this backend is live.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        store: &PgPool,
        namespace: &str,
        prefix: &str,
    ) -> Result<Box<dyn ChangeWatch>> {
        let mut running = self.running.lock().await;
        if let Some(feed) = running.as_ref() {
            return Ok(feed.watch(prefix));
        }
        let unavailable =
            |e: sqlx::Error| Error::unavailable("PostgreSQL: listening for changes".to_owned(), e);
        // A pool of its own: the listener pins its connection, which must not
        // starve the store's pool.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(store.options().get_acquire_timeout())
            .connect_lazy_with((*store.connect_options()).clone());
        let mut listener = PgListener::connect_with(&pool).await.map_err(unavailable)?;
        let channel: String = sqlx::query_scalar("SELECT 'coord_' || md5($1)")
            .bind(namespace)
            .fetch_one(&mut listener)
            .await
            .map_err(unavailable)?;
        listener.listen(&channel).await.map_err(unavailable)?;
        let feed = ChangeFeed::new();
        let watch = feed.watch(prefix);
        tokio::spawn(listen(self.clone(), listener, feed.clone()));
        tokio::spawn(close_when_idle(self.clone(), pool, feed.clone()));
        *running = Some(feed);
        Ok(watch)
    }

    /// Forget `feed` unless a newer one replaced it.
    fn forget(running: &mut Option<ChangeFeed>, feed: &ChangeFeed) {
        if running.as_ref().is_some_and(|r| r.same(feed)) {
            *running = None;
        }
    }
}

async fn listen(this: Arc<Listener>, mut listener: PgListener, feed: ChangeFeed) {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                feed.publish(Changed::from_payload(notification.payload(), '\n'))
            }
            // The connection was lost and made again: what was sent meanwhile is gone.
            Ok(None) => feed.publish(Changed::Anything),
            // Closed when idle, or reconnecting failed: the watches fail (their waiters poll).
            Err(error) => {
                if !matches!(error, sqlx::Error::PoolClosed) {
                    tracing::debug!(%error, "PostgreSQL change listener stopped: watches fall back to polling");
                }
                break;
            }
        }
    }
    Listener::forget(&mut *this.running.lock().await, &feed);
}

/// Close the listener's pool (which ends [`listen`]) once no watch is left.
async fn close_when_idle(this: Arc<Listener>, pool: PgPool, feed: ChangeFeed) {
    loop {
        tokio::time::sleep(IDLE_CHECK).await;
        if pool.is_closed() {
            return;
        }
        if feed.watchers() == 0 {
            // Watches subscribe under this lock: none can appear while we decide.
            let mut running = this.running.lock().await;
            if feed.watchers() == 0 {
                Listener::forget(&mut running, &feed);
                drop(running);
                pool.close().await;
                return;
            }
        }
    }
}
