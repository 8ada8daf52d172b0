use std::time::Duration;

/// How [`PostgresBackend`](crate::PostgresBackend) connects and pools.
///
/// ```
/// use coord_postgres::PostgresOptions;
/// use std::time::Duration;
///
/// let options = PostgresOptions::default()
///     .with_max_connections(4)
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_statement_timeout(Some(Duration::from_secs(1)));
/// assert_eq!(options.max_connections, 4);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// Most connections the pool opens (at least 1). Default 10.
    pub max_connections: u32,
    /// How long a call may wait to open or borrow a connection before it
    /// fails with [`Unavailable`](coord_backend::Error::Unavailable). Default 5 s.
    pub connect_timeout: Duration,
    /// The server-side `statement_timeout` of every pooled session (`None` =
    /// the server's default). A txn cancelled by it rolled back: the call
    /// fails with [`Unavailable`](coord_backend::Error::Unavailable), never
    /// with a half-applied txn. Default 5 s.
    pub statement_timeout: Option<Duration>,
    /// Ping a pooled connection that has been idle for at least this long
    /// before handing it out (`None` = never; `Some(ZERO)` = always, one
    /// extra round trip per call). A connection the server dropped while it
    /// sat idle is then replaced instead of turning the next txn into an
    /// [`Indeterminate`](coord_backend::Error::Indeterminate) error. Default 30 s.
    pub ping_idle_after: Option<Duration>,
    /// Whether [`PostgresBackend::connect`](crate::PostgresBackend::connect)
    /// creates the table and function when they are missing (default `true`;
    /// set `false` when the application's role may not run DDL and a DBA
    /// installs [`SCHEMA_SQL`](crate::SCHEMA_SQL) instead).
    pub create_schema: bool,
    /// Whether this client's writing txns send change notifications
    /// (`pg_notify`, see docs/shapes.md "Change notifications"; default
    /// `true`). Notifications are sent only while some client listens to
    /// the namespace; PostgreSQL serialises the commits of notifying
    /// transactions on one lock, which costs concurrent writers much of their
    /// throughput then; turn it off where waiters may poll. Watches of this
    /// backend still hear other clients' writes.
    pub notify_changes: bool,
    /// Whether a reclaim that removed tombstones and left none ends with
    /// `VACUUM coord_kv` (default `true`). PostgreSQL keeps the index
    /// entries of deleted and updated rows until a VACUUM, so right after a
    /// churn a listing still walks them; autovacuum does it in time, this
    /// does it at once. It vacuums the whole table (every namespace) and
    /// needs its owner's rights; a VACUUM that fails is logged and skipped.
    pub vacuum_after_reclaim: bool,
}

impl Default for PostgresOptions {
    /// 10 connections, 5 s to get one, 5 s per statement, ping connections
    /// idle for 30 s before use, create the schema when missing, notify
    /// changes.
    fn default() -> Self {
        PostgresOptions {
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(5)),
            ping_idle_after: Some(Duration::from_secs(30)),
            create_schema: true,
            notify_changes: true,
            vacuum_after_reclaim: true,
        }
    }
}

coord_backend::setters! {
    PostgresOptions {
        /// With another [`max_connections`](Self::max_connections) (at least 1).
        with_max_connections(max: u32) => max_connections = max.max(1);
        /// With another [`connect_timeout`](Self::connect_timeout).
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// With another [`statement_timeout`](Self::statement_timeout).
        with_statement_timeout(timeout: Option<Duration>) => statement_timeout = timeout;
        /// With another [`ping_idle_after`](Self::ping_idle_after).
        with_ping_idle_after(idle: Option<Duration>) => ping_idle_after = idle;
        /// With another [`create_schema`](Self::create_schema).
        with_create_schema(create: bool) => create_schema = create;
        /// With another [`notify_changes`](Self::notify_changes).
        with_notify_changes(notify: bool) => notify_changes = notify;
        /// With another [`vacuum_after_reclaim`](Self::vacuum_after_reclaim).
        with_vacuum_after_reclaim(vacuum: bool) => vacuum_after_reclaim = vacuum;
    }
}
