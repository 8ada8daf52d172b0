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
//! 1. takes `pg_advisory_xact_lock` on every involved key (asserted, put or
//!    deleted; existing or not), in the order of their sorted 64-bit hashes,
//!    so racing txns never deadlock and a key that does not exist yet is
//!    locked as well as one that does;
//! 2. checks every assert (a missing key or a tombstone is version 0), and on a
//!    mismatch returns the current entries of the asserted keys and writes nothing;
//! 3. upserts each put with `version + 1`, and turns each delete into a
//!    tombstone row (`value = NULL`) with `version + 1`, so a version is never
//!    handed out twice for one key, also after delete and re-create.
//!
//! The function runs at READ COMMITTED. That is enough here because every
//! writer of a key holds that key's advisory lock until it commits, a lock is
//! released only after its holder's commit is visible, and each statement of
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
//! applied one answers one row. One whose condition failed wrote nothing, and
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
mod options;
mod schema;

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, validate_prefix, Assert, Backend, ChangeWatch, Changes, Entry, Error,
    Limits, Mutation, ReclaimOptions, Reclaimed, Result, StoreUrl, TxnOutcome, Version,
};
use futures_util::StreamExt;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Either, Executor, PgConnection, Row};

pub use options::PostgresOptions;
pub use schema::SCHEMA_SQL;

const SNAPSHOT_SQL: &str =
    "SELECT key, version, value FROM coord_kv WHERE ns = $1 AND key = ANY($2) AND value IS NOT NULL";
const TXN_SQL: &str = "SELECT applied, k, ver, val FROM coord_txn($1, $2, $3, $4, $5, $6)";
const RECLAIM_SQL: &str = "SELECT removed, more FROM coord_reclaim($1, $2)";
const KEYS_RANGE_SQL: &str = "SELECT key FROM coord_kv \
     WHERE ns = $1 AND key >= $2 AND key < $3 AND value IS NOT NULL ORDER BY key";
const KEYS_FROM_SQL: &str =
    "SELECT key FROM coord_kv WHERE ns = $1 AND key >= $2 AND value IS NOT NULL ORDER BY key";

/// The PostgreSQL store: a pool of sqlx connections to one database, reading
/// and writing one namespace. Cheap to clone (the pool is shared).
#[derive(Clone, Debug)]
pub struct PostgresBackend {
    namespace: String,
    pool: PgPool,
    limits: Limits,
    /// Change notifications (shared by clones), see `changes.rs`.
    listener: std::sync::Arc<changes::Listener>,
    /// See [`PostgresOptions::vacuum_after_reclaim`].
    vacuum_after_reclaim: bool,
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
        let mut connect_options = PgConnectOptions::from_str(url.without_namespace())
            .map_err(|e| Error::Config(format!("invalid PostgreSQL URL: {e}")))?
            .options([("default_transaction_isolation", "read committed")]);
        if !options.notify_changes {
            // Read by `coord_notify` (schema r4): no `pg_notify` from this client's sessions.
            connect_options = connect_options.options([("coord.notify", "off")]);
        }
        if let Some(timeout) = options.statement_timeout {
            // A startup parameter: costs no round trip per connection.
            connect_options =
                connect_options.options([("statement_timeout", timeout.as_millis().max(1))]);
        }

        // Schema first, on a connection of its own: pooled connections prepare
        // the txn statement when they open, which needs the function to exist.
        let mut conn = tokio::time::timeout(
            options.connect_timeout,
            PgConnection::connect_with(&connect_options),
        )
        .await
        .map_err(|_| Error::Unavailable {
            message: format!(
                "connecting to PostgreSQL timed out after {:?}",
                options.connect_timeout
            ),
            source: None,
        })?
        .map_err(|e| errors::before_sending("connect", e))?;
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
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout)
            // sqlx would otherwise ping before *every* use: one more round trip per call.
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if ping_idle_after.is_some_and(|after| meta.idle_for >= after) {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    // Parse once per connection, so a txn is Bind/Execute/Sync only:
                    // one round trip, and any failure inside it is after sending.
                    conn.prepare(sqlx::SqlSafeStr::into_sql_str(TXN_SQL))
                        .await?;
                    for sql in [fast::WRITE_IF_AT_SQL, fast::WRITE_IF_MISSING_SQL] {
                        conn.prepare(sqlx::SqlSafeStr::into_sql_str(sql)).await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(connect_options);
        Ok(PostgresBackend {
            namespace: url.namespace().to_owned(),
            pool,
            limits: Limits::DEFAULT,
            listener: Default::default(),
            vacuum_after_reclaim: options.vacuum_after_reclaim,
        })
    }

    /// `VACUUM coord_kv` on its own connection, without the statement
    /// timeout (see [`PostgresOptions::vacuum_after_reclaim`]); a failure is
    /// logged, never an error: the reclaim itself is done.
    async fn vacuum(&self) {
        let result = async {
            let mut conn = self.pool.acquire().await?;
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

    /// Run one writing statement (a `coord_txn` call or a fast-path write)
    /// on a pooled connection; its rows once it completed.
    async fn run_txn_statement(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<PgRow>> {
        let mut conn = self.acquire("txn").await?;
        let mut rows = Vec::new();
        let mut completed = false;
        let mut failure = None;
        {
            let mut stream = (&mut *conn).fetch_many(query);
            while let Some(step) = stream.next().await {
                match step {
                    Ok(Either::Left(_)) => completed = true,
                    Ok(Either::Right(row)) => rows.push(row),
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
        }
        if let Some(error) = failure {
            if !matches!(error, sqlx::Error::Database(_)) {
                // The session's state is unknown: never hand it out again.
                conn.close_on_drop();
            }
            return Err(errors::txn(error, completed));
        }
        Ok(rows)
    }

    async fn acquire(&self, what: &str) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        self.pool
            .acquire()
            .await
            .map_err(|e| errors::before_sending(what, e))
    }
}

/// Decode one `(key, version, value)` row; a value with a version below 1 is malformed.
fn entry_from(key: String, version: Option<i64>, value: Option<Vec<u8>>) -> Result<Entry> {
    match (value, version) {
        (None, _) => Ok(Entry::missing(key)),
        (Some(value), Some(v)) if v >= 1 => Ok(Entry::present(key, Version(v as u64), value)),
        (Some(_), v) => Err(Error::malformed(
            key,
            format!("stored value with version {v:?}; live values have version >= 1"),
        )),
    }
}

/// The smallest string above every string that starts with `prefix` (by
/// bytes, i.e. by code points), or `None` when there is none.
fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last as u32 + 1 {
            0xD800 => 0xE000, // skip the surrogate range: not chars
            n => n,
        };
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Versions above `i64::MAX` can never be stored, so asserting one must fail:
/// `-1` matches no row (stored versions are >= 0, missing keys are 0).
fn version_param(version: Version) -> i64 {
    i64::try_from(version.0).unwrap_or(-1)
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

    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        let mut conn = self.acquire("snapshot").await?;
        let rows: Vec<PgRow> = sqlx::query(SNAPSHOT_SQL)
            .bind(&self.namespace)
            .bind(keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| errors::read("snapshot", e))?;
        drop(conn);
        rows.into_iter()
            .map(|row| {
                let key: String = row.try_get(0).map_err(|e| errors::read("snapshot", e))?;
                let version: i64 = row.try_get(1).map_err(|e| errors::read("snapshot", e))?;
                let value: Option<Vec<u8>> =
                    row.try_get(2).map_err(|e| errors::read("snapshot", e))?;
                entry_from(key, Some(version), value)
            })
            .collect()
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        if let Some(single) = fast::single_key(asserts, mutations, version_param) {
            let query = sqlx::query(single.sql())
                .bind(&self.namespace)
                .bind(single.key)
                .bind(single.value);
            let query = match single.version {
                0 => query,
                version => query.bind(version),
            };
            if !self.run_txn_statement(query).await?.is_empty() {
                return Ok(TxnOutcome::applied());
            }
            // The condition failed (or the session is not at READ
            // COMMITTED): nothing was written. `coord_txn` decides again
            // under the lock and answers the current entry.
        }
        let mut seen = HashSet::new();
        let mut assert_keys: Vec<&str> = Vec::with_capacity(asserts.len());
        let mut assert_versions: Vec<i64> = Vec::with_capacity(asserts.len());
        for assert in asserts {
            if seen.insert(assert.key.as_str()) {
                assert_keys.push(&assert.key);
                assert_versions.push(version_param(assert.version));
            }
        }
        let mut put_keys: Vec<&str> = Vec::new();
        let mut put_values: Vec<&[u8]> = Vec::new();
        let mut delete_keys: Vec<&str> = Vec::new();
        for mutation in mutations {
            match mutation {
                Mutation::Put { key, value } => {
                    put_keys.push(key);
                    put_values.push(value);
                }
                Mutation::Delete { key } => delete_keys.push(key),
            }
        }

        let query = sqlx::query(TXN_SQL)
            .bind(&self.namespace)
            .bind(&assert_keys)
            .bind(&assert_versions)
            .bind(&put_keys)
            .bind(&put_values)
            .bind(&delete_keys);
        let rows = self.run_txn_statement(query).await?;
        decode_txn_rows(rows, &assert_keys)
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut conn = self.acquire("keys").await?;
        let rows: Vec<(String,)> = match prefix_successor(prefix) {
            Some(successor) => {
                sqlx::query_as(KEYS_RANGE_SQL)
                    .bind(&self.namespace)
                    .bind(prefix)
                    .bind(successor)
                    .fetch_all(&mut *conn)
                    .await
            }
            None => {
                sqlx::query_as(KEYS_FROM_SQL)
                    .bind(&self.namespace)
                    .bind(prefix)
                    .fetch_all(&mut *conn)
                    .await
            }
        }
        .map_err(|e| errors::read("keys", e))?;
        Ok(rows.into_iter().map(|(k,)| k).collect())
    }

    /// `coord_reclaim` (see `schema.rs`) in batches of at most
    /// 256 tombstones (`RECLAIM_BATCH`), each batch its own transaction: a batch
    /// holds one advisory lock per tombstone until it commits, and
    /// PostgreSQL's lock table is shared by every session.
    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        let mut left = options.max_tombstones.max(1);
        let mut removed = 0u64;
        loop {
            let batch = left.min(RECLAIM_BATCH);
            let mut conn = self.acquire("reclaim").await?;
            let (n, more): (i64, bool) = sqlx::query_as(RECLAIM_SQL)
                .bind(&self.namespace)
                .bind(batch as i32)
                .fetch_one(&mut *conn)
                .await
                .map_err(errors::reclaim)?;
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

/// Most tombstones one `coord_reclaim` transaction removes (and locks).
const RECLAIM_BATCH: usize = 256;

/// Turn the rows of `coord_txn` into an outcome. The statement has completed
/// and committed here, so rows we cannot read leave the outcome unknown.
fn decode_txn_rows(rows: Vec<PgRow>, assert_keys: &[&str]) -> Result<TxnOutcome> {
    let unreadable = |reason: String| Error::Indeterminate {
        message: format!("coord_txn answered rows that cannot be read: {reason}"),
        source: None,
    };
    let first = rows
        .first()
        .ok_or_else(|| unreadable("no row".to_owned()))?;
    let applied: bool = first.try_get(0).map_err(|e| unreadable(e.to_string()))?;
    if applied {
        return Ok(TxnOutcome::applied());
    }
    let mut current = HashMap::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get(1).map_err(|e| unreadable(e.to_string()))?;
        let version: Option<i64> = row.try_get(2).map_err(|e| unreadable(e.to_string()))?;
        let value: Option<Vec<u8>> = row.try_get(3).map_err(|e| unreadable(e.to_string()))?;
        let entry = entry_from(key.clone(), version, value)?;
        current.insert(key, entry);
    }
    assert_keys
        .iter()
        .map(|k| {
            current
                .remove(*k)
                .ok_or_else(|| unreadable(format!("no current entry for asserted key {k:?}")))
        })
        .collect::<Result<Vec<_>>>()
        .map(TxnOutcome::rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_bounds_exactly_the_prefix() {
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("a/").as_deref(), Some("a0"));
        assert_eq!(prefix_successor("a%").as_deref(), Some("a&"));
        assert_eq!(prefix_successor("\u{D7FF}").as_deref(), Some("\u{E000}"));
        assert_eq!(prefix_successor("x\u{10FFFF}").as_deref(), Some("y"));
        assert_eq!(prefix_successor("\u{10FFFF}"), None);
        for (prefix, inside, outside) in [
            ("é", "éa", "ê"),
            ("a_", "a_\u{10FFFF}", "a`"),
            ("k\u{FFFF}", "k\u{FFFF}\u{FFFF}", "k\u{10000}"),
        ] {
            let succ = prefix_successor(prefix).unwrap();
            assert!(inside.as_bytes() < succ.as_bytes() && inside.starts_with(prefix));
            assert!(outside.as_bytes() >= succ.as_bytes());
        }
    }

    #[test]
    fn versions_beyond_i64_never_match() {
        assert_eq!(version_param(Version(7)), 7);
        assert_eq!(version_param(Version(u64::MAX)), -1);
    }

    #[test]
    fn entries_are_checked() {
        assert!(!entry_from("k".into(), Some(3), None).unwrap().exists());
        assert_eq!(
            entry_from("k".into(), Some(3), Some(b"v".to_vec())).unwrap(),
            Entry::present("k", Version(3), b"v".to_vec())
        );
        assert!(matches!(
            entry_from("k".into(), Some(0), Some(b"v".to_vec())),
            Err(Error::MalformedRecord { .. })
        ));
    }
}
