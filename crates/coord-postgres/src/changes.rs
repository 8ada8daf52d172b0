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
//!   wakes every watch (something may have been missed) and counts the lease
//!   as lapsed (a restarted server has emptied `coord_watch`), so it is
//!   registered again within [`IDLE_CHECK`]. If reconnecting
//!   fails, the watches fail and their waiters fall back to polling. An r2
//!   `coord_txn` installed by an older client sends nothing.
//! - **Only while watched** (schema r7, r8). A listener holds a lease on its
//!   namespace in the unlogged table `coord_watch` ([`LEASE`], renewed every
//!   [`RENEW_EVERY`]), and writers call `pg_notify` only while a lease is
//!   live. A writer's check is a statement that reads `coord_watch`: it
//!   takes `ACCESS SHARE` on the table before its snapshot and holds it
//!   until commit. A new listener commits its lease, lists the transactions
//!   holding that lock (`pg_locks`, fast-path locks included), and waits
//!   until each has ended before its first watch returns. A writer whose
//!   check did not see the lease took the lock before the lease was
//!   committed, so it is on that list: it has committed by then (the watch
//!   owes it nothing), and every later one sees the lease: a change
//!   committed after `watch` returned is notified. The listener blocks
//!   nobody while it waits (no lock is requested), so writers never queue
//!   behind a registration. A lease that lapsed (renewals failed or came
//!   late) loses notifications like a reconnect does: once renewed, every
//!   watch is woken; a renewal that fails after the lease ran out ends the
//!   listener, and its watches fail (their waiters poll). Leases are judged
//!   by the server's clock alone; a server clock stepped forward past a
//!   lease loses notifications until the next renewal (latency, never
//!   correctness).
//! - **Cost.** For an unwatched namespace, one primary-key lookup in
//!   `coord_watch` per writing txn, inlined in the single-key statements
//!   (no PL/pgSQL call). While watched, one `pg_notify` per
//!   writing txn (unless the client set
//!   `PostgresOptions::with_notify_changes(false)`): PostgreSQL serialises
//!   the commits of notifying transactions on one global lock (the
//!   notification queue), which bounds the commit rate of writing txns
//!   across the whole cluster.

use std::sync::Arc;
use std::time::Duration;

use coord_backend::{ChangeFeed, ChangeWatch, Changed, Error, Result};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// How often the listener checks whether it still has watches (and whether
/// its lease is due for renewal).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long a listener's lease on its namespace lasts (server clock).
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// How often a listener renews its lease.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(5);

/// How long before the server's end of a lease this client stops counting
/// on it (counted on the monotonic clock from when the renewal was sent).
const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// The listener of one backend (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Listener {
    running: Mutex<Option<Running>>,
}

/// A live listener: its feed, and until when its lease surely holds.
#[derive(Debug)]
struct Running {
    feed: ChangeFeed,
    lease_holds_until: Arc<std::sync::Mutex<Instant>>,
}

/// Registers (or renews) this client's lease on `namespace`'s notifications;
/// the monotonic instant until which it surely holds.
async fn renew_lease(store: &PgPool, namespace: &str) -> Result<Instant> {
    let sent = Instant::now();
    sqlx::query(
        "INSERT INTO coord_watch AS w (ns, until) \
         VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond') \
         ON CONFLICT (ns) DO UPDATE SET until = greatest(w.until, EXCLUDED.until)",
    )
    .bind(namespace)
    .bind(i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX))
    .execute(store)
    .await
    .map_err(|e| Error::unavailable("PostgreSQL: registering a change listener".to_owned(), e))?;
    Ok(sent + LEASE - LEASE_MARGIN)
}

/// How long a new listener waits for the writers that may have missed its
/// lease before its watch fails (and its waiters poll). A coord write is one
/// statement: only a stuck one, or a session left open in a transaction that
/// read `coord_watch`, is still on the list that long.
const WRITERS_WAIT: Duration = Duration::from_secs(5);

/// Waits until every transaction that held `ACCESS SHARE` on `coord_watch`
/// when this client's lease was already committed has ended (see the module
/// docs): each writer that checked for a lease without seeing it holds that
/// lock from before its check until it commits. Nobody waits on this
/// listener, so no writer is held up while it waits.
async fn wait_out_unwatched_writers(store: &PgPool) -> Result<()> {
    let unavailable =
        |e: sqlx::Error| Error::unavailable("PostgreSQL: starting a change listener".to_owned(), e);
    // `pg_locks` lists fast-path locks too; a lock granted before the query
    // began is in it unless released.
    let holders: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT virtualtransaction FROM pg_locks \
          WHERE locktype = 'relation' AND relation = to_regclass('coord_watch') \
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
            AND mode = 'AccessShareLock' AND granted AND pid <> pg_backend_pid()",
    )
    .fetch_all(store)
    .await
    .map_err(unavailable)?;
    if holders.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + WRITERS_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        // A virtual transaction id is never reused: once it holds no lock on
        // `coord_watch`, that transaction has ended.
        let left: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks \
              WHERE locktype = 'relation' AND relation = to_regclass('coord_watch') \
                AND virtualtransaction = ANY($1))",
        )
        .bind(&holders)
        .fetch_one(store)
        .await
        .map_err(unavailable)?;
        if !left {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Unavailable {
                message: format!(
                    "PostgreSQL: starting a change listener: a writer stayed in flight for {WRITERS_WAIT:?}"
                ),
                source: None,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
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
        if let Some(live) = running.as_ref() {
            let holds = *live.lease_holds_until.lock().expect("lease poisoned");
            if Instant::now() < holds {
                return Ok(live.feed.watch(prefix));
            }
            // The lease may have lapsed: writers may have skipped their
            // notifications meanwhile. Register again, as a new listener does.
            let until = renew_lease(store, namespace).await?;
            wait_out_unwatched_writers(store).await?;
            *live.lease_holds_until.lock().expect("lease poisoned") = until;
            live.feed.publish(Changed::Anything);
            return Ok(live.feed.watch(prefix));
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
        // Listening first: a writer that sees the lease notifies a channel
        // this connection already receives.
        let until = renew_lease(store, namespace).await?;
        wait_out_unwatched_writers(store).await?;
        let feed = ChangeFeed::new();
        let watch = feed.watch(prefix);
        let lease_holds_until = Arc::new(std::sync::Mutex::new(until));
        tokio::spawn(listen(
            self.clone(),
            listener,
            feed.clone(),
            lease_holds_until.clone(),
        ));
        tokio::spawn(close_when_idle(
            self.clone(),
            pool,
            feed.clone(),
            Lease {
                store: store.clone(),
                namespace: namespace.to_owned(),
                holds_until: lease_holds_until.clone(),
            },
        ));
        *running = Some(Running {
            feed,
            lease_holds_until,
        });
        Ok(watch)
    }

    /// Forget `feed` unless a newer one replaced it.
    fn forget(running: &mut Option<Running>, feed: &ChangeFeed) {
        if running.as_ref().is_some_and(|r| r.feed.same(feed)) {
            *running = None;
        }
    }
}

/// What the renewals of a listener's lease need.
struct Lease {
    store: PgPool,
    namespace: String,
    holds_until: Arc<std::sync::Mutex<Instant>>,
}

impl Lease {
    /// Renew when due. `false`: the renewal failed after the lease ran out,
    /// and the listener must end.
    async fn keep(&self, feed: &ChangeFeed, renewed: &mut Instant) -> bool {
        let lapsed = Instant::now() >= *self.holds_until.lock().expect("lease poisoned");
        if renewed.elapsed() < RENEW_EVERY && !lapsed {
            return true;
        }
        match renew_lease(&self.store, &self.namespace).await {
            Ok(until) => {
                *renewed = Instant::now();
                if lapsed {
                    // Writers may have skipped notifications meanwhile: wait
                    // them out, then wake everyone (as after a reconnect).
                    if wait_out_unwatched_writers(&self.store).await.is_err() {
                        return false;
                    }
                    feed.publish(Changed::Anything);
                }
                *self.holds_until.lock().expect("lease poisoned") = until;
                true
            }
            Err(error) => {
                tracing::debug!(%error, "PostgreSQL change listener could not renew its lease");
                !lapsed
            }
        }
    }
}

async fn listen(
    this: Arc<Listener>,
    mut listener: PgListener,
    feed: ChangeFeed,
    lease_holds_until: Arc<std::sync::Mutex<Instant>>,
) {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                feed.publish(Changed::from_payload(notification.payload(), '\n'))
            }
            // The connection was lost and made again: what was sent meanwhile is gone.
            // The server may have restarted, and crash recovery empties
            // `coord_watch`: count the lease as lapsed, so that it is
            // registered again (and the writers that missed it waited out)
            // before the next wake-up and before any new watch returns.
            Ok(None) => {
                *lease_holds_until.lock().expect("lease poisoned") = Instant::now();
                feed.publish(Changed::Anything);
            }
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

/// Renew the listener's lease while it has watches; close its pool (which
/// ends [`listen`]) once no watch is left, or when the lease is lost for good.
async fn close_when_idle(this: Arc<Listener>, pool: PgPool, feed: ChangeFeed, lease: Lease) {
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(IDLE_CHECK).await;
        if pool.is_closed() {
            return;
        }
        if !lease.keep(&feed, &mut renewed).await {
            Listener::forget(&mut *this.running.lock().await, &feed);
            pool.close().await;
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
