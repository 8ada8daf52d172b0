//! coord's embedded default store: **one SQLite file, atomic across the OS
//! processes of ONE host**.
//!
//! [`SqliteBackend`] implements the three primitives of
//! [`coord_backend::Backend`] on one table of one SQLite database file, in
//! WAL mode, through sqlx (bundled libsqlite3, runtime-checked queries).
//!
//! # Atomicity boundary
//!
//! Every process and every [`SqliteBackend`] that opens **the same file on
//! the same host** shares one store: SQLite's file locks and the WAL index
//! (the `-shm` file, shared memory) serialize their writers. That is the
//! whole boundary:
//!
//! - **not over a network file system** (NFS, SMB, most FUSE mounts): their
//!   locks are unreliable and WAL needs memory shared between the processes,
//!   which only exists on one machine. Two hosts on one shared file may both
//!   commit conflicting txns or corrupt the file;
//! - not across machines or containers that do not share the host kernel and
//!   the directory (bind-mounting the directory into containers of one host is fine);
//! - the file must stay where it is: deleting or replacing it (or its `-wal`
//!   / `-shm` companions) while processes use it forks the store.
//!
//! For more than one host use a server store (PostgreSQL, Redis, etcd).
//!
//! # Shape (docs/shapes.md has every store's)
//!
//! One table, created idempotently on open (with the floor table and two
//! partial indexes of revision 2, see `schema.rs`):
//!
//! ```sql
//! CREATE TABLE coord_kv (ns TEXT, key TEXT, version INTEGER, value BLOB,
//!                        PRIMARY KEY (ns, key)) STRICT, WITHOUT ROWID
//! CREATE TABLE coord_floor (ns TEXT PRIMARY KEY, floor INTEGER) STRICT, WITHOUT ROWID
//! CREATE INDEX coord_kv_live ON coord_kv (ns, key) WHERE value IS NOT NULL
//! CREATE INDEX coord_kv_dead ON coord_kv (ns, key) WHERE value IS NULL
//! ```
//!
//! - **snapshot**: one `SELECT … WHERE ns = ? AND key IN (…)`. A single
//!   statement reads one WAL snapshot, so it is consistent.
//! - **txn**: `BEGIN IMMEDIATE` (takes the write lock first, so there is no
//!   read-to-write upgrade that could fail half way) → one `SELECT` of the
//!   asserted keys → every assert checked → one multi-row upsert
//!   (`version = version + 1`, a new row at `floor + 1`; `RETURNING` the
//!   versions it stored, which the applied txn reports for its puts) →
//!   `COMMIT`, all on the backend's one writer connection (txns of one
//!   backend and its clones queue for it; reads use a pool). A rejected txn returns the rows
//!   read by that same `SELECT`.
//! - **keys**: a range scan of the live-row index `coord_kv_live`,
//!   `key >= prefix AND key < successor(prefix)` where the successor is the
//!   prefix with its last byte incremented, so tombstones cost a listing
//!   nothing. Keys use the `BINARY` collation (memcmp), so the order is byte
//!   order and no character of the prefix is a pattern.
//! - **versions**: a delete keeps the row with `value = NULL` (a tombstone)
//!   and a bumped version, so a re-created key continues the count.
//! - **reclaim**: one write transaction deletes the first tombstones (found
//!   through `coord_kv_dead`) and raises the namespace's `coord_floor` to
//!   their highest version; a key without a row starts at `floor + 1`, so a
//!   version is never reused. The same transaction first reads
//!   `coord_clients` and refuses while an older client was seen
//!   ([`Error::FormatMismatch`], see `coord_backend::reclaim`, "Mixed
//!   versions").
//! - **announcements**: before its first txn and then once a minute, a
//!   backend upserts its row in `coord_clients` (its storage format and
//!   the time) in a write transaction of its own, which also removes rows
//!   older than a quarter hour.
//!
//! # Busy files and errors
//!
//! Other connections holding the write lock make SQLite wait up to
//! [`SqliteOptions::busy_timeout`]; a call that still meets `SQLITE_BUSY` or
//! `SQLITE_LOCKED` before its `COMMIT` has written nothing and is retried as a
//! whole with jittered backoff, up to [`SqliteOptions::busy_retries`] times,
//! then fails with [`Error::Unavailable`]. A `COMMIT` that fails with
//! `SQLITE_BUSY` left the txn open and uncommitted (SQLite's documented
//! behaviour), so it is rolled back and retried too; any other failure of
//! `COMMIT` is [`Error::Indeterminate`]. Failures to open or read the file are
//! [`Error::Unavailable`]; rows this crate did not write (wrong types,
//! non-positive versions) are [`Error::MalformedRecord`].
//!
//! # Limits
//!
//! - All writers of a file, whatever their namespace, take turns: one txn
//!   commits at a time, and with [`Durability::Full`] (the default) each
//!   commit waits for an fsync of the WAL.
//! - [`Limits::DEFAULT`] unless [`SqliteOptions::limits`] says otherwise.
//! - Needs a tokio runtime with the time driver (retries sleep).
//!
//! # In the caller's transaction
//!
//! [`InTransaction`] is a coord store bound to ONE open transaction of the
//! application's own [`SqlitePool`]: every coord write made through it
//! (a board task added, a side effect recorded, a lock taken) commits or
//! rolls back with the application's own rows. It runs the very statements
//! of [`SqliteBackend`]'s txn (the `SELECT` of the asserted keys, the
//! checks, the multi-row upsert with the same version, tombstone and floor
//! rules) without its `BEGIN IMMEDIATE` / `COMMIT` and without its busy
//! retries: those belong to the caller's transaction.
//!
//! - **One file.** The application's pool must open the coord store's file
//!   ([`pool_options`] gives coord's own connection settings, and does not
//!   create the file); the schema is created by [`SqliteBackend::open`] /
//!   [`SqliteBackend::connect`], which must have run once on that file (a
//!   missing table is [`Error::Config`] naming that fix). WAL mode is the
//!   file's (set by that open); `busy_timeout` and `synchronous` are the
//!   pool's options: keep `synchronous = FULL` (the default) when the store
//!   hands out fences, and a `busy_timeout` of seconds (5 s in
//!   [`pool_options`]).
//! - **Begin.** [`InTransaction::begin`] opens `BEGIN IMMEDIATE`: the whole
//!   database's write lock is taken at once (waiting up to `busy_timeout`),
//!   so no write inside can meet `SQLITE_BUSY`.
//!   [`InTransaction::from_transaction`] binds a transaction the caller
//!   began; a `DEFERRED` one (sqlx's `begin()`) takes the lock at its first
//!   write, which fails with `SQLITE_BUSY` when another connection committed
//!   since the transaction's first read.
//! - **Answers.** A txn whose asserts hold is applied *within the
//!   transaction*: later calls through the same [`InTransaction`] see it,
//!   other connections do not until `COMMIT`. A rejected assert is a plain
//!   rejection (`applied = false` with the current entries). There is no
//!   [`Error::Indeterminate`] from a call (nothing is committed by it):
//!   `SQLITE_BUSY` / `SQLITE_LOCKED` and every other failed statement are
//!   [`Error::Unavailable`] (a missing schema is [`Error::Config`], a row
//!   coord did not write [`Error::MalformedRecord`]: neither changed
//!   anything), after which the transaction is *broken*: later
//!   calls and [`InTransaction::conn`] are refused with
//!   [`Error::Unavailable`] and [`InTransaction::commit`] rolls back and
//!   says so (SQLite may already have rolled the transaction back on its
//!   own after `SQLITE_BUSY`). A call cancelled half way (its future
//!   dropped) breaks it too. Roll back and retry the WHOLE transaction.
//! - **Commit.** [`InTransaction::commit`]: [`Error::Unavailable`] when
//!   nothing was committed (`SQLITE_BUSY` at `COMMIT`, which SQLite leaves
//!   uncommitted and coord rolls back), [`Error::Indeterminate`] when
//!   `COMMIT` failed otherwise (it may have committed). After `commit` or
//!   [`rollback`](InTransaction::rollback), every call and `conn` is refused
//!   with [`InvalidInput::Argument`](coord_backend::InvalidInput::Argument)
//!   and nothing reaches SQLite.
//! - **Nothing is real before `COMMIT`.** A fence, token or version an
//!   adapter got inside the transaction exists only once `commit` returned
//!   `Ok`: after a rollback the same versions (and so fences) are handed out
//!   again by later txns, which is safe because no other client could read
//!   them. Do not use them outside the transaction before it committed.
//! - **No waiting.** [`Backend::changes`] is `Some`, but every
//!   [`Changes::watch`] fails with [`Error::Unsupported`] (`what`: "waiting
//!   for other clients' commits inside a caller's transaction"), and the
//!   adapters refuse every call that would have to wait (a lock wait,
//!   `claim_next_wait`, …); a call that succeeds at once works. Why: the
//!   transaction holds the whole database's write lock (a `DEFERRED` one
//!   reads one snapshot), so another client's commit cannot arrive while it
//!   is open, and a waiter would wait out its timeout.
//! - **Maintenance and announcements stay on the pooled store.**
//!   [`Backend::reclaim`] is refused ([`Error::Unsupported`]), and no
//!   storage-format announcement is written inside the caller's
//!   transaction: the process's [`SqliteBackend`] (opened once anyway for
//!   the schema) announces before its txns (see `coord_backend::reclaim`,
//!   "Mixed versions"). The first txn through an [`InTransaction`] reads
//!   the namespace's required format, and refuses
//!   ([`Error::FormatMismatch`]) when a newer coord requires more than this
//!   crate writes.
//! - [`Backend::store_name`] is `"sqlite-in-transaction"`.
//!
//! [`fenced`] writes the caller's own rows only while the caller's fence
//! (from a coord lock or claim) is at least the highest the row has seen,
//! in the same transaction.
//!
//! # Example
//!
//! ```
//! use coord_backend::{Assert, Backend, Mutation};
//! use coord_sqlite::SqliteBackend;
//!
//! # fn main() {
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # rt.block_on(async {
//! let dir = std::env::temp_dir().join(format!("coord-doc-{}", std::process::id()));
//! let store = SqliteBackend::open(dir.join("coord.db"), "demo").await.unwrap();
//! let out = store
//!     .txn(&[Assert::missing("k")], &[Mutation::put("k", b"v".to_vec())])
//!     .await
//!     .unwrap();
//! assert!(out.applied);
//! # store.close().await;
//! # std::fs::remove_dir_all(dir).unwrap();
//! # });
//! # }
//! ```

mod changes;
pub mod fenced;
mod in_transaction;
mod options;
mod schema;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::reclaim::{self as floor, Announcer};
use coord_backend::{
    distinct_keys, validate_namespace, validate_prefix, Assert, Backend, ChangeWatch, Changes,
    Entry, Error, Limits, Mutation, ReclaimOptions, Reclaimed, Result, StoreUrl, TxnOutcome,
    Version,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, Row};

pub use in_transaction::{InTransaction, TransactionConn};
pub use options::{Durability, SqliteOptions};

/// A coord store in one SQLite file: atomic across the processes of one
/// host (see the [crate docs](crate) for the boundary).
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone, Debug)]
pub struct SqliteBackend {
    namespace: String,
    path: PathBuf,
    pool: SqlitePool,
    options: SqliteOptions,
    /// The connection every txn runs on, and the change notifications it
    /// makes exact (shared by clones): see `changes.rs`.
    writer: std::sync::Arc<changes::Writer>,
    /// This client's announcements of its storage format (shared by clones).
    announcer: std::sync::Arc<Announcer>,
}

/// Why one attempt of a call did not produce an answer.
enum Attempt {
    /// The file was locked by another connection; nothing was written.
    Busy(sqlx::Error),
    /// A final error.
    Failed(Error),
}

impl From<Error> for Attempt {
    fn from(error: Error) -> Self {
        Attempt::Failed(error)
    }
}

pub(crate) fn is_busy(error: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    const SQLITE_LOCKED: i32 = 6;
    match error {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            // Extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT, ...) keep the primary code in the low byte.
            .is_some_and(|code| matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED)),
        _ => false,
    }
}

/// Whether `error` says the coord schema (or part of it) is not in the
/// database: a file [`SqliteBackend::open`] never prepared, or an older
/// revision of it (a caller's pool opened on another file, see
/// [`InTransaction`]).
fn schema_missing(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            let message = db.message();
            ["no such table: coord_", "no such index: coord_"]
                .iter()
                .any(|start| message.starts_with(start))
        }
        _ => false,
    }
}

/// Classify an error raised before `COMMIT` was sent: nothing was written.
fn before_commit(what: &str, error: sqlx::Error) -> Attempt {
    if is_busy(&error) {
        Attempt::Busy(error)
    } else if schema_missing(&error) {
        Attempt::Failed(Error::Config(format!(
            "sqlite: {what}: {error}; the coord schema is missing from this database \
             (open it once with coord_sqlite::SqliteBackend::open or connect, which creates \
             it, and make sure the connection's file is the coord store's)"
        )))
    } else {
        Attempt::Failed(Error::unavailable(format!("sqlite: {what}"), error))
    }
}

fn connect_options(path: &Path, options: &SqliteOptions) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .busy_timeout(options.busy_timeout)
        .foreign_keys(false)
        .synchronous(match options.durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Normal => SqliteSynchronous::Normal,
        })
}

/// Connection options for the application's own pool on the coord store's
/// file at `path`, for [`InTransaction`]: what coord's own connections
/// use with the default [`SqliteOptions`] (`busy_timeout` 5 s, `synchronous
/// = FULL`, see [`Durability::Full`]), except that the file is never created
/// (it must be one [`SqliteBackend::open`] prepared: the schema and WAL mode
/// are its) and foreign keys stay on (sqlx's default; coord's tables have
/// none). Chain more settings as usual:
///
/// ```no_run
/// # async fn demo() -> Result<(), sqlx::Error> {
/// use sqlx::sqlite::SqlitePoolOptions;
///
/// let pool = SqlitePoolOptions::new()
///     .max_connections(8)
///     .connect_with(coord_sqlite::pool_options("data/app.db").busy_timeout(std::time::Duration::from_secs(10)))
///     .await?;
/// # Ok(()) }
/// ```
pub fn pool_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
    let defaults = SqliteOptions::default();
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .busy_timeout(defaults.busy_timeout)
        .synchronous(SqliteSynchronous::Full)
}

/// `?2, ?3, …` for `count` parameters starting at `?first`.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The smallest byte string greater than every string that starts with
/// `prefix`, or `None` for the empty prefix. UTF-8 never contains 0xFF, so
/// incrementing the last byte cannot overflow; the result may be invalid
/// UTF-8, which is why it is bound as a BLOB and cast to TEXT in SQL.
fn successor(prefix: &str) -> Option<Vec<u8>> {
    let mut bytes = prefix.as_bytes().to_vec();
    let last = bytes.last_mut()?;
    debug_assert!(*last < 0xff);
    *last += 1;
    Some(bytes)
}

/// One row of `coord_kv` as an [`Entry`] (a tombstone is a missing entry).
fn decode_entry(row: &SqliteRow) -> Result<Entry> {
    let key: String = row
        .try_get("key")
        .map_err(|e| Error::malformed("?", format!("unreadable key: {e}")))?;
    let version: i64 = row
        .try_get("version")
        .map_err(|e| Error::malformed(&key, format!("unreadable version: {e}")))?;
    let value: Option<Vec<u8>> = row
        .try_get("value")
        .map_err(|e| Error::malformed(&key, format!("unreadable value: {e}")))?;
    if version <= 0 {
        return Err(Error::malformed(
            &key,
            format!("version {version} is not positive"),
        ));
    }
    Ok(match value {
        Some(value) => Entry::present(key, Version(version as u64), value),
        None => Entry::missing(key),
    })
}

/// Read the entries of `keys` (distinct, in order) with one statement.
async fn read_entries(
    conn: &mut SqliteConnection,
    namespace: &str,
    keys: &[&str],
) -> std::result::Result<Vec<Entry>, Attempt> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT key, version, value FROM coord_kv WHERE ns = ?1 AND key IN ({})",
        placeholders(2, keys.len())
    );
    // Only numbered placeholders are formatted into the SQL; every key is bound.
    let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace);
    for key in keys {
        query = query.bind(*key);
    }
    let rows = query
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| before_commit("reading keys", e))?;
    let mut found = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let entry = decode_entry(row)?;
        found.insert(entry.key.clone(), entry);
    }
    Ok(keys
        .iter()
        .map(|k| found.remove(*k).unwrap_or_else(|| Entry::missing(*k)))
        .collect())
}

/// The live keys of `namespace` under `prefix` on `conn`, sorted, the first
/// `limit` of them (`None`: all).
async fn list_keys(
    conn: &mut SqliteConnection,
    namespace: &str,
    prefix: &str,
    limit: Option<usize>,
) -> std::result::Result<Vec<String>, Attempt> {
    // SQLite reads a negative LIMIT as none.
    let limit = limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let rows = match successor(prefix) {
        Some(end) => sqlx::query(
            "SELECT key FROM coord_kv INDEXED BY coord_kv_live \
             WHERE ns = ?1 AND key >= ?2 AND key < CAST(?3 AS TEXT) \
             AND value IS NOT NULL ORDER BY key LIMIT ?4",
        )
        .bind(namespace)
        .bind(prefix)
        .bind(end)
        .bind(limit),
        None => sqlx::query(
            "SELECT key FROM coord_kv INDEXED BY coord_kv_live \
             WHERE ns = ?1 AND value IS NOT NULL ORDER BY key LIMIT ?2",
        )
        .bind(namespace)
        .bind(limit),
    }
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| before_commit("listing keys", e))?;
    rows.iter()
        .map(|row| {
            row.try_get::<String, _>("key")
                .map_err(|e| Attempt::Failed(Error::malformed("?", format!("unreadable key: {e}"))))
        })
        .collect()
}

impl SqliteBackend {
    /// Open (creating it and its parent directory if missing) the store in the
    /// file at `path`, for `namespace`, with default [`SqliteOptions`].
    pub async fn open(path: impl AsRef<Path>, namespace: &str) -> Result<Self> {
        Self::open_with(path, namespace, SqliteOptions::default()).await
    }

    /// [`open`](Self::open) with explicit options.
    pub async fn open_with(
        path: impl AsRef<Path>,
        namespace: &str,
        options: SqliteOptions,
    ) -> Result<Self> {
        validate_namespace(namespace)?;
        let path = path.as_ref();
        if path.as_os_str().is_empty() {
            return Err(Error::Config("sqlite store path is empty".into()));
        }
        if options.max_connections == 0 {
            return Err(Error::Config(
                "sqlite max_connections must be at least 1".into(),
            ));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                Error::unavailable(
                    format!("sqlite: cannot create directory {}", parent.display()),
                    e,
                )
            })?;
        }
        let connect = connect_options(path, &options);
        retry_busy(&options, "preparing the file", || {
            schema::prepare_file(connect.clone(), path)
        })
        .await?;
        let writer =
            changes::Writer::new(path.to_owned(), connect.clone(), options.acquire_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| {
                Error::unavailable(format!("sqlite: cannot open {}", path.display()), e)
            })?;
        Ok(SqliteBackend {
            namespace: namespace.to_owned(),
            path: path.to_owned(),
            pool,
            options,
            writer: std::sync::Arc::new(writer),
            announcer: std::sync::Arc::new(Announcer::new(floor::STORAGE_FORMAT)),
        })
    }

    /// Open the store a URL names: `sqlite://PATH?namespace=NS`.
    ///
    /// `sqlite://data/coord.db` is relative to the current directory,
    /// `sqlite:///var/lib/app/coord.db` is absolute. The path is taken
    /// literally (no percent-decoding). Optional query parameters:
    /// `durability=full|normal`, `max_connections=N`, `busy_timeout_ms=N`;
    /// any other parameter is a [`Error::Config`].
    ///
    /// ```
    /// use coord_backend::StoreUrl;
    /// use coord_sqlite::SqliteBackend;
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// # rt.block_on(async {
    /// let dir = std::env::temp_dir().join(format!("coord-url-doc-{}", std::process::id()));
    /// let url = StoreUrl::parse(&format!("sqlite://{}/c.db?namespace=app", dir.display())).unwrap();
    /// let store = SqliteBackend::connect(&url).await.unwrap();
    /// assert_eq!(store.path(), dir.join("c.db"));
    /// # store.close().await;
    /// # std::fs::remove_dir_all(dir).unwrap();
    /// # });
    /// ```
    pub async fn connect(url: &StoreUrl) -> Result<Self> {
        let (path, options) = parse_url(url)?;
        Self::open_with(path, url.namespace(), options).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options this backend was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// Close every connection (of this backend and its clones) and wait
    /// for them. Later calls fail with [`Error::Unavailable`].
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    async fn snapshot_once(&self, keys: &[&str]) -> std::result::Result<Vec<Entry>, Attempt> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| before_commit("acquiring a connection", e))?;
        read_entries(&mut conn, &self.namespace, keys).await
    }

    /// The keys under `prefix`, the first `limit` of them (`None`: all).
    async fn keys_once(
        &self,
        prefix: &str,
        limit: Option<usize>,
    ) -> std::result::Result<Vec<String>, Attempt> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| before_commit("acquiring a connection", e))?;
        list_keys(&mut conn, &self.namespace, prefix, limit).await
    }

    /// The writer connection, for a write; failing to get it wrote nothing.
    async fn hold_writer(&self) -> std::result::Result<changes::Held<'_>, Attempt> {
        self.writer
            .hold()
            .await
            .map_err(|e| before_commit("opening the writer connection", e))
    }

    /// Announce this client's storage format when it is due (before a
    /// txn or a reclaim): see `coord_backend::reclaim`, "Mixed versions".
    async fn announce(&self) -> Result<()> {
        if !self.announcer.due() {
            return Ok(());
        }
        let sent = std::time::Instant::now();
        retry_busy(&self.options, "announcing the storage format", || async {
            let mut writer = self.hold_writer().await?;
            let result = announce_on(writer.conn(), &self.namespace, &self.announcer).await;
            if result.is_ok() {
                writer.finished();
            }
            result
        })
        .await?;
        self.announcer.announced(sent);
        Ok(())
    }

    async fn reclaim_once(
        &self,
        options: &ReclaimOptions,
    ) -> std::result::Result<Reclaimed, Attempt> {
        let mut writer = self.hold_writer().await?;
        let result = reclaim_on(
            writer.conn(),
            &self.namespace,
            self.announcer.format(),
            options,
        )
        .await;
        if result.is_ok() {
            writer.finished();
        }
        result
    }

    async fn txn_once(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> std::result::Result<TxnOutcome, Attempt> {
        let mut writer = self.hold_writer().await?;
        let (result, clean) = txn_on(writer.conn(), &self.namespace, asserts, mutations).await;
        // After a failed COMMIT or ROLLBACK the connection's transaction
        // state is unknown: it is replaced before the next txn.
        if clean && !matches!(result, Err(Attempt::Failed(_))) {
            writer.finished();
        }
        drop(writer);
        if matches!(&result, Ok(outcome) if outcome.applied) && !mutations.is_empty() {
            self.writer
                .committed(mutations.iter().map(|m| m.key().to_owned()).collect());
        }
        result
    }
}

/// The namespace's required storage format (the row of client `''`), if
/// an announcement wrote it yet.
async fn required_format(
    conn: &mut SqliteConnection,
    namespace: &str,
) -> std::result::Result<Option<i64>, Attempt> {
    sqlx::query_scalar("SELECT format FROM coord_clients WHERE ns = ?1 AND client = ''")
        .bind(namespace)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| before_commit("reading the required format", e))
}

/// One announcement of `announcer`'s format in `namespace` on `conn`: the
/// namespace's required format (written by the first announcement: this
/// format when the namespace held no row, 0 when it did) is checked, the
/// client's row upserted and rows older than the TTL removed.
async fn announce_on(
    conn: &mut SqliteConnection,
    namespace: &str,
    announcer: &Announcer,
) -> std::result::Result<(), Attempt> {
    let now = i64::try_from(floor::now_ms()).unwrap_or(i64::MAX);
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| before_commit("BEGIN IMMEDIATE", e))?;
    let required = required_format(&mut tx, namespace).await?;
    let required = match required {
        Some(required) => required,
        None => {
            let used: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM coord_kv WHERE ns = ?1 \
                 UNION ALL SELECT 1 FROM coord_floor WHERE ns = ?1 LIMIT 1",
            )
            .bind(namespace)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| before_commit("looking for older records", e))?;
            let required = if used.is_some() {
                0
            } else {
                i64::from(floor::STORAGE_FORMAT)
            };
            sqlx::query("INSERT INTO coord_clients VALUES (?1, '', ?2, ?3)")
                .bind(namespace)
                .bind(required)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| before_commit("writing the required format", e))?;
            required
        }
    };
    floor::check_announce(
        announcer.format(),
        u32::try_from(required).unwrap_or(u32::MAX),
    )?;
    sqlx::query(
        "INSERT INTO coord_clients VALUES (?1, ?2, ?3, ?4) ON CONFLICT (ns, client) \
         DO UPDATE SET format = excluded.format, seen_ms = excluded.seen_ms",
    )
    .bind(namespace)
    .bind(announcer.id())
    .bind(i64::from(announcer.format()))
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(|e| before_commit("announcing", e))?;
    sqlx::query("DELETE FROM coord_clients WHERE ns = ?1 AND client <> '' AND seen_ms < ?2")
        .bind(namespace)
        .bind(i64::try_from(floor::recent_since(now as u64)).unwrap_or(0))
        .execute(&mut *tx)
        .await
        .map_err(|e| before_commit("removing old announcements", e))?;
    match tx.commit().await {
        Ok(()) => Ok(()),
        Err(e) if is_busy(&e) => Err(Attempt::Busy(e)),
        // Nothing a reader sees changed: try again later.
        Err(e) => Err(Attempt::Failed(Error::unavailable(
            "sqlite: COMMIT of an announcement failed",
            e,
        ))),
    }
}

/// One attempt of a reclaim on `conn` (see [`Backend::reclaim`]) by a
/// client of storage format `format`.
async fn reclaim_on(
    conn: &mut SqliteConnection,
    namespace: &str,
    format: u32,
    options: &ReclaimOptions,
) -> std::result::Result<Reclaimed, Attempt> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| before_commit("BEGIN IMMEDIATE", e))?;
    // Under the write lock: no client announces or writes until COMMIT.
    let required = required_format(&mut tx, namespace).await?;
    let older: Option<(i64, i64)> = sqlx::query_as(
        "SELECT format, seen_ms FROM coord_clients WHERE ns = ?1 AND client <> '' \
         AND format < ?2 AND seen_ms >= ?3 ORDER BY seen_ms DESC LIMIT 1",
    )
    .bind(namespace)
    .bind(i64::from(format))
    .bind(i64::try_from(floor::recent_since(floor::now_ms())).unwrap_or(0))
    .fetch_optional(&mut *tx)
    .await
    .map_err(|e| before_commit("reading the announcements", e))?;
    let raise = floor::check_reclaim(
        format,
        required.map_or(0, |r| u32::try_from(r).unwrap_or(u32::MAX)),
        older.map(|(f, at)| {
            (
                u32::try_from(f).unwrap_or(0),
                u64::try_from(at).unwrap_or(0),
            )
        }),
        options.older_clients_stopped,
    )?;
    if raise {
        sqlx::query("UPDATE coord_clients SET format = ?2 WHERE ns = ?1 AND client = ''")
            .bind(namespace)
            .bind(i64::from(format))
            .execute(&mut *tx)
            .await
            .map_err(|e| before_commit("raising the required format", e))?;
    }
    let max = options.max_tombstones.max(1);
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let versions: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM coord_kv WHERE ns = ?1 AND value IS NULL AND key IN \
         (SELECT key FROM coord_kv INDEXED BY coord_kv_dead \
           WHERE ns = ?1 AND value IS NULL ORDER BY key LIMIT ?2) \
         RETURNING version",
    )
    .bind(namespace)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await
    .map_err(|e| before_commit("deleting tombstones", e))?;
    if let Some(highest) = versions.iter().copied().max() {
        sqlx::query(
            "INSERT INTO coord_floor (ns, floor) VALUES (?1, ?2) \
             ON CONFLICT (ns) DO UPDATE SET floor = max(floor, excluded.floor)",
        )
        .bind(namespace)
        .bind(highest)
        .execute(&mut *tx)
        .await
        .map_err(|e| before_commit("raising the floor", e))?;
    }
    let more: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM coord_kv INDEXED BY coord_kv_dead WHERE ns = ?1 AND value IS NULL LIMIT 1",
    )
    .bind(namespace)
    .fetch_optional(&mut *tx)
    .await
    .map_err(|e| before_commit("looking for more tombstones", e))?;
    match tx.commit().await {
        Ok(()) => Ok(Reclaimed::new(versions.len() as u64, more.is_some())),
        Err(e) if is_busy(&e) => Err(Attempt::Busy(e)),
        // Reclaiming changes nothing a reader can see: a failed COMMIT
        // is an error to retry later, never a wrong answer.
        Err(e) => Err(Attempt::Failed(Error::unavailable(
            "sqlite: COMMIT of a reclaim failed",
            e,
        ))),
    }
}

/// The statements of one txn on `conn`, which must already be inside a
/// write-capable transaction (shared by [`SqliteBackend`], which wraps them
/// in its own `BEGIN IMMEDIATE` … `COMMIT`, and [`InTransaction`], where
/// the caller's transaction does): one `SELECT` of the asserted keys, every
/// assert checked, then, when they all hold, one multi-row upsert
/// `RETURNING` the versions it stored. A rejected txn wrote nothing.
async fn apply_txn(
    conn: &mut SqliteConnection,
    namespace: &str,
    asserts: &[Assert],
    mutations: &[Mutation],
) -> std::result::Result<TxnOutcome, Attempt> {
    let asserted = distinct_keys(asserts.iter().map(|a| a.key.as_str()));
    let current = read_entries(&mut *conn, namespace, &asserted).await?;
    let holds = asserts.iter().all(|a| {
        current
            .iter()
            .find(|e| e.key == a.key)
            .is_some_and(|e| e.version == a.version)
    });
    if !holds {
        return Ok(TxnOutcome::rejected(current));
    }
    if mutations.is_empty() {
        return Ok(TxnOutcome::applied_at(Vec::new()));
    }
    let rows = (0..mutations.len())
        .map(|i| {
            format!(
                "(?1, ?{}, (SELECT n FROM floor), ?{})",
                2 + 2 * i,
                3 + 2 * i
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    // A key without a row starts at the namespace's floor + 1 (see
    // `coord_backend::reclaim`). Inside a caller's transaction that is rolled
    // back, the versions handed out here are handed out again by a later
    // txn: that is safe, because no one outside the transaction could read
    // them (SQLite shows other connections only committed rows), so no
    // version is ever observed twice by anyone who could compare them.
    let sql = format!(
        "WITH floor(n) AS (SELECT coalesce(max(floor), 0) + 1 FROM coord_floor WHERE ns = ?1) \
         INSERT INTO coord_kv (ns, key, version, value) VALUES {rows} \
         ON CONFLICT (ns, key) DO UPDATE SET version = version + 1, value = excluded.value \
         RETURNING key, version, value IS NOT NULL"
    );
    // Only numbered placeholders are formatted into the SQL; keys and values are bound.
    let mut query = sqlx::query_as(AssertSqlSafe(sql)).bind(namespace);
    for mutation in mutations {
        query = match mutation {
            Mutation::Put { key, value } => query.bind(key).bind(Some(value.as_slice())),
            Mutation::Delete { key } => query.bind(key).bind(None::<&[u8]>),
        };
    }
    // The version each row holds after the upsert (its floor + 1 when
    // created, one past its tombstone's): reported for the puts.
    let rows: Vec<(String, i64, bool)> = query
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| before_commit("writing", e))?;
    // A row coord did not write (a version not positive) reports nothing.
    Ok(TxnOutcome::applied_at(
        rows.into_iter()
            .filter(|(_, version, live)| *live && *version > 0)
            .map(|(key, version, _)| (key, Version(version.unsigned_abs())))
            .collect(),
    ))
}

/// One attempt of a txn on `conn` in a transaction of its own; also says
/// whether `conn` was left outside any transaction (a failed ROLLBACK may
/// leave it unknown).
async fn txn_on(
    conn: &mut SqliteConnection,
    namespace: &str,
    asserts: &[Assert],
    mutations: &[Mutation],
) -> (std::result::Result<TxnOutcome, Attempt>, bool) {
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) => return (Err(before_commit("BEGIN IMMEDIATE", e)), true),
    };
    let outcome = match apply_txn(&mut tx, namespace, asserts, mutations).await {
        Ok(outcome) => outcome,
        Err(attempt) => return (Err(attempt), true),
    };
    if !outcome.applied {
        // Nothing was written, so the answer stands even if ROLLBACK fails.
        let clean = tx.rollback().await.is_ok();
        return (Ok(outcome), clean);
    }
    match tx.commit().await {
        Ok(()) => (Ok(outcome), true),
        // SQLite keeps the txn open and uncommitted after a busy COMMIT;
        // dropping it rolled it back, so retrying is safe.
        Err(e) if is_busy(&e) => (Err(Attempt::Busy(e)), true),
        Err(e) => (
            Err(Attempt::Failed(Error::indeterminate(
                "sqlite: COMMIT failed",
                e,
            ))),
            false,
        ),
    }
}

/// Run `attempt` until it is not busy, at most `busy_retries + 1` times,
/// sleeping a jittered, growing delay in between.
async fn retry_busy<T, F, Fut>(options: &SqliteOptions, what: &str, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, Attempt>>,
{
    let mut tries = 0u32;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(Attempt::Failed(error)) => return Err(error),
            Err(Attempt::Busy(error)) => {
                tries += 1;
                if tries > options.busy_retries {
                    return Err(Error::unavailable(
                        format!("sqlite: file stayed busy while {what} ({tries} attempts)"),
                        error,
                    ));
                }
                let ceiling = Duration::from_millis(2u64 << tries.min(6)); // 4 ms .. 128 ms
                let jitter = rand::random::<f64>() * 0.5 + 0.5;
                tracing::debug!(%error, tries, "sqlite busy; retrying");
                tokio::time::sleep(ceiling.mul_f64(jitter)).await;
            }
        }
    }
}

fn parse_url(url: &StoreUrl) -> Result<(PathBuf, SqliteOptions)> {
    if url.scheme() != "sqlite" {
        return Err(Error::Config(format!(
            "coord-sqlite cannot open a {}:// URL",
            url.scheme()
        )));
    }
    let path = url.body();
    if path.is_empty() || path == ":memory:" {
        return Err(Error::Config(format!(
            "sqlite URL {:?} names no file (sqlite://PATH; for an in-process store use memory://)",
            url.without_namespace()
        )));
    }
    let mut options = SqliteOptions::default();
    let query = url
        .without_namespace()
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("");
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = || Error::Config(format!("sqlite URL parameter {name}={value:?} is invalid"));
        match name {
            "durability" => {
                options.durability = match value.to_ascii_lowercase().as_str() {
                    "full" => Durability::Full,
                    "normal" => Durability::Normal,
                    _ => return Err(bad()),
                }
            }
            "max_connections" => {
                options.max_connections = value.parse().ok().filter(|n| *n > 0).ok_or_else(bad)?
            }
            "busy_timeout_ms" => {
                options.busy_timeout = Duration::from_millis(value.parse().map_err(|_| bad())?)
            }
            _ => {
                return Err(Error::Config(format!(
                    "unknown sqlite URL parameter {name:?} \
                     (known: namespace, durability, max_connections, busy_timeout_ms)"
                )))
            }
        }
    }
    Ok((PathBuf::from(path), options))
}

#[async_trait]
impl Backend for SqliteBackend {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        self.options.limits
    }

    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        retry_busy(&self.options, "reading a snapshot", || {
            self.snapshot_once(keys)
        })
        .await
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        self.announce().await?;
        retry_busy(&self.options, "running a txn", || {
            self.txn_once(asserts, mutations)
        })
        .await
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        retry_busy(&self.options, "listing keys", || {
            self.keys_once(prefix, None)
        })
        .await
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        retry_busy(&self.options, "listing keys", || {
            self.keys_once(prefix, Some(limit))
        })
        .await
    }

    /// One write transaction on the writer connection: the first tombstones
    /// (read through `coord_kv_dead`) are deleted and the floor raised to
    /// their highest version before `COMMIT`, so no txn sees one without
    /// the other.
    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.announce().await?;
        retry_busy(&self.options, "reclaiming tombstones", || {
            self.reclaim_once(options)
        })
        .await
    }
}

/// Exact keys for this backend's own commits, a wake-up for every watch on
/// any other connection's commit to the file (seen by polling `PRAGMA
/// data_version` on the writer connection), see `changes.rs`.
#[async_trait]
impl Changes for SqliteBackend {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        validate_prefix(prefix, &self.options.limits)?;
        self.writer.watch(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_is_the_next_byte_string() {
        assert_eq!(successor(""), None);
        assert_eq!(successor("a%"), Some(b"a&".to_vec()));
        // A multi-byte last character: the result is not UTF-8, by design.
        assert_eq!(successor("é"), Some(vec![0xc3, 0xaa]));
        assert_eq!(successor("\u{7f}"), Some(vec![0x80]));
    }

    #[test]
    fn parses_urls() {
        let url = StoreUrl::parse("sqlite:///abs/c.db?namespace=x&durability=normal").unwrap();
        let (path, options) = parse_url(&url).unwrap();
        assert_eq!(path, PathBuf::from("/abs/c.db"));
        assert_eq!(options.durability, Durability::Normal);
        let (path, _) = parse_url(&StoreUrl::parse("sqlite://rel/c.db").unwrap()).unwrap();
        assert_eq!(path, PathBuf::from("rel/c.db"));
        for bad in [
            "sqlite://",
            "sqlite://:memory:",
            "sqlite://c.db?max_connections=0",
            "sqlite://c.db?durability=off",
            "sqlite://c.db?cache=shared",
            "redis://c.db",
        ] {
            assert!(
                matches!(
                    parse_url(&StoreUrl::parse(bad).unwrap()),
                    Err(Error::Config(_))
                ),
                "{bad} was accepted"
            );
        }
    }
}
