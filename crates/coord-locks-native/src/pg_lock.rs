//! [`PgAdvisoryLock`]: PostgreSQL session advisory locks with a fence table.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use coord_adapters::lock::{
    async_trait, observe_release, observe_renew, observe_try_lock, validate_lock_input, Lock,
    LockError, LockHandle, LostReason,
};
use coord_adapters::mint_token;
use coord_backend::{Error, StoreUrl};
use coord_postgres::Servers;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::Mutex;

use crate::common::{default_prefix, observed_lock, require_scheme};

/// Options of a [`PgAdvisoryLock`].
///
/// ```
/// use std::time::Duration;
/// use coord_locks_native::PgAdvisoryOptions;
///
/// let options = PgAdvisoryOptions::default()
///     .with_key_prefix("")              // hash exactly the caller's key
///     .with_fence_table("billing_lock_fences")
///     .with_call_timeout(Duration::from_secs(2))
///     .with_max_idle(4);                // keep at most 4 idle sessions
/// assert_eq!(options.fence_table, "billing_lock_fences");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PgAdvisoryOptions {
    /// Prefix added to every key before it is hashed and before it names its
    /// fence row. `None` (the default): `<namespace>:lock:`, with the
    /// namespace of the URL (`?namespace=`, default `coord`) and every `:`
    /// in it written as `{}`, so that the name tells namespace and key apart
    /// (see [`PgAdvisoryLock::lock_name`]). `Some("")` locks `hashtext(key)`
    /// exactly, as other advisory-lock libraries do; with an explicit prefix,
    /// keeping names of different lock spaces apart is the caller's job.
    pub key_prefix: Option<String>,
    /// The table of fence counters (default `coord_lock_fences`, with its
    /// unlogged companion `coord_lock_fences_last`): lower-case letters,
    /// digits and `_`, at most 58 of them (room for `_last`), optionally
    /// `schema.table`.
    pub fence_table: String,
    /// Create the fence tables when they are missing (default true). Turn
    /// off when the application role may not run DDL; then create them
    /// yourself:
    /// `CREATE TABLE coord_lock_fences (name text PRIMARY KEY, fence bigint NOT NULL)` and
    /// `CREATE UNLOGGED TABLE coord_lock_fences_last (name text PRIMARY KEY, fence bigint NOT NULL)`
    /// (`<fence_table>_last`). Without the second one every grant pays a
    /// WAL flush (see "Fences" in [`PgAdvisoryLock`]).
    pub create_table: bool,
    /// Longest wait for a new connection (default 5 s).
    pub connect_timeout: Duration,
    /// Longest wait for each statement (acquire, ping, unlock; default 5 s).
    /// A call that times out drops its connection: the session ends and
    /// PostgreSQL frees its lock once it notices.
    pub call_timeout: Duration,
    /// Most idle sessions kept for later acquisitions (default 8; 0: a
    /// connection per acquisition, closed at release). Only sessions that
    /// hold no lock are kept: one whose `try_lock` was refused, or whose
    /// unlock answered that it freed the lock. Held locks pin their own
    /// session and do not count against this bound.
    pub max_idle: usize,
}

impl Default for PgAdvisoryOptions {
    fn default() -> Self {
        PgAdvisoryOptions {
            key_prefix: None,
            fence_table: "coord_lock_fences".to_owned(),
            create_table: true,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(5),
            max_idle: 8,
        }
    }
}

coord_backend::setters! {
    PgAdvisoryOptions {
        /// Prefix every key with `prefix` (`""`: hash the key as given).
        with_key_prefix(prefix: impl Into<String>) => key_prefix = Some(prefix.into());
        /// Keep fence counters in `table`.
        with_fence_table(table: impl Into<String>) => fence_table = table.into();
        /// Whether to create the fence table when it is missing.
        with_create_table(create: bool) => create_table = create;
        /// Wait at most `timeout` for a new connection.
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// Wait at most `timeout` for each statement.
        with_call_timeout(timeout: Duration) => call_timeout = timeout;
        /// Keep at most `max_idle` idle sessions for later acquisitions (0: none).
        with_max_idle(max_idle: usize) => max_idle = max_idle;
    }
}

/// PostgreSQL session advisory locks, one session per held lock, with
/// fencing tokens from a counter table; sessions are reused across
/// acquisitions.
///
/// | call | what runs | round trips |
/// | --- | --- | --- |
/// | [`try_lock`](Lock::try_lock) | take an idle session (or open a connection when none is idle); one statement: `pg_try_advisory_lock(hashtext(name))` and, only if granted, the next fence (see "Fences": no WAL flush but once per 1024 grants of a name); granted → the session is pinned to the lock; refused → the session goes back to the idle pool | 1 on an idle session (the statement is prepared once per session); a connection set-up + 2 on a new one |
/// | [`renew`](Lock::renew) | `SELECT 1` on the lock's session | 1 |
/// | [`release`](Lock::release) | `pg_advisory_unlock(hashtext(name))` on the lock's session; when it answers true the session goes back to the idle pool | 1 |
///
/// # The idle pool
///
/// Session advisory locks belong to the session, so the pool keeps only
/// sessions that hold nothing: a session whose `try_lock` was refused (the
/// statement took nothing) or whose unlock answered `true` (it freed the one
/// lock it held). A session that errored, timed out, answered an unlock with
/// `false`, or whose call was cancelled is dropped, never pooled: dropping the
/// connection ends the session, and PostgreSQL frees whatever it may still
/// hold. At most [`PgAdvisoryOptions::max_idle`] sessions are kept (more are
/// closed); an idle session that died meanwhile (server restart,
/// `idle_session_timeout`, `pg_terminate_backend`) is noticed by the next
/// `try_lock` that takes it, which drops it and retries once on a new
/// connection (the dead session held nothing, and ended with its connection).
///
/// where `name` is the key with the prefix (default `<namespace>:lock:`, `:` in the
/// namespace written `{}`: see [`PgAdvisoryLock::lock_name`]).
///
/// # Boundary (read before choosing it)
///
/// - **No TTL.** A lock is held until it is released or its session ends
///   (the connection closes, the server restarts or terminates the backend).
///   The TTL given to `try_lock` only paces [`LockGuard`](coord_adapters::lock::LockGuard)
///   renewals; [`LockHandle::expires_at`] is that nominal `now + ttl`, not an
///   expiry anyone enforces. A holder that pauses for an hour still holds
///   the lock when it wakes, as long as its connection survived. A holder
///   whose *host* dies keeps the lock until the server notices the dead
///   TCP connection (TCP keepalive, `tcp_keepalives_*`,
///   `idle_session_timeout`, or a `pg_terminate_backend` by an operator).
/// - **Renew is a liveness ping**, nothing is extended: it proves the
///   session (and so the lock) is still alive. A dead connection → [`LockError::Lost`].
/// - **One connection per held lock**, kept open until release, plus up to
///   `max_idle` idle ones. Tens of concurrently held locks, not thousands:
///   each is a server backend process and counts against `max_connections`.
///   A `try_lock` opens a connection only when no idle session is left.
/// - **Hash collisions**: the lock is on `hashtext(name)`, a 32-bit hash.
///   Two different names can share a lock (≈1 % chance that some pair
///   collides among 10 000 names in use). A collision only makes the two
///   keys exclude each other (a liveness cost, never two holders of one
///   key); fences are per name (the fence table is keyed by the full name),
///   so they stay correct. Everything else that takes advisory locks with a
///   single `bigint` key on the same database shares this key space.
/// - **Fences live in two tables**, one row per name ever locked in each,
///   written by the statement that takes the lock, and only when it was
///   granted (see "Fences" below). Deleting a name's row of
///   `coord_lock_fences` resets its fence.
/// - **Handles belong to the client that made them**: the connection is in
///   this value's map, keyed by the handle's token. Another process (or
///   another `PgAdvisoryLock`) cannot renew or release it. Dropping the
///   `PgAdvisoryLock` drops its connections (held and idle), which frees
///   their locks.
/// - Strongly consistent with the rest of the database: PostgreSQL is the
///   single authority; there is no replication to fail over (a promoted
///   replica has no advisory locks: every holder's connection breaks and
///   its next renew reports the loss). A multi-host URL
///   (`postgres://user@h1,h2/db`, libpq's form) is read as the store reads
///   it (`coord_postgres::servers`): each new session goes to the host the
///   last one went to, else the first writable one of the list, so the
///   first grant after a promotion is made on the new primary.
///
/// # Fences
///
/// A durable `+1` per grant would make every `try_lock` wait for a WAL
/// flush, which costs more than the lock itself. Instead the fence table
/// (`coord_lock_fences`) holds a durable **ceiling** per name, and the
/// UNLOGGED table `coord_lock_fences_last` the **last fence granted**:
///
/// - a grant takes `last + 1` while that stays at or below the ceiling: a
///   write to the unlogged table only, with no WAL flush at commit;
/// - otherwise (the block is used up, the name is new, or its unlogged row
///   is gone) it raises the ceiling by 1024 in the same statement, a
///   flushed commit, and takes the first fence of that new block.
///
/// Every fence granted is at most the ceiling, and every new block starts
/// above it. PostgreSQL empties unlogged tables in crash recovery, and a
/// promoted replica has them empty too; the next grant of every name then
/// starts a new block above its ceiling: fences keep increasing across a
/// crash (skipping at most a block), never repeat. The ceiling is as
/// durable as the database: with asynchronous replication its last raise
/// can be lost in a failover, and fences can then repeat (use synchronous
/// replication if they must never). A fence table from before the
/// unlogged one existed keeps working: its fence becomes the ceiling, and
/// the next grant starts the block above it. Without the unlogged table
/// (made by hand, `create_table` off) every grant is a durable `+1`.
///
/// ```no_run
/// use std::time::Duration;
/// use coord_adapters::lock::Lock;
/// use coord_locks_native::PgAdvisoryLock;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = coord_backend::StoreUrl::parse("postgres://postgres@127.0.0.1:5432/postgres")?;
/// let lock = PgAdvisoryLock::connect(&url).await?;
/// if let Some(handle) = lock.try_lock("nightly-report", Duration::from_secs(30)).await? {
///     lock.renew(&handle).await?; // a ping: is the session (and the lock) alive?
///     lock.release(handle).await?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct PgAdvisoryLock {
    /// Where sessions are opened: the URL's host, or the first writable
    /// one of its hosts (see `coord_postgres::servers`).
    servers: Arc<Servers>,
    prefix: String,
    /// Validated when built (the table name is the only non-literal part).
    acquire_sql: Arc<str>,
    options: PgAdvisoryOptions,
    /// The sessions holding locks, by handle token.
    held: StdMutex<HashMap<String, Arc<Held>>>,
    /// Sessions holding no lock, most recently used last (see "The idle pool").
    idle: StdMutex<Vec<PgConnection>>,
}

/// One held lock: its session, taken out (`None`) by the release.
struct Held {
    name: String,
    fence: u64,
    conn: Mutex<Option<PgConnection>>,
}

impl fmt::Debug for PgAdvisoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgAdvisoryLock")
            .field("servers", &self.servers)
            .field("prefix", &self.prefix)
            .field("fence_table", &self.options.fence_table)
            .field("held", &self.held_count())
            .field("idle", &self.idle_count())
            .finish_non_exhaustive()
    }
}

impl PgAdvisoryLock {
    /// Connect to `url` (`postgres://user[:password]@host:port/db[?namespace=NS]`)
    /// with [`PgAdvisoryOptions::default`]: checks that the server answers
    /// and creates the fence table when missing.
    pub async fn connect(url: &StoreUrl) -> Result<Self, Error> {
        Self::connect_with(url, PgAdvisoryOptions::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &StoreUrl, options: PgAdvisoryOptions) -> Result<Self, Error> {
        require_scheme(
            url,
            &["postgres", "postgresql"],
            "PgAdvisoryLock needs a postgres:// URL",
        )?;
        // Fences assume READ COMMITTED (see `last_fence_acquire_sql`): a
        // startup parameter outranks the defaults of the database, the role
        // and the server, at no extra round trip.
        let servers = Servers::parse(url.without_namespace(), |o| {
            read_committed(o.application_name("coord-locks-native"))
        })?;
        let prefix = options
            .key_prefix
            .clone()
            .unwrap_or_else(|| default_prefix(url.namespace()));
        Self::new(servers, prefix, options).await
    }

    /// A lock over explicit connection options (every session is opened
    /// with them), prefixing keys with `prefix`.
    pub async fn with_connect_options(
        connect: PgConnectOptions,
        prefix: impl Into<String>,
        options: PgAdvisoryOptions,
    ) -> Result<Self, Error> {
        Self::new(
            Servers::single(read_committed(connect)),
            prefix.into(),
            options,
        )
        .await
    }

    async fn new(
        servers: Servers,
        prefix: String,
        options: PgAdvisoryOptions,
    ) -> Result<Self, Error> {
        if prefix.contains('\0') {
            return Err(Error::Config("lock key prefix contains a NUL byte".into()));
        }
        let table = &options.fence_table;
        if !valid_table_name(table) {
            return Err(Error::Config(format!(
                "fence table {table:?}: use lower-case letters, digits and '_' (optionally schema.table)"
            )));
        }
        let mut lock = PgAdvisoryLock {
            servers: Arc::new(servers),
            prefix,
            acquire_sql: Arc::from(""),
            options,
            held: StdMutex::new(HashMap::new()),
            idle: StdMutex::new(Vec::new()),
        };
        // Proves the server answers (and creates the tables) now, not at the first lock.
        let mut conn = lock.open().await?;
        if lock
            .servers
            .shares_sessions(&mut conn, lock.options.connect_timeout)
            .await?
        {
            return Err(Error::Config(format!(
                "PostgreSQL at {}: two client connections shared one server session, so a \
                 pooler (PgBouncer) runs transaction or statement pooling, and a session \
                 advisory lock would be held by whichever client the session serves next: \
                 set pool_mode = session for this database in pgbouncer.ini, or connect to \
                 PostgreSQL directly",
                lock.servers.current_label()
            )));
        }
        let fast = if lock.options.create_table {
            lock.create_tables(&mut conn).await?;
            true
        } else {
            lock.has_last_table(&mut conn).await?
        };
        let table = &lock.options.fence_table;
        lock.acquire_sql = if fast {
            last_fence_acquire_sql(table)
        } else {
            durable_acquire_sql(table)
        }
        .into();
        lock.park(conn).await;
        Ok(lock)
    }

    /// Whether the unlogged table of last grants exists (asked only when
    /// this client does not create its tables: a schema made by hand before
    /// that table existed keeps the durable-per-grant statement).
    async fn has_last_table(&self, conn: &mut PgConnection) -> Result<bool, Error> {
        let last = last_table(&self.options.fence_table);
        let answer = self
            .timed(
                sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
                    .bind(&last)
                    .fetch_one(&mut *conn),
            )
            .await;
        setup_answer(&format!("looking up table {last}"), answer)
    }

    async fn create_tables(&self, conn: &mut PgConnection) -> Result<(), Error> {
        let table = &self.options.fence_table;
        let last = last_table(table);
        for sql in [
            format!("CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY, fence bigint NOT NULL)"),
            // UNLOGGED: its writes wait for no WAL flush, and crash recovery
            // empties it (see "Fences" in the type's docs for why that is safe).
            format!("CREATE UNLOGGED TABLE IF NOT EXISTS {last} (name text PRIMARY KEY, fence bigint NOT NULL)"),
        ] {
            match self
                .timed(sqlx::query(AssertSqlSafe(sql)).execute(&mut *conn))
                .await
            {
                // Two clients creating it at once: the loser sees the winner's
                // table (42P07) or its type row (23505). Either way it exists.
                Ok(Err(sqlx::Error::Database(db)))
                    if matches!(db.code().as_deref(), Some("42P07" | "23505")) => {}
                answer => {
                    setup_answer(
                        &format!("creating the fence tables {table} and {last}"),
                        answer,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// How many locks this client holds (= how many sessions they pin).
    pub fn held_count(&self) -> usize {
        self.held.lock().expect("held map poisoned").len()
    }

    /// How many idle sessions (holding no lock) this client keeps for later
    /// acquisitions; at most [`PgAdvisoryOptions::max_idle`].
    pub fn idle_count(&self) -> usize {
        self.idle.lock().expect("idle pool poisoned").len()
    }

    /// Put a session that holds no lock back into the idle pool, or close it
    /// when the pool is full.
    async fn park(&self, conn: PgConnection) {
        let surplus = {
            let mut idle = self.idle.lock().expect("idle pool poisoned");
            if idle.len() < self.options.max_idle {
                idle.push(conn);
                None
            } else {
                Some(conn)
            }
        };
        if let Some(conn) = surplus {
            let _ = self.timed(conn.close()).await;
        }
    }

    /// The most recently parked idle session, if any.
    fn unpark(&self) -> Option<PgConnection> {
        self.idle.lock().expect("idle pool poisoned").pop()
    }

    /// The name a key is hashed as (and its fence row is keyed by).
    ///
    /// With the default prefix: `<namespace>:lock:<key>`, where every `:` of
    /// the namespace is written `{}`. Namespaces never contain `{` or `}`
    /// (see `coord_backend::validate_namespace`), so the escaped namespace is
    /// everything before the first `:` and decodes back to one namespace:
    /// two (namespace, key) pairs never share a name (namespace `a` with key
    /// `b:lock:c` is `a:lock:b:lock:c`, namespace `a:lock:b` with key `c` is
    /// `a{}lock{}b:lock:c`).
    ///
    /// Existing data: names of namespaces without `:` are unchanged. Earlier
    /// versions named a namespace *with* `:` unescaped; such a namespace now
    /// takes other advisory locks and other fence rows, whose fences start
    /// again at 1. Do not run old and new clients on such a namespace at
    /// once (they would not exclude each other), and if fences must keep
    /// increasing across the upgrade, copy each old row's fence to its new
    /// name (`UPDATE`/`INSERT` into the fence table) before the first lock.
    pub fn lock_name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// A new session: to the server the last one went to, else the
    /// URL's others in order (skipping standbys when the URL asks for a
    /// writable session), so a failover is followed by the next grant.
    async fn open(&self) -> Result<PgConnection, Error> {
        self.servers.connect(self.options.connect_timeout).await
    }

    async fn timed<F: std::future::Future>(
        &self,
        call: F,
    ) -> Result<F::Output, tokio::time::error::Elapsed> {
        tokio::time::timeout(self.options.call_timeout, call).await
    }

    /// The held lock of `handle`, if this client holds it.
    fn find(&self, handle: &LockHandle) -> Option<Arc<Held>> {
        let held = self.held.lock().expect("held map poisoned");
        held.get(handle.token())
            .filter(|h| h.name == self.lock_name(handle.key()) && h.fence == handle.fence())
            .cloned()
    }

    fn forget(&self, handle: &LockHandle) -> Option<Arc<Held>> {
        let mut held = self.held.lock().expect("held map poisoned");
        let matches = held
            .get(handle.token())
            .is_some_and(|h| h.name == self.lock_name(handle.key()) && h.fence == handle.fence());
        if matches {
            held.remove(handle.token())
        } else {
            None
        }
    }
}

/// The answer of a set-up statement (`what`) run under `timed`: a failure
/// or a timeout leaves the lock unusable, `Unavailable`.
fn setup_answer<T>(
    what: &str,
    answer: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
) -> Result<T, Error> {
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Error::unavailable(what, e)),
        Err(_) => Err(Error::Unavailable {
            message: format!("{what}: timed out"),
            source: None,
        }),
    }
}

/// How many fences one durable write reserves (see "Fences" in
/// [`PgAdvisoryLock`]'s docs): a crash of the server skips at most this many.
const FENCE_BLOCK: i64 = 1024;

/// The unlogged table of the last fence granted per name, beside `fence_table`.
/// Every session at READ COMMITTED (see `last_fence_acquire_sql`).
fn read_committed(options: PgConnectOptions) -> PgConnectOptions {
    options.options([("default_transaction_isolation", "read committed")])
}

fn last_table(fence_table: &str) -> String {
    format!("{fence_table}_last")
}

/// One statement: the advisory lock, then (only when it was granted) the
/// next fence. The lock is taken first, in its own CTE, which PostgreSQL runs
/// once and never inlines (it calls a volatile function); the rest runs only
/// for the row it produces when the lock was granted. Zero rows back =
/// refused.
///
/// Hot path (`bumped`): the last grant of `name` in the unlogged table, +1,
/// while it stays below the durable ceiling in `fence_table`: a write to an
/// unlogged table only, so the commit waits for no WAL flush. When the
/// ceiling is reached, or the unlogged row is missing (first lock of a name,
/// or a crash emptied the table), `reserved` raises the durable ceiling by
/// [`FENCE_BLOCK`] (a WAL-flushed commit) and hands out the first fence of
/// the new block, which `seeded` records as the last grant. Every fence
/// handed out is at most the durable ceiling, and a new block starts above
/// it, so fences increase across crashes of the server. At READ COMMITTED
/// (forced on every session) a row another holder changed after this
/// statement's snapshot is re-read at its newest version before the update:
/// the worst a stale snapshot does is reserve a block too early, which skips
/// fences but never repeats one.
fn last_fence_acquire_sql(table: &str) -> String {
    let last = last_table(table);
    format!(
        "WITH granted AS MATERIALIZED (SELECT pg_try_advisory_lock(hashtext($1)) AS ok), \
         bumped AS (UPDATE {last} AS l SET fence = l.fence + 1 \
           FROM granted, {table} AS f \
           WHERE granted.ok AND l.name = $1 AND f.name = $1 AND l.fence < f.fence \
           RETURNING l.fence), \
         reserved AS (INSERT INTO {table} AS f (name, fence) \
           SELECT $1, {FENCE_BLOCK} FROM granted \
           WHERE granted.ok AND NOT EXISTS (SELECT 1 FROM bumped) \
           ON CONFLICT (name) DO UPDATE SET fence = f.fence + {FENCE_BLOCK} \
           RETURNING f.fence - {FENCE_BLOCK} + 1 AS fence), \
         seeded AS (INSERT INTO {last} AS l (name, fence) SELECT $1, fence FROM reserved \
           ON CONFLICT (name) DO UPDATE SET fence = EXCLUDED.fence \
           RETURNING l.fence) \
         SELECT fence FROM bumped UNION ALL SELECT fence FROM seeded"
    )
}

/// The statement for a fence table without its unlogged companion (a schema
/// created by hand before it existed): every grant is a durable `+1`.
fn durable_acquire_sql(table: &str) -> String {
    format!(
        "WITH granted AS MATERIALIZED (SELECT pg_try_advisory_lock(hashtext($1)) AS ok) \
         INSERT INTO {table} AS f (name, fence) \
         SELECT $1, 1 FROM granted WHERE granted.ok \
         ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 \
         RETURNING f.fence"
    )
}

fn valid_table_name(name: &str) -> bool {
    let part = |p: &str, longest: usize| {
        !p.is_empty()
            && p.len() <= longest
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    // The table leaves room for the `_last` of its unlogged companion
    // within PostgreSQL's 63-byte identifiers.
    let table = 63 - "_last".len();
    match name.split_once('.') {
        Some((schema, name)) => part(schema, 63) && part(name, table),
        None => part(name, table),
    }
}

/// Whether `error` says the session is gone: the connection broke, or the
/// server ended the session (SQLSTATE `57P..`: `pg_terminate_backend`,
/// shutdown, `idle_session_timeout`; class 08, connection exception). Not
/// `57014` (a cancelled statement): its session lives on.
fn session_died(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

/// An error of a statement already sent on a lock's connection.
fn after_sending(what: &str, name: &str, error: sqlx::Error) -> Error {
    match error {
        // The server answered with an error: the statement did not complete.
        sqlx::Error::Database(db) => Error::unavailable(format!("{what} of lock {name:?}"), db),
        other => Error::indeterminate(
            format!("{what} of lock {name:?}: connection lost (the connection is dropped, which frees any lock it held)"),
            other,
        ),
    }
}

/// The lock operations, on valid input: the [`Lock`] impl below checks it
/// and wraps them in spans and metrics.
/// The nominal `now + ttl` of a handle, saturating (a TTL of
/// `Duration::MAX` ends ~30 years from now).
fn nominal_expiry(ttl: Duration) -> SystemTime {
    SystemTime::now() + ttl.min(coord_adapters::wake::FOREVER)
}

impl PgAdvisoryLock {
    async fn try_lock_inner(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        let name = self.lock_name(key);
        let sent = tokio::time::Instant::now();
        let (conn, answer) = match self.unpark() {
            Some(mut conn) => {
                let answer = self.acquire_on(&mut conn, &name).await;
                if matches!(&answer, Ok(Err(e)) if session_died(e)) {
                    // The idle session died while parked (restart, idle
                    // timeout, terminated): it held nothing, and whatever
                    // this statement might have taken ended with it.
                    tracing::debug!(key, "idle advisory-lock session was dead; reconnecting");
                    drop(conn);
                    let mut conn = self.open().await?;
                    let answer = self.acquire_on(&mut conn, &name).await;
                    (conn, answer)
                } else {
                    (conn, answer)
                }
            }
            None => {
                let mut conn = self.open().await?;
                let answer = self.acquire_on(&mut conn, &name).await;
                (conn, answer)
            }
        };
        let fence = match answer {
            Ok(Ok(Some(fence))) if fence > 0 => fence as u64,
            Ok(Ok(None)) => {
                // Refused: the statement took nothing, so the session holds
                // nothing and may serve the next acquisition.
                self.park(conn).await;
                return Ok(None);
            }
            // Any failure: drop the connection, so a lock the statement may
            // have taken dies with its session (session locks ignore rollbacks).
            Ok(Ok(Some(other))) => {
                drop(conn);
                return Err(LockError::Store(Error::malformed(
                    name,
                    format!("fence row holds {other}"),
                )));
            }
            Ok(Err(e)) => {
                drop(conn);
                return Err(LockError::Store(after_sending("acquire", &name, e)));
            }
            Err(_) => {
                drop(conn);
                return Err(LockError::Store(Error::Indeterminate {
                    message: format!(
                        "acquire of lock {name:?} timed out after {:?} (connection dropped)",
                        self.options.call_timeout
                    ),
                    source: None,
                }));
            }
        };
        let token = mint_token();
        let held = Arc::new(Held {
            name,
            fence,
            conn: Mutex::new(Some(conn)),
        });
        self.held
            .lock()
            .expect("held map poisoned")
            .insert(token.clone(), held);
        Ok(Some(
            // No TTL is enforced, so any is fine, Duration::MAX too ("until released").
            LockHandle::new(key, token, fence, ttl, nominal_expiry(ttl)).requested_at(sent),
        ))
    }

    /// The acquire statement on `conn`: `Some(fence)` when granted.
    async fn acquire_on(
        &self,
        conn: &mut PgConnection,
        name: &str,
    ) -> Result<Result<Option<i64>, sqlx::Error>, tokio::time::error::Elapsed> {
        self.timed(
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.acquire_sql.clone()))
                .bind(name)
                .fetch_optional(conn),
        )
        .await
    }

    async fn renew_inner(&self, handle: &LockHandle) -> Result<(), LockError> {
        let Some(held) = self.find(handle) else {
            return Err(LockError::lost(handle.key(), LostReason::NotHeld));
        };
        let mut slot = held.conn.lock().await;
        let Some(conn) = slot.as_mut() else {
            // Released while this renewal waited for the connection.
            return Err(LockError::lost(handle.key(), LostReason::NotHeld));
        };
        match self
            .timed(sqlx::query("SELECT 1").execute(&mut *conn))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            failed => {
                // The session may be gone (and the lock with it) or unreachable:
                // either way this handle can no longer vouch for the lock.
                // Dropping the connection ends the session, so a lock that
                // survived is freed rather than orphaned.
                let detail = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", self.options.call_timeout),
                };
                tracing::debug!(key = handle.key(), %detail, "advisory lock connection failed its ping");
                slot.take();
                drop(slot);
                self.forget(handle);
                Err(LockError::lost(handle.key(), LostReason::NotHeld))
            }
        }
    }

    async fn release_inner(&self, handle: LockHandle) -> Result<(), LockError> {
        let Some(held) = self.forget(&handle) else {
            return Err(LockError::lost(handle.key(), LostReason::NotHeld));
        };
        // Waits for a renewal in flight; later ones find the slot empty.
        let Some(mut conn) = held.conn.lock().await.take() else {
            return Err(LockError::lost(handle.key(), LostReason::NotHeld));
        };
        let answer = self
            .timed(
                sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock(hashtext($1))")
                    .bind(&held.name)
                    .fetch_one(&mut conn),
            )
            .await;
        match answer {
            Ok(Ok(true)) => {
                // The session held this one lock (pooled sessions hold none,
                // and a session pins at most one lock) and freed it.
                self.park(conn).await;
                Ok(())
            }
            // The session did not hold it (cannot happen while the connection
            // lives, unless someone unlocked it on this session by hand). Its
            // state is not what this client believes: never reuse it.
            Ok(Ok(false)) => {
                let _ = self.timed(conn.close()).await;
                Err(LockError::lost(handle.key(), LostReason::NotHeld))
            }
            // Dropping the connection ends the session, which frees the lock
            // as soon as the server notices; report that the unlock itself failed.
            Ok(Err(e)) => {
                drop(conn);
                Err(LockError::Store(after_sending("release", &held.name, e)))
            }
            Err(_) => {
                drop(conn);
                Err(LockError::Store(Error::Indeterminate {
                    message: format!(
                        "release of lock {:?} timed out (connection dropped: the lock is freed when the server notices)",
                        held.name
                    ),
                    source: None,
                }))
            }
        }
    }
}

observed_lock!(PgAdvisoryLock, "postgres");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(valid_table_name("coord_lock_fences"));
        assert!(valid_table_name("app.lock_fences2"));
        for bad in [
            "",
            "Fences",
            "a;drop table x",
            "1abc",
            "a.b.c",
            "a-b",
            "\"x\"",
            &"t".repeat(59),
        ] {
            assert!(!valid_table_name(bad), "{bad}");
        }
        // The table leaves room for `_last`; a schema may use all 63 bytes.
        assert!(valid_table_name(&"t".repeat(58)));
        assert!(valid_table_name(&format!("{}.t", "s".repeat(63))));
    }
}
