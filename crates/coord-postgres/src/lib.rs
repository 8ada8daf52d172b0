//! coord's PostgreSQL store: the three primitives over one table, via sqlx.
//!
//! # Shape
//!
//! Every namespace lives in one table, isolated by its `ns` column
//! (see [`SCHEMA_SQL`]):
//!
//! ```text
//! coord_kv(ns text, key text COLLATE "C", version bigint, value bytea /* NULL = tombstone */,
//!          PRIMARY KEY (ns, key))
//! ```
//!
//! | primitive | statement | round trips |
//! | --- | --- | --- |
//! | snapshot | `SELECT key, version, value … WHERE ns = $1 AND key = ANY($2)` | 1 |
//! | txn | `SELECT … FROM coord_txn(ns, assert_keys, assert_versions, put_keys, put_values, delete_keys)` | 1 |
//! | txn of one assert + one write of the same key | one `UPDATE` / `INSERT … ON CONFLICT` statement under the same advisory lock (the single-key fast path, below); when its condition fails, `coord_txn` as above | 1 applied, 2 rejected |
//! | keys | `SELECT key … WHERE ns = $1 AND key >= $2 AND key < successor($2) AND value IS NOT NULL ORDER BY key`, through the partial index `coord_kv_live` (tombstones cost a listing nothing) | 1 |
//! | reclaim | `SELECT … FROM coord_reclaim(ns, n)`: up to 256 tombstones (found through `coord_kv_dead`) deleted under the txns' advisory locks, `coord_floor` raised in the same transaction | 1 per 256 |
//!
//! A key written where no row exists starts at `coord_next_version(ns)`, the
//! namespace's floor + 1 (0 + 1 until a reclaim), so a reclaimed key never
//! gets a version it had (see `coord_backend::reclaim`).
//!
//! A round trip here is one flush of Bind/Execute/Sync on a statement the
//! connection prepared earlier, answered by the server. sqlx also sends a bare
//! `Sync` when a connection goes back to its pool, to check it is still
//! usable; that costs the server a little work but not the caller's latency.
//! Pass [`PostgresOptions::ping_idle_after`] to also check connections that
//! sat idle before they are used.
//!
//! The schema is created by [`PostgresBackend::connect`] when missing, in a
//! transaction holding an advisory lock, so many processes may start at once.
//!
//! # Atomicity boundary
//!
//! **One statement = one transaction.** Each primitive is a single autocommit
//! statement, so PostgreSQL makes it atomic and durable (with the server's
//! `synchronous_commit`), across every process and host that talks to the
//! same database. A snapshot and a key listing read one MVCC snapshot: they
//! see a txn entirely or not at all.
//!
//! A txn is one call of the plpgsql function `coord_txn`, which
//!
//! 1. takes an advisory lock on every involved key (existing or not), in the
//!    order of their sorted 64-bit hashes, so racing txns never deadlock and a
//!    key that does not exist yet is locked as well as one that does: exclusive
//!    (`pg_advisory_xact_lock`) on a key it puts or deletes, shared
//!    (`pg_advisory_xact_lock_shared`, schema r11) on a key it only asserts, so
//!    txns that assert one key without writing it do not wait for each other;
//! 2. checks every assert (a missing key or a tombstone is version 0), and on a
//!    mismatch returns the current entries of the asserted keys and writes nothing;
//! 3. upserts each put with `version + 1`, and turns each delete into a
//!    tombstone row (`value = NULL`) with `version + 1`, so a version is never
//!    handed out twice for one key, also after delete and re-create; a row it
//!    creates starts at the namespace's floor + 1;
//! 4. answers, when applied, a row per key put with the version it stored
//!    (schema r10; reported as [`TxnOutcome::written`]).
//!
//! The function runs at READ COMMITTED. That is enough here because every
//! writer of a key holds that key's advisory lock exclusive until it commits
//! (so it waits for every txn holding the lock shared, and they for it), a
//! lock is released only after its holder's commit is visible, and each statement of
//! the function takes a new snapshot *after* the locks are held: the check
//! reads the latest committed version of every involved key, and nobody can
//! change one of them before this txn commits.
//!
//! It is also *required*: at REPEATABLE READ or SERIALIZABLE the snapshot is
//! taken when the calling statement starts, before the locks, so two txns
//! asserting `{A, B}` and writing `A` and `B` could both commit (write skew),
//! and SERIALIZABLE turns contention into serialization failures. So
//! - every session of the store's pool starts with the startup parameter
//!   `default_transaction_isolation = 'read committed'`, which outranks the
//!   server, database and role defaults and the URL's `options` (no extra
//!   round trip: it travels in the startup packet);
//! - `coord_txn` itself refuses to run at any other level (SQLSTATE `CO001`,
//!   reported as [`Error::Config`]), for callers that invoke it directly or
//!   through a pooler that drops startup parameters.
//!
//! # Why a server-side function
//!
//! `BEGIN; SELECT … FOR UPDATE; (check); INSERT … ON CONFLICT …; COMMIT` costs
//! four or more round trips and holds row locks while the client thinks; it
//! also cannot lock a key that has no row yet. The function does the same work
//! in one round trip (the prepared statement is parsed once per connection,
//! when the pool opens it), keeps lock hold times to server-side
//! microseconds, and answers a rejected txn with the current entries in the
//! same reply, so the CAS engine re-decides without another read.
//!
//! # The single-key fast path
//!
//! Most txns (every lock, board and side-effect decision on one record)
//! assert one key and write that same key. Those run as one prepared
//! statement instead of the function: `pg_advisory_xact_lock` on the key (the
//! lock `coord_txn` takes, so both kinds of writers exclude each other), then
//! `UPDATE … SET version = version + 1 … WHERE version = v AND value IS NOT
//! NULL` (assert live at `v`) or `INSERT … ON CONFLICT DO UPDATE … WHERE value
//! IS NULL` (assert missing), with the same version and tombstone rules. An
//! applied one answers one row, the version it stored (reported for a put).
//! One whose condition failed wrote nothing, and
//! the same txn then goes to `coord_txn`, which checks again under the lock
//! and answers the current entry. Why the condition is exact at READ
//! COMMITTED: see the comments of the `fast` module.
//!
//! # Errors
//!
//! - Cannot open or borrow a connection (refused, TLS failure, pool timeout):
//!   [`Error::Unavailable`]; nothing was sent.
//! - The server answers the txn statement with an error before it completed
//!   (statement timeout, …): the transaction rolled back, [`Error::Unavailable`].
//! - A transaction-rollback error (SQLSTATE class 40: serialization failure,
//!   deadlock), also one raised at the implicit COMMIT: the server rolled the
//!   transaction back, so nothing applied and a retry is safe:
//!   [`Error::Unavailable`]. (The store's own sessions run at READ COMMITTED
//!   and take their locks in one order, so these come only from what others
//!   added to the database, e.g. triggers.)
//! - The connection breaks after the txn statement was sent (I/O error,
//!   closed socket, or an error while the implicit COMMIT runs, which the
//!   extended protocol performs at `Sync`, after CommandComplete):
//!   [`Error::Indeterminate`]. PostgreSQL commits an autocommit statement even
//!   when its reply is lost, so the write often *did* land. `pg_xact_status(txid)`
//!   could tell, but only if the client learned the txid before the reply was
//!   lost, which costs an extra round trip on every txn; this store does not
//!   use it. Callers resolve by re-reading (the adapters embed a fresh token in
//!   every put, see `coord-adapters`).
//! - A stored row with a value but a version below 1: [`Error::MalformedRecord`].
//!
//! Snapshots and key listings never write, so their failures are always
//! [`Error::Unavailable`].
//!
//! # In the caller's transaction
//!
//! [`InTransaction`] is a coord store bound to ONE open transaction of the
//! caller's own `sqlx::PgPool`: adapters built over it
//! (`BoardAdapter::new(in_tx.clone())`, `SideEffectAdapter`, `GenericLock`,
//! `BackendFencedSink`, …) write their records in that transaction, so they
//! commit or roll back with the caller's rows. [`InTransaction::begin`]
//! opens the transaction (`BEGIN ISOLATION LEVEL READ COMMITTED`, whatever
//! the database's default); [`InTransaction::from_transaction`] binds one
//! the caller began; [`InTransaction::conn`] lends its connection for the
//! caller's statements; [`InTransaction::commit`] / [`InTransaction::rollback`]
//! end it. The statements are the pooled store's (same table, `coord_txn`,
//! same fast path, same version, tombstone and floor rules); what differs:
//!
//! - **The schema must exist**: [`PostgresBackend::connect`] creates it, so
//!   connect one once per database (the process needs one anyway for
//!   maintenance). A missing table or function is [`Error::Config`] naming
//!   that fix. The pooled store also announces the process's storage format
//!   (`coord_backend::reclaim`, "Mixed versions"); nothing is announced
//!   inside the caller's transaction.
//! - **Isolation**: `coord_txn` is correct at READ COMMITTED only
//!   ("Atomicity boundary" above) and refuses any other level: a
//!   transaction the caller began at REPEATABLE READ or SERIALIZABLE fails
//!   every coord txn with [`Error::Config`] naming READ COMMITTED.
//! - **Answers**: a txn whose asserts hold is applied *within the
//!   transaction*: later calls through the same `InTransaction` see it,
//!   other clients do not until COMMIT. A failed assert is a plain rejection
//!   ([`TxnOutcome`] with `applied = false` and the current entries), as on
//!   the pooled store. A call never answers [`Error::Indeterminate`]: nothing
//!   commits before the caller's COMMIT, and a broken connection rolls the
//!   whole transaction back, so a call that broke is [`Error::Unavailable`]
//!   (the COMMIT then fails and decides). So are serialization failures and
//!   deadlocks (SQLSTATE class 40): retry the WHOLE transaction.
//! - **Any error aborts the transaction.** PostgreSQL refuses every
//!   statement after one that failed (SQLSTATE 25P02) and turns the COMMIT
//!   into a ROLLBACK; a coord call that failed (or was cancelled while its
//!   statement ran) also marks the `InTransaction`: later calls through it
//!   are refused and [`InTransaction::commit`] rolls back and answers
//!   [`Error::Unavailable`]. It also notices a failed statement of the
//!   caller's own, which sqlx would otherwise report as a successful
//!   commit: the COMMIT goes in one message behind a `SELECT 1`, which
//!   fails in an aborted transaction and keeps the COMMIT from running (so
//!   a commit costs one round trip, as sqlx's own does).
//! - **Commit**: [`Error::Unavailable`] when the server refused or rolled
//!   back (nothing applied), [`Error::Indeterminate`] when COMMIT was sent
//!   and its answer lost (it may have committed). After COMMIT or ROLLBACK
//!   every call, and `conn`, is refused with [`Error::InvalidInput`] and
//!   sends nothing. Dropping the last reference to an open one rolls back.
//! - **Locks until COMMIT.** `coord_txn` and the fast path take advisory
//!   *transaction* locks on every key they write (exclusive) or only assert
//!   (shared), and here the transaction is the caller's: a coord record
//!   written in a long transaction blocks every other writer of that record
//!   until the caller commits or rolls back. Two callers' transactions
//!   taking coord keys in different orders can deadlock; PostgreSQL detects
//!   it and aborts one (40P01, [`Error::Unavailable`]: retry it). So do two
//!   transactions deciding on the same coord record at once, usually: the
//!   adapters' CAS engine confirms a guess with an assert-only txn, whose
//!   shared lock is now held until COMMIT, and each then needs the lock
//!   exclusive to write. One of them is aborted and retried, never both
//!   granted.
//! - **No waiting for other clients.** Because the transaction holds those
//!   locks, waiting inside it for another client's commit (a lock wait, a
//!   `claim_next_wait`, …) could wait on a client that needs the locks it
//!   holds, until its timeout. So [`Backend::changes`] is a [`Changes`] whose
//!   `watch` always fails with [`Error::Unsupported`] ("waiting for other
//!   clients' commits inside a caller's transaction"), and the adapters
//!   refuse every call that would have to wait; a call that succeeds at once
//!   works. The writes notify the pooled stores' watchers when they commit.
//!   A coord write also holds `ACCESS SHARE` on `coord_watch` until COMMIT,
//!   and a pooled store's new change listener waits (up to 5 s) for every
//!   transaction holding it before its first watch returns: a caller's
//!   transaction left open longer makes that watch fail and its waiters
//!   poll (latency, never correctness).
//! - **Maintenance** ([`Backend::reclaim`]) is refused
//!   ([`Error::Unsupported`]): run it on the pooled [`PostgresBackend`].
//! - **Prepared statements**: the statements are prepared on the caller's
//!   connection at their first use there (sqlx caches them per connection).
//!   Behind a transaction pooler that works only when the pooler keeps
//!   prepared statements apart per client (PgBouncer 1.21+
//!   `max_prepared_statements`), as any sqlx client's prepared statements
//!   need; otherwise a call fails with [`Error::Config`] saying so. With
//!   [`TransactionOptions::behind_transaction_pooler`]
//!   ([`InTransaction::begin_with`]) every coord statement is one
//!   simple-protocol query with its parameters as literals instead, which
//!   any pooler passes (tested through PgBouncer 1.18 in transaction
//!   pooling); your own statements then need `.persistent(false)`.
//!
//! [`fenced`] writes the caller's own rows only under a fencing token at
//! least as high as the row has seen, in the same transaction.
//!
//! # Several hosts
//!
//! A URL may name a primary and its standbys in libpq's form,
//! `postgres://user@h1:5432,h2:5433/db?target_session_attrs=read-write`
//! (see [`servers`]): sessions go to the first host that accepts a
//! connection and is writable (with more than one host, `read-write` is
//! the default; `any` turns the check off). When no session can be opened
//! any more (the primary died), the next call walks the list again and the
//! pool moves to the host that is writable now; sessions opened before the
//! move are not handed out again. The call that noticed fails with
//! [`Error::Unavailable`] (nothing was sent), or, if its statement was cut,
//! with [`Error::Indeterminate`]: a failover never turns into a silent
//! success. What an asynchronous standby may lose at promotion is not
//! something a client can repair: use synchronous replication where fences
//! must never repeat.
//!
//! # Poolers
//!
//! Through PgBouncer, **session pooling** (`pool_mode = session`) works as a
//! direct connection does, with `ignore_startup_parameters = options` (coord
//! sends its isolation level and timeouts in the startup packet; `coord_txn`
//! checks the isolation level itself, so nothing is lost when a pooler drops
//! them). A pooler that refuses the startup parameters is an
//! [`Error::Config`] naming `ignore_startup_parameters`.
//!
//! **Transaction pooling** lends a server session per transaction: declare
//! it with `pooler=transaction` in the URL (see [`servers`]). The store then
//! keeps no session state: every snapshot, listing and txn is one
//! simple-protocol message holding one explicit transaction, `BEGIN
//! ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = …;
//! <statement>; COMMIT`, with its parameters written as escaped literals:
//! one round trip, no prepared statement (announce and reclaim use unnamed
//! statements inside their transactions). The commit point is the
//! `COMMIT`: an error before the statement completed rolled back
//! ([`Error::Unavailable`]); an error after it, or a lost connection, is
//! [`Error::Indeterminate`]; SQLSTATE class 40 is [`Error::Unavailable`].
//! Change notifications are off in this mode ([`Backend::changes`] is
//! `None`, logged once per process): `LISTEN` needs a session of its own,
//! so waiters poll. Statement pooling is not supported (it refuses
//! multi-statement transactions).
//!
//! Without the parameter, [`PostgresBackend::connect`] probes (two of its
//! connections share a server session, one extra connection at connect):
//! that finds a quiet pooler and misses a busy one. A client the probe
//! missed runs in session mode on shared sessions: calls whose prepared
//! statement another client's session holds (or lacks) fail with
//! [`Error::Config`] naming `pooler=transaction` (nothing ran), and
//! notifications to its `LISTEN` can be lost. Behind a transaction pooler,
//! always set `pooler=transaction`.
//!
//! # TLS
//!
//! `sslmode` in the URL is honoured as libpq defines it (`disable`, `prefer`
//! (the default), `require`, `verify-ca`, `verify-full`, plus `sslrootcert`).
//! TLS uses rustls with the `ring` provider and the operating system's trust
//! store (sqlx feature `tls-rustls-ring-native-roots`).
//!
//! # Example
//!
//! ```no_run
//! use coord_backend::{Assert, Backend, Mutation, StoreUrl};
//! use coord_postgres::PostgresBackend;
//!
//! # async fn demo() -> coord_backend::Result<()> {
//! let url = StoreUrl::parse("postgres://postgres@127.0.0.1:5432/postgres?namespace=demo")?;
//! let store = PostgresBackend::connect(&url).await?;
//! let out = store
//!     .txn(&[Assert::missing("job/1")], &[Mutation::put("job/1", b"pending".to_vec())])
//!     .await?;
//! println!("created: {}", out.applied);
//! # Ok(())
//! # }
//! ```

mod changes;
mod errors;
mod fast;
pub mod fenced;
mod in_transaction;
mod options;
mod pooled;
mod schema;
pub mod servers;
mod statements;

use async_trait::async_trait;
use coord_backend::reclaim::{self as floor, Announcer};
use coord_backend::{
    validate_namespace, validate_prefix, Assert, Backend, ChangeWatch, Changes, Entry, Error,
    Limits, Mutation, ReclaimOptions, Reclaimed, Result, StoreUrl, TxnOutcome,
};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Executor, PgConnection};
use statements::Statement;

pub use in_transaction::{InTransaction, TransactionConn, TransactionOptions};
pub use options::PostgresOptions;
pub use schema::SCHEMA_SQL;
pub use servers::Servers;
use servers::Walk;

/// How long a store keeps walking its servers after a failure, waiting for
/// a standby to be promoted (see `PostgresBackend::keep_following`).
const FOLLOW_FOR: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a call waits for a pooled session before the store looks for
/// another server in the background (the call keeps waiting).
const SLOW_ACQUIRE: std::time::Duration = std::time::Duration::from_secs(1);
/// The first pause between two walks; it doubles up to [`FOLLOW_MAX_PAUSE`].
const FOLLOW_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
/// The longest pause between two walks.
const FOLLOW_MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

const RECLAIM_SQL: &str = "SELECT removed, more FROM coord_reclaim($1, $2)";

/// The PostgreSQL store: a pool of sqlx connections to one database, reading
/// and writing one namespace. Cheap to clone (the pool is shared).
#[derive(Clone, Debug)]
pub struct PostgresBackend {
    namespace: String,
    pool: PgPool,
    /// The servers of the URL and the one sessions go to (see [`servers`]).
    servers: std::sync::Arc<Servers>,
    /// How long opening a session may take.
    connect_timeout: std::time::Duration,
    limits: Limits,
    /// Change notifications (shared by clones), see `changes.rs`.
    listener: std::sync::Arc<changes::Listener>,
    /// See [`PostgresOptions::vacuum_after_reclaim`].
    vacuum_after_reclaim: bool,
    /// This client's announcements of its storage format (shared by clones).
    announcer: std::sync::Arc<Announcer>,
    /// Set while a `keep_following` loop runs (shared by clones).
    following: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Behind a transaction pooler: how each call's transaction sets itself
    /// up (see `pooled.rs`); `None` when sessions are this client's own.
    pooled: Option<pooled::Envelope>,
    /// Set when a new session of this client, in session mode, found a
    /// statement name taken (`errors::shows_shared_session`): a transaction
    /// pooler the probe at connect missed. sqlx retries a failed
    /// `after_connect` until the acquire times out; the timeout then names
    /// the setting instead.
    shared_seen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PostgresBackend {
    /// Connect to a `postgres://` or `postgresql://` URL with default
    /// [`PostgresOptions`], creating the schema when it is missing.
    ///
    /// The namespace comes from `?namespace=` (see [`StoreUrl`]); every other
    /// query parameter (`sslmode`, `sslrootcert`, `application_name`,
    /// `options`, …) is passed to sqlx. The schema lives in the first schema of
    /// the session's `search_path` (set it with `options=-c search_path=NAME`).
    /// Sessions always run at READ COMMITTED: a `default_transaction_isolation`
    /// from `options`, the role, the database or the server is overridden
    /// (see "Atomicity boundary" above).
    pub async fn connect(url: &StoreUrl) -> Result<Self> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// [`connect`](Self::connect) with explicit options.
    pub async fn connect_with(url: &StoreUrl, options: PostgresOptions) -> Result<Self> {
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(Error::Config(format!(
                "coord-postgres expects a postgres:// or postgresql:// URL, got {}://",
                url.scheme()
            )));
        }
        validate_namespace(url.namespace())?;
        // `coord_txn` is correct at READ COMMITTED only (see the crate docs):
        // a startup parameter outranks the defaults of the database, the role
        // and the server, and comes after the URL's own `options`, so every
        // session of this store runs at READ COMMITTED whatever was
        // configured, at no extra round trip.
        let servers = std::sync::Arc::new(Servers::parse(url.without_namespace(), |o| {
            let mut o = o.options([("default_transaction_isolation", "read committed")]);
            if !options.notify_changes {
                // Read by `coord_notify` (schema r4): no `pg_notify` from this client's sessions.
                o = o.options([("coord.notify", "off")]);
            }
            if let Some(timeout) = options.statement_timeout {
                // A startup parameter: costs no round trip per connection.
                o = o.options([("statement_timeout", timeout.as_millis().max(1))]);
            }
            o
        })?);

        // Schema first, on a connection of its own: pooled connections prepare
        // the txn statement when they open, which needs the function to exist.
        // With several hosts, the first writable one becomes current.
        let mut conn = servers.connect(options.connect_timeout).await?;
        let pooled = servers
            .shares_sessions(&mut conn, options.connect_timeout)
            .await?
            .then_some(pooled::Envelope {
                statement_timeout: options.statement_timeout,
                notify: options.notify_changes,
            });
        if pooled.is_some() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    server = %servers.current_label(),
                    "coord-postgres: a transaction pooler shares server sessions between \
                     clients: each call runs as one transaction of its own, and change \
                     notifications are off (LISTEN needs a session of its own): waiters poll; \
                     use pool_mode = session for notifications"
                );
            });
        }
        let schema = if options.create_schema {
            schema::ensure_schema(&mut conn)
                .await
                .map_err(|e| errors::before_sending("creating the coord schema", e))
        } else {
            schema::check_schema(&mut conn).await
        };
        let _ = conn.close().await;
        schema?;

        let ping_idle_after = options.ping_idle_after;
        let prepare = pooled.is_none();
        let (for_acquire, for_connect) = (servers.clone(), servers.clone());
        let shared_seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = shared_seen.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout)
            // sqlx would otherwise ping before *every* use: one more round trip per call.
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let servers = for_acquire.clone();
                Box::pin(async move {
                    // A session opened before a failover may talk to the old primary.
                    if servers.opened_before_switch(meta.age) {
                        return Ok(false);
                    }
                    if ping_idle_after.is_some_and(|after| meta.idle_for >= after) {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _meta| {
                let servers = for_connect.clone();
                let seen = seen.clone();
                Box::pin(async move {
                    // A standby (with target_session_attrs=read-write) is never used.
                    servers.check(conn).await?;
                    if !prepare {
                        // Behind a transaction pooler the next call may
                        // run on another server session (see `pooled.rs`).
                        return Ok(());
                    }
                    // Parse once per connection, so a txn is Bind/Execute/Sync only:
                    // one round trip, and any failure inside it is after sending.
                    let prepared = async {
                        conn.prepare(sqlx::SqlSafeStr::into_sql_str(statements::TXN_SQL))
                            .await?;
                        for sql in [fast::WRITE_IF_AT_SQL, fast::WRITE_IF_MISSING_SQL] {
                            conn.prepare(sqlx::SqlSafeStr::into_sql_str(sql)).await?;
                        }
                        Ok(())
                    }
                    .await;
                    if prepared.as_ref().is_err_and(errors::shows_shared_session) {
                        seen.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    prepared
                })
            })
            .connect_lazy_with(servers.current_options());
        Ok(PostgresBackend {
            namespace: url.namespace().to_owned(),
            pool,
            servers,
            connect_timeout: options.connect_timeout,
            limits: Limits::DEFAULT,
            listener: Default::default(),
            vacuum_after_reclaim: options.vacuum_after_reclaim,
            announcer: std::sync::Arc::new(Announcer::new(floor::STORAGE_FORMAT)),
            following: Default::default(),
            pooled,
            shared_seen,
        })
    }

    /// `VACUUM coord_kv` on its own connection, without the statement
    /// timeout (see [`PostgresOptions::vacuum_after_reclaim`]); a failure is
    /// logged, never an error: the reclaim itself is done.
    async fn vacuum(&self) {
        let result = async {
            let mut conn = self.pool.acquire().await?;
            if self.pooled.is_some() {
                // A session SET would stay on a server session other clients
                // borrow; the pooler dropped the startup statement_timeout,
                // so the server's default applies anyway.
                return sqlx::raw_sql("VACUUM coord_kv")
                    .execute(&mut *conn)
                    .await
                    .map(|_| ());
            }
            sqlx::raw_sql("SET statement_timeout = 0")
                .execute(&mut *conn)
                .await?;
            let vacuumed = sqlx::raw_sql("VACUUM coord_kv").execute(&mut *conn).await;
            sqlx::raw_sql("RESET statement_timeout")
                .execute(&mut *conn)
                .await?;
            vacuumed.map(|_| ())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(%error, "coord-postgres: VACUUM after reclaim failed; autovacuum will do it");
        }
    }

    /// Close every pooled connection; later calls fail with [`Error::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// One call behind a transaction pooler: `sql` (`None`: a text held a
    /// NUL, which validation refuses before this) in a transaction of its
    /// own (see `pooled.rs`); a failure goes through `map` with whether the
    /// statement had completed.
    async fn pooled_call(
        &self,
        what: &str,
        sql: Option<String>,
        map: impl FnOnce(sqlx::Error, bool) -> Error,
    ) -> Result<Vec<PgRow>> {
        let Some(envelope) = self.pooled else {
            return Err(Error::Config(format!("{what}: not in pooled mode")));
        };
        let sql = sql.ok_or_else(|| {
            Error::InvalidInput(coord_backend::InvalidInput::NulByte(what.to_owned()))
        })?;
        let mut conn = self.acquire(what).await?;
        match envelope.run(&mut conn, &sql).await {
            Ok(rows) => Ok(rows),
            Err((error, completed)) => {
                self.after_failure(&mut conn, &error);
                Err(map(error, completed))
            }
        }
    }

    /// A pooled session. When none can be opened and the URL names other
    /// servers, they are tried (a failover) and, if another one is
    /// writable now, the pool follows it and this call tries once more:
    /// nothing was sent yet, so that is safe.
    async fn acquire(&self, what: &str) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        let since = std::time::Instant::now();
        let acquire = self.pool.acquire();
        tokio::pin!(acquire);
        let acquired = match tokio::time::timeout(SLOW_ACQUIRE, &mut acquire).await {
            Ok(acquired) => acquired,
            Err(_) => {
                // No session yet: perhaps the server is gone with no call in
                // flight to notice. Look for another while this one waits.
                if self.servers.len() > 1 {
                    let this = self.clone();
                    tokio::spawn(async move { this.keep_following(since).await });
                }
                acquire.await
            }
        };
        match acquired {
            Ok(conn) => Ok(conn),
            Err(sqlx::Error::Configuration(e)) => Err(Error::Config(format!("{what}: {e}"))),
            Err(error) => {
                if self.shared_seen.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(errors::shared_session(
                        what,
                        &"a new session found a prepared statement name already taken",
                    ));
                }
                if self.follow_failover(since).await {
                    if let Ok(conn) = self.pool.acquire().await {
                        return Ok(conn);
                    }
                }
                Err(errors::before_sending(what, error))
            }
        }
    }

    /// Walk the URL's servers after a failure noticed at `since`; when
    /// another one is writable now, point the pool at it. True if it moved.
    async fn follow_failover(&self, since: std::time::Instant) -> bool {
        if self
            .servers
            .find_writable(since, self.connect_timeout)
            .await
            != Walk::Moved
        {
            return false;
        }
        self.pool
            .set_connect_options(self.servers.current_options());
        true
    }

    /// Follow a failover noticed at `noticed` until the pool moved, the
    /// current server passes again, or [`FOLLOW_FOR`] passed: a standby is
    /// promoted some time after its primary died, and until then no server
    /// passes. Sessions being opened meanwhile (sqlx retries a refused
    /// connection until its acquire timeout) read the moved connect
    /// options at their next attempt, so calls resume soon after the
    /// promotion instead of after their timeout. One loop per store.
    async fn keep_following(&self, noticed: std::time::Instant) {
        let Some(_following) = Following::start(&self.following) else {
            return;
        };
        let mut since = noticed;
        let mut pause = FOLLOW_FIRST_PAUSE;
        loop {
            match self
                .servers
                .find_writable(since, self.connect_timeout)
                .await
            {
                Walk::Moved => {
                    self.pool
                        .set_connect_options(self.servers.current_options());
                    break;
                }
                Walk::Unchanged => break,
                Walk::NoneWritable | Walk::WalkedSince => {}
            }
            if noticed.elapsed() >= FOLLOW_FOR {
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(FOLLOW_MAX_PAUSE);
            since = std::time::Instant::now();
        }
    }

    /// After a statement failed with `error` on `conn`: a session whose
    /// state is unknown is never handed out again, and one that lost its
    /// server or landed on a read-only one sends the pool looking for the
    /// primary (in the background: this call's answer does not wait).
    fn after_failure(
        &self,
        conn: &mut sqlx::pool::PoolConnection<sqlx::Postgres>,
        error: &sqlx::Error,
    ) {
        let read_only = matches!(error, sqlx::Error::Database(db)
            if db.code().as_deref() == Some(errors::READ_ONLY_TRANSACTION));
        // A pooled call that failed left its transaction aborted (the server
        // skipped its COMMIT): never lend that session to another call.
        if matches!(error, sqlx::Error::Database(_)) && !read_only && self.pooled.is_none() {
            return;
        }
        conn.close_on_drop();
        if self.servers.len() > 1 {
            let this = self.clone();
            let since = std::time::Instant::now();
            tokio::spawn(async move {
                this.keep_following(since).await;
            });
        }
    }
}

/// The one `keep_following` loop of a store: its flag is cleared when the
/// loop ends, also when its task is dropped mid-way.
struct Following<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> Following<'a> {
    fn start(flag: &'a std::sync::atomic::AtomicBool) -> Option<Following<'a>> {
        (!flag.swap(true, std::sync::atomic::Ordering::SeqCst)).then_some(Following(flag))
    }
}

impl Drop for Following<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The store's own sessions: a prepared statement on a pooled session, or
/// behind a transaction pooler the statement inlined in a transaction of
/// its own (`pooled.rs`). A txn's lost reply is [`Error::Indeterminate`]
/// (`errors::txn`), a read's failure [`Error::Unavailable`].
#[async_trait]
impl statements::Session for PostgresBackend {
    async fn rows(&self, statement: &Statement<'_>) -> Result<Vec<PgRow>> {
        let what = statement.what();
        let map = |error, completed| {
            if statement.writes() {
                errors::txn(error, completed)
            } else {
                errors::read(what, error)
            }
        };
        if self.pooled.is_some() {
            return self
                .pooled_call(what, statement.inline(&self.namespace), map)
                .await;
        }
        let mut conn = self.acquire(what).await?;
        match statements::fetch(&mut conn, statement.query(&self.namespace)).await {
            Ok(rows) => Ok(rows),
            Err((error, completed)) => {
                self.after_failure(&mut conn, &error);
                Err(map(error, completed))
            }
        }
    }
}

/// `pg_notify` sent by `coord_txn` in the writing transaction (delivered only
/// on commit) while a listener's lease on the namespace is live, one
/// `LISTEN` connection per backend: see `changes.rs`.
#[async_trait]
impl Changes for PostgresBackend {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        validate_prefix(prefix, &self.limits)?;
        self.listener
            .watch(&self.pool, &self.namespace, prefix)
            .await
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    /// `None` behind a transaction pooler: `LISTEN` needs a server session
    /// of its own (connect logged it once; waiters poll).
    fn changes(&self) -> Option<&dyn Changes> {
        if self.pooled.is_some() {
            return None;
        }
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        statements::snapshot(self, keys).await
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        self.announce().await?;
        statements::txn(self, asserts, mutations).await
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        statements::keys(self, prefix, None).await
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        statements::keys(self, prefix, Some(limit)).await
    }

    /// `coord_reclaim` (see `schema.rs`) in batches of at most
    /// 256 tombstones (`RECLAIM_BATCH`), each batch its own transaction: a batch
    /// holds one advisory lock per tombstone until it commits, and
    /// PostgreSQL's lock table is shared by every session.
    ///
    /// Each batch's transaction first locks `coord_clients` (SHARE: no
    /// client announces until it commits) and refuses while an older client
    /// was seen (`coord_backend::reclaim`, "Mixed versions").
    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.announce().await?;
        let mut left = options.max_tombstones.max(1);
        let mut removed = 0u64;
        loop {
            let batch = left.min(RECLAIM_BATCH);
            let mut conn = self.acquire("reclaim").await?;
            let (n, more) = self.reclaim_batch(&mut conn, batch, options).await?;
            let n = u64::try_from(n).unwrap_or(0);
            removed += n;
            left = left.saturating_sub(n as usize);
            // n == 0 with more left: every candidate was re-created meanwhile.
            if !more || left == 0 || n == 0 {
                if !more && removed > 0 && self.vacuum_after_reclaim {
                    self.vacuum().await;
                }
                return Ok(Reclaimed::new(removed, more));
            }
        }
    }
}

impl PostgresBackend {
    /// Announce this client's storage format when it is due: one
    /// transaction (see [`ANNOUNCE_SQL`]).
    async fn announce(&self) -> Result<()> {
        if !self.announcer.due() {
            return Ok(());
        }
        let sent = std::time::Instant::now();
        let now = i64::try_from(floor::now_ms()).unwrap_or(i64::MAX);
        let since = i64::try_from(floor::recent_since(now as u64)).unwrap_or(0);
        let mut conn = self.acquire("announce").await?;
        // Nothing a reader sees depends on it: any failure is "try again".
        let failed = |e: sqlx::Error| {
            if errors::shows_shared_session(&e) {
                errors::shared_session("announce", &e)
            } else {
                Error::unavailable("announcing the storage format failed", e)
            }
        };
        let mut tx = self.begin(&mut conn).await.map_err(failed)?;
        let persistent = self.pooled.is_none();
        sqlx::query(ANNOUNCE_NAMESPACE_SQL)
            .persistent(persistent)
            .bind(&self.namespace)
            .bind(i64::from(self.announcer.format()) as i32)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        let required: i32 = sqlx::query_scalar(REQUIRED_SQL)
            .persistent(persistent)
            .bind(&self.namespace)
            .fetch_one(&mut *tx)
            .await
            .map_err(failed)?;
        floor::check_announce(
            self.announcer.format(),
            u32::try_from(required).unwrap_or(0),
        )?;
        sqlx::query(ANNOUNCE_CLIENT_SQL)
            .persistent(persistent)
            .bind(&self.namespace)
            .bind(self.announcer.id())
            .bind(self.announcer.format() as i32)
            .bind(now)
            .bind(since)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        self.announcer.announced(sent);
        Ok(())
    }

    /// A transaction of several statements. Behind a transaction pooler it
    /// sets its isolation level and statement timeout itself, and its
    /// statements are unnamed: the server session is this client's until
    /// COMMIT only (see `pooled.rs`).
    async fn begin<'c>(
        &self,
        conn: &'c mut PgConnection,
    ) -> std::result::Result<sqlx::Transaction<'c, sqlx::Postgres>, sqlx::Error> {
        match self.pooled {
            None => conn.begin().await,
            Some(envelope) => {
                let (prelude, _) = envelope.prelude();
                conn.begin_with(sqlx::AssertSqlSafe(prelude)).await
            }
        }
    }

    /// One batch of a reclaim, in its own transaction: the announcements
    /// checked under a SHARE lock, then `coord_reclaim`.
    async fn reclaim_batch(
        &self,
        conn: &mut PgConnection,
        batch: usize,
        options: &ReclaimOptions,
    ) -> Result<(i64, bool)> {
        let ours = self.announcer.format();
        let since = i64::try_from(floor::recent_since(floor::now_ms())).unwrap_or(0);
        let mut tx = self.begin(conn).await.map_err(errors::reclaim)?;
        let persistent = self.pooled.is_none();
        sqlx::query("LOCK TABLE coord_clients IN SHARE MODE")
            .persistent(persistent)
            .execute(&mut *tx)
            .await
            .map_err(errors::reclaim)?;
        let required: Option<i32> = sqlx::query_scalar(REQUIRED_SQL)
            .persistent(persistent)
            .bind(&self.namespace)
            .fetch_optional(&mut *tx)
            .await
            .map_err(errors::reclaim)?;
        let older: Option<(i32, i64)> = sqlx::query_as(
            "SELECT format, seen_ms FROM coord_clients WHERE ns = $1 AND client <> '' \
             AND format < $2 AND seen_ms >= $3 ORDER BY seen_ms DESC LIMIT 1",
        )
        .persistent(persistent)
        .bind(&self.namespace)
        .bind(ours as i32)
        .bind(since)
        .fetch_optional(&mut *tx)
        .await
        .map_err(errors::reclaim)?;
        let raise = floor::check_reclaim(
            ours,
            required.map_or(0, |r| u32::try_from(r).unwrap_or(0)),
            older.map(|(f, at)| {
                (
                    u32::try_from(f).unwrap_or(0),
                    u64::try_from(at).unwrap_or(0),
                )
            }),
            options.older_clients_stopped,
        )?;
        if raise {
            sqlx::query("UPDATE coord_clients SET format = $2 WHERE ns = $1 AND client = ''")
                .persistent(persistent)
                .bind(&self.namespace)
                .bind(ours as i32)
                .execute(&mut *tx)
                .await
                .map_err(errors::reclaim)?;
        }
        let (n, more): (i64, bool) = sqlx::query_as(RECLAIM_SQL)
            .persistent(persistent)
            .bind(&self.namespace)
            .bind(batch as i32)
            .fetch_one(&mut *tx)
            .await
            .map_err(errors::reclaim)?;
        tx.commit().await.map_err(errors::reclaim)?;
        Ok((n, more))
    }
}

/// The first announcement of a namespace writes its required format: the
/// client's when the namespace has no row (and no floor), else 0.
const ANNOUNCE_NAMESPACE_SQL: &str = "INSERT INTO coord_clients (ns, client, format, seen_ms) \
     SELECT $1, '', CASE WHEN EXISTS (SELECT 1 FROM coord_kv WHERE ns = $1) \
                           OR EXISTS (SELECT 1 FROM coord_floor WHERE ns = $1) \
                         THEN 0 ELSE $2 END, $3 \
     ON CONFLICT (ns, client) DO NOTHING";
/// The namespace's required format.
const REQUIRED_SQL: &str = "SELECT format FROM coord_clients WHERE ns = $1 AND client = ''";
/// Upsert the client's announcement and remove those older than the TTL.
const ANNOUNCE_CLIENT_SQL: &str =
    "WITH up AS (INSERT INTO coord_clients (ns, client, format, seen_ms) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (ns, client) \
     DO UPDATE SET format = EXCLUDED.format, seen_ms = EXCLUDED.seen_ms) \
     DELETE FROM coord_clients WHERE ns = $1 AND client <> '' AND client <> $2 AND seen_ms < $5";

/// Most tombstones one `coord_reclaim` transaction removes (and locks).
const RECLAIM_BATCH: usize = 256;
