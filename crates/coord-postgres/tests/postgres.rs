//! coord-postgres against a real PostgreSQL (`COORD_TEST_POSTGRES_URL`, e.g.
//! `postgres://postgres@127.0.0.1:5432/postgres`): the conformance suites
//! (also on private databases `coord_rr` and `coord_ser` whose sessions
//! default to REPEATABLE READ and SERIALIZABLE), a cross-process race, a lost
//! reply, a commit that completes after the client's connection was cut
//! (under the store and under `GenericLock`), rollbacks at COMMIT, a server
//! that is down, concurrent schema creation, TLS modes and malformed rows;
//! `InTransaction` and the `fenced` helper (`mod in_transaction`).
//! Without the variable every test prints SKIPPED and returns (or fails when
//! `COORD_REQUIRE_SERVERS=1`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{
    Assert, Backend, BackendExt, ChangeWatch, Entry, Error, Mutation, StoreUrl, TxnOutcome, Version,
};
use coord_conformance::fault::FaultProxy;
use coord_conformance::support::applied;
use coord_conformance::{unique_namespace, BackendFactory};
use coord_postgres::{PostgresBackend, PostgresOptions};
use sqlx::{Connection, PgConnection};

const URL_VAR: &str = "COORD_TEST_POSTGRES_URL";
/// Set in the children of `cross_process_cas_increments`: the namespace to increment in.
const CHILD_VAR: &str = "COORD_PG_TEST_CHILD_NAMESPACE";
const CHILDREN: usize = 4;
const INCREMENTS: usize = 50;

fn base_url() -> Option<String> {
    coord_conformance::server_env(URL_VAR)
}

/// `base` with extra query parameters appended.
fn with_params(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

fn store_url(base: &str, namespace: &str) -> StoreUrl {
    StoreUrl::parse(&with_params(base, &format!("namespace={namespace}"))).unwrap()
}

async fn connect(base: &str, namespace: &str, options: PostgresOptions) -> PostgresBackend {
    PostgresBackend::connect_with(&store_url(base, namespace), options)
        .await
        .unwrap()
}

/// Connects to `url` (namespace `namespace`), giving up after `timeout`.
async fn connect_within(
    url: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<PostgresBackend, Error> {
    let options = PostgresOptions::default().with_connect_timeout(timeout);
    PostgresBackend::connect_with(&store_url(url, namespace), options).await
}

#[track_caller]
fn assert_unavailable<T: std::fmt::Debug>(result: &Result<T, Error>) {
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
}

/// A plain sqlx connection for looking behind the backend's back.
async fn admin(base: &str) -> PgConnection {
    PgConnection::connect(base).await.unwrap()
}

/// Install `SCHEMA_SQL` in `schema` by hand (as a DBA would), then run `then` there.
async fn install_schema(conn: &mut PgConnection, schema: &str, then: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET search_path = {schema}; {}; {then} RESET search_path;",
        coord_postgres::SCHEMA_SQL
    )))
    .execute(conn)
    .await
    .unwrap();
}

/// A fresh schema of its own: `(its name, the base URL with it as the
/// search_path, an admin connection)`.
async fn private_schema(base: &str, label: &str) -> (String, String, PgConnection) {
    let schema = format!("coord_{}", unique_namespace(label).replace('-', "_"));
    let mut conn = admin(base).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let scoped = with_params(base, &format!("options=-c%20search_path%3D{schema}"));
    (schema, scoped, conn)
}

/// `(before host, host:port, after host)` of a `postgres://user@host:port/db?...` URL.
fn split_host(base: &str) -> (String, String, String) {
    let (scheme, rest) = base.split_once("://").unwrap();
    let (userinfo, hostpart) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let end = hostpart.find(['/', '?']).unwrap_or(hostpart.len());
    let mut host = hostpart[..end].to_owned();
    if !host.contains(':') {
        host.push_str(":5432");
    }
    (
        format!("{scheme}://{userinfo}"),
        host,
        hostpart[end..].to_owned(),
    )
}

/// The same URL pointed at another address, without TLS (so a proxy can see the bytes).
fn via(base: &str, addr: std::net::SocketAddr) -> String {
    let (head, _, tail) = split_host(base);
    with_params(&format!("{head}{addr}{tail}"), "sslmode=disable")
}

async fn upstream(base: &str) -> std::net::SocketAddr {
    let (_, host, _) = split_host(base);
    let addr = tokio::net::lookup_host(host.as_str())
        .await
        .unwrap()
        .next()
        .unwrap();
    addr
}

/// The server's URL for the suites: without TLS unless it names a mode.
/// Suites open a store per case; TLS handshakes (slow in debug builds) add
/// nothing there. `sslmode_is_honoured` covers TLS.
fn suite_base() -> Option<String> {
    let base = base_url()?;
    if base.contains("sslmode=") {
        Some(base)
    } else {
        Some(with_params(&base, "sslmode=disable"))
    }
}

/// The store one suite case runs against.
async fn suite_store(url: &str, namespace: &str) -> Result<Arc<dyn Backend>, Error> {
    let store = PostgresBackend::connect_with(
        &store_url(url, namespace),
        PostgresOptions::default().with_max_connections(8),
    )
    .await?;
    Ok(Arc::new(store))
}

fn factory() -> Option<BackendFactory> {
    let base = suite_base()?;
    Some(coord_conformance::factory(move |namespace| {
        let base = base.clone();
        async move { suite_store(&base, &namespace).await }
    }))
}

coord_conformance::all_suites_tests!(factory());

/// Every suite through the two-host URL of `scripts/ha`
/// (`COORD_HA_POSTGRES_URL`: a primary and its streaming standby, in
/// whatever order their roles are now): sessions go to the primary.
mod primary_and_standby {
    use super::*;

    fn ha_factory() -> Option<BackendFactory> {
        let url = coord_conformance::server_env("COORD_HA_POSTGRES_URL")?;
        Some(coord_conformance::factory(move |namespace| {
            let url = url.clone();
            async move { suite_store(&url, &namespace).await }
        }))
    }

    coord_conformance::all_suites_tests!(ha_factory());
}

/// Every suite through PgBouncer in transaction pooling
/// (`COORD_HA_PGBOUNCER_TX_URL`, scripts/ha: port 6433), declared with
/// `pooler=transaction` (docs/shapes.md, "Poolers").
mod pgbouncer_transaction_pooling {
    use super::*;

    fn tx_factory() -> Option<BackendFactory> {
        let url = coord_conformance::server_env("COORD_HA_PGBOUNCER_TX_URL")?;
        let url = with_params(&url, "pooler=transaction");
        Some(coord_conformance::factory(move |namespace| {
            let url = url.clone();
            async move { suite_store(&url, &namespace).await }
        }))
    }

    coord_conformance::all_suites_tests!(tx_factory());
}

/// Every suite through PgBouncer in session pooling
/// (`COORD_HA_PGBOUNCER_SESSION_URL`, scripts/ha: port 6434).
mod pgbouncer_session_pooling {
    use super::*;

    fn session_factory() -> Option<BackendFactory> {
        let url = coord_conformance::server_env("COORD_HA_PGBOUNCER_SESSION_URL")?;
        Some(coord_conformance::factory(move |namespace| {
            let url = url.clone();
            async move { suite_store(&url, &namespace).await }
        }))
    }

    coord_conformance::all_suites_tests!(session_factory());
}

// ------------------------------------------- every suite again, whatever the session default

/// Serialises creation of the private test databases across test threads and
/// processes (`pg_advisory_lock` on the base database).
const TEST_DATABASES_LOCK: i64 = 0x636f_6f72_645f_6462; // "coord_db"

/// Create database `name` (if missing) whose sessions default to
/// `default_transaction_isolation = isolation`, and return its URL.
///
/// Race-free when tests of several processes get here at once: creators take
/// one advisory lock, and an "already exists" answer (42P04, or 23505 from the
/// catalog's unique index) counts as created. The default is checked from a
/// fresh session, so the suites never run against READ COMMITTED by accident.
async fn isolation_database(base: &str, name: &str, isolation: &str) -> Result<String, String> {
    let err = |what: &str, e: sqlx::Error| format!("{what} of test database {name}: {e}");
    let mut conn = PgConnection::connect(base)
        .await
        .map_err(|e| err("connecting for the creation", e))?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(TEST_DATABASES_LOCK)
        .execute(&mut conn)
        .await
        .map_err(|e| err("locking the creation", e))?;
    let created = async {
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(name)
                .fetch_one(&mut conn)
                .await?;
        let mut attempts = 0;
        while !exists && attempts < 50 {
            attempts += 1;
            let created = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await;
            let code = match &created {
                Err(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
                _ => None,
            };
            match code.as_deref() {
                // Created, or someone else just did.
                _ if created.is_ok() => break,
                Some("42P04" | "23505") => break,
                // Someone else is connected to the template database for a moment.
                Some("55006") if attempts < 50 => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                _ => return created.map(|_| ()),
            }
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} SET default_transaction_isolation = '{isolation}'"
        )))
        .execute(&mut conn)
        .await
        .map(|_| ())
    }
    .await;
    let _ = conn.close().await;
    created.map_err(|e| err("creation", e))?;

    let (head, host, tail) = split_host(base);
    let query = tail.find('?').map_or("", |i| &tail[i..]);
    let url = format!("{head}{host}/{name}{query}");
    let mut check = PgConnection::connect(&url)
        .await
        .map_err(|e| err("connecting", e))?;
    let default: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&mut check)
        .await
        .map_err(|e| err("reading the default isolation", e))?;
    let _ = check.close().await;
    if default != isolation {
        return Err(format!(
            "test database {name}: sessions run at {default:?}, expected {isolation:?}"
        ));
    }
    Ok(url)
}

/// [`isolation_database`], once per process and database.
async fn isolation_database_once(
    base: &str,
    name: &str,
    isolation: &str,
) -> Result<String, String> {
    static READY: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    if let Some((_, url)) = READY.lock().unwrap().iter().find(|(n, _)| n == name) {
        return Ok(url.clone());
    }
    let url = isolation_database(base, name, isolation).await?;
    READY.lock().unwrap().push((name.to_owned(), url.clone()));
    Ok(url)
}

/// Like [`factory`], against database `name` whose sessions default to
/// `isolation` (created on first use).
fn isolation_factory(name: &'static str, isolation: &'static str) -> Option<BackendFactory> {
    let base = suite_base()?;
    Some(coord_conformance::factory(move |namespace| {
        let base = base.clone();
        async move {
            let url = isolation_database_once(&base, name, isolation)
                .await
                .map_err(|message| Error::Unavailable {
                    message,
                    source: None,
                })?;
            suite_store(&url, &namespace).await
        }
    }))
}

/// A database whose `default_transaction_isolation` is `repeatable read`:
/// the store must still be correct (docs/shapes.md, PostgreSQL).
mod repeatable_read_default {
    use super::*;
    coord_conformance::all_suites_tests!(isolation_factory("coord_rr", "repeatable read"));
}

/// The same with `serializable`.
mod serializable_default {
    use super::*;
    coord_conformance::all_suites_tests!(isolation_factory("coord_ser", "serializable"));
}

// ---------------------------------------------------------------- cross-process race

/// One CAS increment of the decimal counter at `key`, retried on conflict
/// from the entries the rejected txn returns.
/// The decimal counter `entry` holds (0 when missing).
fn counter(entry: &Entry) -> u64 {
    entry
        .value
        .as_deref()
        .map_or(0, |v| std::str::from_utf8(v).unwrap().parse().unwrap())
}

async fn increment(store: &PostgresBackend, key: &str) {
    let mut entry = store.get(key).await.unwrap();
    for _ in 0..10_000 {
        let n = counter(&entry);
        let out = store
            .put_if(key, entry.version, (n + 1).to_string().into_bytes())
            .await
            .unwrap();
        if out.applied {
            return;
        }
        entry = out.current.into_iter().next().unwrap();
    }
    panic!("increment kept losing for 10000 tries");
}

/// Not a test of its own: the body of each child process of
/// `cross_process_cas_increments` (a no-op when run directly).
#[tokio::test]
async fn cross_process_child() {
    let Ok(namespace) = std::env::var(CHILD_VAR) else {
        return;
    };
    let base = std::env::var(URL_VAR).unwrap();
    let store = connect(
        &base,
        &namespace,
        PostgresOptions::default().with_max_connections(2),
    )
    .await;
    for _ in 0..INCREMENTS {
        increment(&store, "counter").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_cas_increments() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("cross_process");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args(["cross_process_child", "--exact", "--test-threads=1"])
                .env(CHILD_VAR, &namespace)
                .env(URL_VAR, &base)
                .kill_on_drop(true)
                .output()
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.await.unwrap();
        assert!(
            out.status.success(),
            "child {i} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The child must really have run the child test (and not filtered it away).
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child {i} ran no test"
        );
    }
    let store = connect(&base, &namespace, PostgresOptions::default()).await;
    let total = (CHILDREN * INCREMENTS) as u64;
    assert_eq!(
        store.get("counter").await.unwrap(),
        Entry::present("counter", Version(total), total.to_string().into_bytes()),
        "{CHILDREN} processes x {INCREMENTS} CAS increments"
    );
}

// ---------------------------------------------------------------- faults

/// Create `key` (missing) with a fresh marker value through `proxy`, cutting
/// the reply. The marker travels in the Bind message of the txn: the cut
/// happens after the server received the whole statement.
async fn put_with_cut_reply(
    proxy: &FaultProxy,
    store: &PostgresBackend,
    key: &str,
) -> (String, coord_backend::Result<TxnOutcome>) {
    let marker = format!("marker-{}", unique_namespace("m"));
    proxy.cut_next_reply(marker.as_bytes());
    let result = store
        .txn(
            &[Assert::missing(key)],
            &[Mutation::put(key, marker.clone().into_bytes())],
        )
        .await;
    assert_eq!(proxy.cuts(), 1, "the proxy did not see the txn");
    (marker, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_is_indeterminate_and_committed() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("lost_reply");
    let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
    let proxied = connect(
        &via(&base, proxy.addr()),
        &namespace,
        PostgresOptions::default()
            .with_max_connections(1)
            .with_ping_idle_after(None),
    )
    .await;
    // Open the pooled connection (and prepare the txn statement) before arming.
    assert!(proxied.get("k").await.unwrap().version.is_missing());

    let (marker, result) = put_with_cut_reply(&proxy, &proxied, "k").await;
    match result {
        Err(Error::Indeterminate { .. }) => {}
        other => panic!("a lost txn reply must be Indeterminate, got {other:?}"),
    }

    // A fresh client learns what happened: the autocommit statement committed.
    let fresh = connect(&base, &namespace, PostgresOptions::default()).await;
    assert_eq!(
        fresh.get("k").await.unwrap(),
        Entry::present("k", Version(1), marker.into_bytes())
    );
    // The broken connection was not handed out again.
    assert_eq!(proxied.get("k").await.unwrap().version, Version(1));
}

/// A transaction-rollback error (SQLSTATE class 40) at the implicit COMMIT,
/// i.e. after the function completed: the server rolled back, so the txn
/// certainly did not apply and may be retried: `Unavailable`, never
/// `Indeterminate` or an outcome. A deferred constraint trigger in a private
/// schema raises it at commit time. The same trigger raising `CO001` (what
/// `coord_txn` raises at another isolation level than READ COMMITTED) is a
/// configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_at_commit_is_unavailable() {
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "rollback").await;
    let store = connect(&scoped, "rollback", PostgresOptions::default()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"
        CREATE FUNCTION {schema}.fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.key LIKE 'doomed-%' THEN
                RAISE EXCEPTION 'injected at commit' USING ERRCODE = substr(NEW.key, 8);
            END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT OR UPDATE ON {schema}.coord_kv
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.fail_at_commit();
        "#
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let mut results = Vec::new();
    for code in ["40001", "40P01", "CO001"] {
        let key = format!("doomed-{code}");
        let txn = store
            .txn(
                &[Assert::missing(key.as_str())],
                &[Mutation::put(key.as_str(), b"v".to_vec())],
            )
            .await;
        let stored = store.get(&key).await;
        results.push((code, txn, stored));
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    for (code, txn, stored) in results {
        if code == "CO001" {
            // coord_txn's refusal of another isolation level: configuration.
            assert!(matches!(txn, Err(Error::Config(_))), "CO001: {txn:?}");
        } else {
            assert!(
                matches!(txn, Err(Error::Unavailable { .. })),
                "SQLSTATE {code} at COMMIT (rolled back) must be Unavailable, got {txn:?}"
            );
        }
        assert!(stored.unwrap().version.is_missing(), "{code}: rolled back");
    }
}

/// `coord_txn` is only correct at READ COMMITTED (docs/shapes.md): called
/// directly in a REPEATABLE READ or SERIALIZABLE transaction it refuses to
/// run instead of checking asserts against a snapshot older than its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coord_txn_refuses_other_isolation_levels() {
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "guard").await;
    // Installs the schema in the private schema.
    drop(connect(&scoped, "guard", PostgresOptions::default()).await);
    let mut outcomes = Vec::new();
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let mut tx = conn.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET TRANSACTION ISOLATION LEVEL {level}"
        )))
        .execute(&mut *tx)
        .await
        .unwrap();
        let called = sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(format!(
            "SELECT applied FROM {schema}.coord_txn('guard', '{{}}', '{{}}', ARRAY['k'], \
             ARRAY['v'::bytea], '{{}}')"
        )))
        .fetch_one(&mut *tx)
        .await;
        let _ = tx.rollback().await;
        outcomes.push((
            level,
            called.map_err(|e| match e {
                sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
                other => panic!("{level}: {other}"),
            }),
        ));
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            ("READ COMMITTED", Ok(true)),
            ("REPEATABLE READ", Err(Some("CO001".to_owned()))),
            ("SERIALIZABLE", Err(Some("CO001".to_owned()))),
        ]
    );
}

/// A caller's own SQL may pass NULL for an empty list: `coord_txn` takes
/// it as empty, and never answers "applied" for writes it skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coord_txn_takes_null_arrays_as_empty() {
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "nulls").await;
    drop(connect(&scoped, "nulls", PostgresOptions::default()).await);
    // The function's tables are those of the caller's search_path.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET search_path = {schema}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let call =
        |args: &str| format!("SELECT applied, k, ver FROM coord_txn('nulls', {args}) ORDER BY k");
    let mut answers = Vec::new();
    for args in [
        "NULL, NULL, ARRAY['a', 'b'], ARRAY['x'::bytea, 'y'::bytea], NULL",
        "ARRAY['a'], ARRAY[1::bigint], NULL, NULL, ARRAY['a']",
    ] {
        let rows: Vec<(bool, Option<String>, Option<i64>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(call(args)))
                .fetch_all(&mut conn)
                .await
                .unwrap();
        answers.push(rows);
    }
    let stored: Vec<(String, i64, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT key, version, value FROM coord_kv WHERE ns = 'nulls' ORDER BY key")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        answers,
        vec![
            vec![
                (true, Some("a".to_owned()), Some(1)),
                (true, Some("b".to_owned()), Some(1)),
            ],
            vec![(true, None, None)],
        ]
    );
    assert_eq!(
        stored,
        vec![
            ("a".to_owned(), 2, None),
            ("b".to_owned(), 1, Some(b"y".to_vec())),
        ]
    );
}

// -------------------------------- a commit that completes after the client's connection was cut

/// `(ns, key)` → the two-int4 advisory lock `coord_txn` takes for it (see `SCHEMA_SQL`).
const TXN_LOCK_OF: &str =
    "(SELECT (h >> 32)::int4 AS k1, ((h & 4294967295) - 2147483648)::int4 AS k2 \
     FROM (SELECT hashtextextended($1 || '/' || $2, 0) AS h) AS hashed)";

/// Hold (on `conn`'s session) the advisory lock `coord_txn` takes for `key` of `ns`.
async fn hold_txn_lock(conn: &mut PgConnection, ns: &str, key: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_lock(k1, k2) FROM {TXN_LOCK_OF} AS l"
    )))
    .bind(ns)
    .bind(key)
    .execute(&mut *conn)
    .await
    .unwrap();
}

async fn free_txn_lock(conn: &mut PgConnection, ns: &str, key: &str) {
    let freed: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_unlock(k1, k2) FROM {TXN_LOCK_OF} AS l"
    )))
    .bind(ns)
    .bind(key)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!(freed, "the test did not hold the lock of {key:?}");
}

/// The sessions waiting for the advisory lock of `key` of `ns`.
async fn txn_lock_waiters(conn: &mut PgConnection, ns: &str, key: &str) -> Vec<i32> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT w.pid FROM pg_locks w, {TXN_LOCK_OF} AS l \
         WHERE w.locktype = 'advisory' AND NOT w.granted AND w.objsubid = 2 \
           AND w.classid = l.k1::oid AND w.objid = l.k2::oid \
           AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )))
    .bind(ns)
    .bind(key)
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

/// Poll `check` every 20 ms until it returns `Some`, for at most 30 s.
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store through `proxy`, one pooled connection, its sessions named `app`.
/// The server must not notice the cut while it waits (the default
/// `client_connection_check_interval = 0`, set explicitly for the session).
async fn proxied_store(
    base: &str,
    proxy: &FaultProxy,
    namespace: &str,
    app: &str,
) -> PostgresBackend {
    let url = with_params(
        &via(base, proxy.addr()),
        &format!("application_name={app}&options=-c%20client_connection_check_interval%3D0"),
    );
    connect(
        &url,
        namespace,
        PostgresOptions::default()
            .with_max_connections(1)
            .with_ping_idle_after(None)
            // Long enough for the lock wait on a loaded machine; a hung test still ends.
            .with_statement_timeout(Some(Duration::from_secs(120))),
    )
    .await
}

/// The txn reaches the server, which blocks on a key's advisory lock held by
/// another session; the client's connection is cut; then the lock is freed
/// and the server commits, after the client is gone. The client must have
/// said `Indeterminate` (never `Unavailable`, never an outcome), and the
/// write is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_after_the_cut_is_indeterminate_and_lands() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("late_commit");
    let mut holder = admin(&base).await;
    hold_txn_lock(&mut holder, &namespace, "late").await;
    let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
    let app = namespace.replace('-', "_");
    let proxied = proxied_store(&base, &proxy, &namespace, &app).await;
    assert!(proxied.get("late").await.unwrap().version.is_missing());

    let (marker, result) = put_with_cut_reply(&proxy, &proxied, "late").await;
    // The client has its answer; the server is still waiting for the lock.
    let waiting = wait_for("the txn waiting for the held lock", || async {
        Some(txn_lock_waiters(&mut admin(&base).await, &namespace, "late").await)
            .filter(|w| !w.is_empty())
    })
    .await;
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    free_txn_lock(&mut holder, &namespace, "late").await;

    let fresh = connect(&base, &namespace, PostgresOptions::default()).await;
    let landed = wait_for("the late commit", || async {
        Some(fresh.get("late").await.unwrap()).filter(|e| e.exists())
    })
    .await;
    match result {
        Err(Error::Indeterminate { .. }) => {}
        other => panic!("a txn cut while the server waited must be Indeterminate, got {other:?}"),
    }
    assert_eq!(
        landed,
        Entry::present("late", Version(1), marker.into_bytes())
    );
}

/// The same late commit under `GenericLock::try_lock` (the CAS engine). Nobody
/// else locks in this namespace, so a grant in the record is the caller's own:
/// `try_lock` must answer `Ok(Some(handle))` whose token is in the record, or
/// an `Indeterminate` error; `Ok(None)` ("held by someone else") would report
/// a conclusion nobody reached (AGENTS.md, "No conclusion must be observable
/// that was not reached").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commit_under_try_lock_is_the_callers_grant_or_indeterminate() {
    use coord_adapters::lock::{GenericLock, Lock, LockError};

    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("late_lock");
    let record = "lock/res";
    let mut holder = admin(&base).await;
    hold_txn_lock(&mut holder, &namespace, record).await;
    let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
    let app = namespace.replace('-', "_");
    let proxied = proxied_store(&base, &proxy, &namespace, &app).await;
    assert!(proxied.get("warm").await.unwrap().version.is_missing());
    let lock = GenericLock::new(Arc::new(proxied));

    // Only a lock record's value holds `expires_ms`: the cut hits the grant's txn.
    proxy.cut_next_reply(b"expires_ms");
    let attempt = tokio::spawn(async move { lock.try_lock("res", Duration::from_secs(600)).await });
    let first = wait_for("the grant's txn waiting for the held lock", || async {
        let waiters = txn_lock_waiters(&mut admin(&base).await, &namespace, record).await;
        (proxy.cuts() == 1)
            .then_some(())
            .and(waiters.first().copied())
    })
    .await;
    // Free the lock only once the client acted on the cut with the grant
    // still unwritten, so what it concluded cannot depend on timing: it
    // answered, or it re-read the record on a new session (its only pooled
    // connection was the cut one) and that read completed, or it sent
    // another txn on the record (a second waiter).
    wait_for("the client to act on the cut", || async {
        if attempt.is_finished() {
            return Some(());
        }
        let mut conn = admin(&base).await;
        let retried = txn_lock_waiters(&mut conn, &namespace, record)
            .await
            .iter()
            .any(|pid| *pid != first);
        let reread: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2 \
             AND state = 'idle' AND query LIKE 'SELECT key, version, value FROM coord_kv%'",
        )
        .bind(&app)
        .bind(first)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        (retried || reread > 0).then_some(())
    })
    .await;
    free_txn_lock(&mut holder, &namespace, record).await;
    let answer = tokio::time::timeout(Duration::from_secs(120), attempt)
        .await
        .expect("try_lock did not answer")
        .unwrap();

    let fresh = connect(&base, &namespace, PostgresOptions::default()).await;
    let stored = wait_for("the late grant", || async {
        fresh.get(record).await.unwrap().value
    })
    .await;
    let stored = String::from_utf8(stored).unwrap();
    match answer {
        Ok(Some(handle)) => assert!(
            stored.contains(handle.token()),
            "try_lock granted a handle whose token is not in the record {stored}"
        ),
        Err(LockError::Store(Error::Indeterminate { .. })) => {}
        Ok(None) => panic!(
            "try_lock answered \"held by someone else\", but the record {stored} holds the \
             caller's own late grant (nobody else locks in this namespace)"
        ),
        Err(other) => panic!("try_lock: expected a grant or Indeterminate, got {other:?}"),
    }
}

#[tokio::test]
async fn closed_port_is_unavailable() {
    let Some(base) = base_url() else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let result = connect_within(&via(&base, addr), "down", Duration::from_secs(1)).await;
    assert_unavailable(&result);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_gone_before_sending_is_unavailable() {
    let Some(base) = base_url() else { return };
    let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
    let store = connect(
        &via(&base, proxy.addr()),
        &unique_namespace("gone"),
        PostgresOptions::default()
            .with_max_connections(1)
            .with_connect_timeout(Duration::from_secs(1))
            .with_ping_idle_after(Some(Duration::ZERO)),
    )
    .await;
    assert!(store.get("k").await.unwrap().version.is_missing());
    // Stop the proxy: its port closes and its connections drop.
    drop(proxy);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let txn = store
        .txn(
            &[Assert::missing("k")],
            &[Mutation::put("k", b"v".to_vec())],
        )
        .await;
    assert_unavailable(&txn);
    let read = store.snapshot(&["k".to_owned()]).await;
    assert_unavailable(&read);
}

// ---------------------------------------------------------------- schema

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_use_creates_the_schema_once() {
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "schema").await;
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let scoped = scoped.clone();
            tokio::spawn(async move {
                let store = PostgresBackend::connect_with(
                    &store_url(&scoped, "schema"),
                    PostgresOptions::default().with_max_connections(1),
                )
                .await?;
                store
                    .txn(&[], &[Mutation::put(format!("k{i}"), b"v".to_vec())])
                    .await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let created: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{schema}.coord_kv"))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.coord_kv"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap_or(-1);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    for (i, result) in results.into_iter().enumerate() {
        assert!(result.unwrap().applied, "process {i}");
    }
    assert!(created.is_some(), "the table is not in the fresh schema");
    assert_eq!(rows, 6);
}

// ---------------------------------------------------------------- TLS

#[tokio::test]
async fn sslmode_is_honoured() {
    let Some(base) = base_url() else { return };
    let mut conn = admin(&base).await;
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let app = unique_namespace("tls").replace('-', "_");
    let required = connect_within(
        &with_params(&base, &format!("sslmode=require&application_name={app}")),
        "tls",
        Duration::from_secs(2),
    )
    .await;
    if ssl != "on" {
        assert!(required.is_err(), "sslmode=require connected without TLS");
        return;
    }
    let store = required.unwrap();
    store.get("k").await.unwrap();
    let (encrypted, sessions): (Option<bool>, i64) = sqlx::query_as(
        "SELECT bool_and(s.ssl), count(*) FROM pg_stat_ssl s \
         JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
    )
    .bind(&app)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(sessions >= 1, "no pooled session found");
    assert_eq!(encrypted, Some(true), "sslmode=require session is not TLS");

    // verify-full checks the certificate and the host name against the
    // system trust store: a local server's self-signed certificate fails.
    let verified = connect_within(
        &with_params(&base, "sslmode=verify-full"),
        "tls",
        Duration::from_secs(2),
    )
    .await;
    assert_unavailable(&verified);
}

// ---------------------------------------------------------------- store specifics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_rows_are_reported() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("malformed");
    let store = connect(&base, &namespace, PostgresOptions::default()).await;
    let mut conn = admin(&base).await;
    // A value at version 0: no coord writer produces it.
    sqlx::query("INSERT INTO coord_kv (ns, key, version, value) VALUES ($1, 'bad', 0, 'x')")
        .bind(&namespace)
        .execute(&mut conn)
        .await
        .unwrap();
    let read = store.snapshot(&["bad".to_owned()]).await;
    assert!(
        matches!(read, Err(Error::MalformedRecord { ref key, .. }) if key == "bad"),
        "{read:?}"
    );
    let txn = store
        .txn(&[Assert::at("bad", Version(5))], &[Mutation::delete("bad")])
        .await;
    assert!(matches!(txn, Err(Error::MalformedRecord { .. })), "{txn:?}");
}

/// Every put of an applied txn reports the version it stored (`coord_txn`
/// and the single-key statement), also over a tombstone and after a reclaim
/// raised the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_puts_report_their_versions() {
    let Some(factory) = factory() else { return };
    let store = factory(unique_namespace("every_put")).await.unwrap();
    if let Err(failure) = coord_conformance::backend::every_put_reports_its_version(store).await {
        panic!("{}", failure.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_tombstones_and_rejections() {
    let Some(base) = base_url() else { return };
    let store = connect(
        &base,
        &unique_namespace("versions"),
        PostgresOptions::default(),
    )
    .await;
    assert!(applied(store.put_if("a", Version::MISSING, b"1".to_vec())).await);
    assert!(applied(store.delete_if("a", Version(1))).await);
    assert_eq!(store.get("a").await.unwrap(), Entry::missing("a"));
    // The stale version 1 must not pass again after a re-create (ABA).
    assert!(applied(store.put_if("a", Version::MISSING, b"2".to_vec())).await);
    assert_eq!(store.get("a").await.unwrap().version, Version(3));
    assert!(!applied(store.put_if("a", Version(1), b"x".to_vec())).await);
    // Deleting a missing key moves its hidden counter.
    assert!(applied(store.txn(&[], &[Mutation::delete("b")])).await);
    assert!(applied(store.put_if("b", Version::MISSING, b"b".to_vec())).await);
    assert_eq!(store.get("b").await.unwrap().version, Version(2));

    // A rejection writes nothing and returns the asserted keys once each, in assert order.
    let out = store
        .txn(
            &[
                Assert::missing("zz"),
                Assert::at("a", Version(2)),
                Assert::missing("zz"),
                Assert::at("b", Version(2)),
            ],
            &[Mutation::put("zz", b"no".to_vec()), Mutation::delete("b")],
        )
        .await
        .unwrap();
    assert!(!out.applied);
    assert_eq!(
        out.current,
        vec![
            Entry::missing("zz"),
            Entry::present("a", Version(3), b"2".to_vec()),
            Entry::present("b", Version(2), b"b".to_vec()),
        ]
    );
    assert_eq!(
        store
            .snapshot(&["zz".into(), "b".into(), "zz".into()])
            .await
            .unwrap(),
        vec![
            Entry::missing("zz"),
            Entry::present("b", Version(2), b"b".to_vec())
        ]
    );
    assert!(matches!(
        store.txn(&[], &[Mutation::put("", b"x".to_vec())]).await,
        Err(Error::InvalidInput(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_are_literal_and_namespaces_isolated() {
    let Some(base) = base_url() else { return };
    let ns = unique_namespace("prefix");
    let store = connect(&base, &ns, PostgresOptions::default()).await;
    // A namespace that extends this one must not leak into it (and vice versa).
    let longer = connect(&base, &format!("{ns}x"), PostgresOptions::default()).await;
    let keys = [
        "a%b",
        "a%",
        "aXb",
        "a_b",
        "a_",
        "a\\b",
        "a\\",
        "é1",
        "é",
        "f",
        "a*",
        "a[",
        "a{",
        "\u{10FFFF}z",
    ];
    let mutations: Vec<_> = keys
        .iter()
        .map(|k| Mutation::put(*k, b"v".to_vec()))
        .collect();
    assert!(applied(store.txn(&[], &mutations)).await);
    assert!(applied(longer.txn(&[], &[Mutation::put("a%x", b"v".to_vec())])).await);
    assert!(applied(store.txn(&[], &[Mutation::delete("a%")])).await);

    assert_eq!(store.keys("a%").await.unwrap(), vec!["a%b"]);
    assert_eq!(store.keys("a_").await.unwrap(), vec!["a_", "a_b"]);
    assert_eq!(store.keys("a\\").await.unwrap(), vec!["a\\", "a\\b"]);
    assert_eq!(store.keys("é").await.unwrap(), vec!["é", "é1"]);
    assert_eq!(store.keys("\u{10FFFF}").await.unwrap(), vec!["\u{10FFFF}z"]);
    let mut expected: Vec<String> = keys
        .iter()
        .filter(|k| **k != "a%")
        .map(|k| k.to_string())
        .collect();
    expected.sort(); // Rust's String order is byte order
    assert_eq!(store.keys("").await.unwrap(), expected);
    assert_eq!(longer.keys("").await.unwrap(), vec!["a%x"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crossing_key_orders_never_deadlock() {
    let Some(base) = base_url() else { return };
    let store = connect(
        &base,
        &unique_namespace("deadlock"),
        PostgresOptions::default().with_max_connections(8),
    )
    .await;
    let orders: [[&str; 3]; 4] = [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["b", "c", "a"],
        ["c", "a", "b"],
    ];
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        let order = orders[worker % orders.len()];
        tasks.push(tokio::spawn(async move {
            for round in 0..20 {
                let mutations: Vec<_> = order
                    .iter()
                    .map(|k| Mutation::put(*k, format!("{worker}-{round}")))
                    .collect();
                // An assert on a key nobody writes: locked too, never created.
                let out = store
                    .txn(
                        &[Assert::missing(format!("absent-{}", order[0]))],
                        &mutations,
                    )
                    .await?;
                assert!(out.applied);
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let entries = store
        .snapshot(&["a".into(), "b".into(), "c".into()])
        .await
        .unwrap();
    for entry in &entries {
        assert_eq!(entry.version, Version(8 * 20), "{entry:?}");
    }
    // Every txn wrote all three keys at once: they all hold the last writer's value.
    assert!(entries.iter().all(|e| e.value == entries[0].value));
    assert!(store.keys("absent").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_and_schema_options() {
    let Some(base) = base_url() else { return };
    let long_form = base.replacen("postgres://", "postgresql://", 1);
    let store = connect(
        &long_form,
        &unique_namespace("scheme"),
        PostgresOptions::default(),
    )
    .await;
    assert!(applied(store.txn(&[], &[Mutation::put("k", b"v".to_vec())])).await);

    let wrong = PostgresBackend::connect(&StoreUrl::parse("redis://127.0.0.1:6379").unwrap()).await;
    assert!(matches!(wrong, Err(Error::Config(_))), "{wrong:?}");

    // Without schema creation, a database lacking the schema is a configuration error.
    let (schema, scoped, mut conn) = private_schema(&base, "noschema").await;
    let missing = PostgresBackend::connect_with(
        &store_url(&scoped, "x"),
        PostgresOptions::default().with_create_schema(false),
    )
    .await;
    // ...and installing SCHEMA_SQL by hand (as a DBA would) satisfies it.
    install_schema(&mut conn, &schema, "").await;
    let installed = PostgresBackend::connect_with(
        &store_url(&scoped, "x"),
        PostgresOptions::default().with_create_schema(false),
    )
    .await
    .unwrap();
    let written = installed
        .txn(
            &[Assert::missing("k")],
            &[Mutation::put("k", b"v".to_vec())],
        )
        .await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    assert!(matches!(missing, Err(Error::Config(_))), "{missing:?}");
    assert!(written.unwrap().applied);
    // The table is gone: a read is an error, never an empty answer.
    let gone = installed.keys("").await;
    assert_unavailable(&gone);
}

/// The revision comment on `coord_txn` in `schema`.
async fn txn_tag(conn: &mut PgConnection, schema: &str) -> Option<String> {
    let sql = format!(
        "SELECT obj_description(to_regprocedure('{schema}.coord_txn(text,text[],bigint[],\
         text[],bytea[],text[])'), 'pg_proc')"
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A database whose `coord_txn` is of an older revision (r9, which answers
/// an applied txn with one row and no versions) is upgraded by the first
/// client that connects with schema creation on (the default), whose txns
/// then report the versions they stored; without schema creation it is a
/// configuration error, as for any other revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_r9_schema_is_upgraded_to_report_versions() {
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "r9").await;
    let r9 = "COMMENT ON FUNCTION coord_txn(text, text[], bigint[], text[], bytea[], text[]) \
              IS 'coord schema r9';";
    install_schema(&mut conn, &schema, r9).await;
    let refused = PostgresBackend::connect_with(
        &store_url(&scoped, "r9"),
        PostgresOptions::default().with_create_schema(false),
    )
    .await;
    let upgraded = connect(&scoped, "r9", PostgresOptions::default()).await;
    let after = txn_tag(&mut conn, &schema).await;
    let outcome = upgraded
        .txn(
            &[],
            &[
                Mutation::put("a", b"x".to_vec()),
                Mutation::put("b", b"y".to_vec()),
            ],
        )
        .await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
    assert_eq!(after.as_deref(), Some("coord schema r12"));
    let mut written = outcome.unwrap().written;
    written.sort();
    assert_eq!(
        written,
        vec![("a".to_owned(), Version(1)), ("b".to_owned(), Version(1))]
    );
}

// ---------------------------------------------------------------- change notifications

/// Single-key txns (the fast path: one statement, not `coord_txn`) wake
/// watchers too, in both shapes (assert missing, assert live), for puts and
/// deletes; a rejected one leaves the watch working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_key_writes_notify() {
    let Some((_, _, watcher, writer)) = notified("pg_notify_fast").await else {
        return;
    };
    let mut watch = watch(&watcher, "k/").await;
    let steps: [(&str, Assert, Mutation); 3] = [
        (
            "create",
            Assert::missing("k/1"),
            Mutation::put("k/1", b"a".to_vec()),
        ),
        (
            "update",
            Assert::at("k/1", Version(1)),
            Mutation::put("k/1", b"b".to_vec()),
        ),
        (
            "delete",
            Assert::at("k/1", Version(2)),
            Mutation::delete("k/1"),
        ),
    ];
    for (what, assert, mutation) in steps {
        let out = writer.txn(&[assert], &[mutation]).await.unwrap();
        assert!(out.applied, "{what}: not applied");
        woken(&mut watch, &format!("{what} (a single-key txn)")).await;
    }
}

/// A txn whose key list would pass NOTIFY's 8000-byte payload limit, or
/// whose keys hold a newline (the payload's separator), still applies and
/// notifies with an empty payload ("anything"), which wakes every watch of
/// the namespace, also one on a prefix none of the keys has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_multiline_key_lists_notify_anything() {
    let Some((_, _, watcher, writer)) = notified("pg_notify_payload").await else {
        return;
    };
    let long: Vec<Mutation> = (0..60)
        .map(|i| Mutation::put(format!("k/{i:03}/{}", "x".repeat(150)), b"1".to_vec()))
        .collect();
    let multiline = vec![Mutation::put("k/two\nlines", b"1".to_vec())];
    for (what, mutations) in [("9 KB of keys", long), ("a key with a newline", multiline)] {
        let mut watch = watch(&watcher, "elsewhere/").await;
        let out = writer.txn(&[], &mutations).await.unwrap();
        assert!(out.applied, "{what}: not applied");
        woken(&mut watch, what).await;
    }
}

/// A client with `notify_changes(false)` sends no notification; one with the
/// default does. A listener's first notification is the notifying client's
/// (notifications arrive in commit order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_changes_off_sends_nothing() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("pg_notify_off");
    let quiet = connect(
        &base,
        &namespace,
        PostgresOptions::default().with_notify_changes(false),
    )
    .await;
    let loud = connect(&base, &namespace, PostgresOptions::default()).await;
    // Notifications are sent only while someone listens through coord (its lease).
    let _watch = watch(&loud, "").await;
    let mut listener = raw_listener(&base, &namespace).await;
    assert!(applied(quiet.txn(&[], &[Mutation::put("quiet", b"1".to_vec())])).await);
    assert!(applied(loud.txn(&[], &[Mutation::put("loud", b"1".to_vec())])).await);
    let first = notification(&mut listener, "from the loud client").await;
    assert_eq!(first.payload(), "loud");
}

/// A fresh namespace (`label`-…) with a client that watches it and one that
/// writes to it: `(base URL, namespace, watcher, writer)`; `None` without a server.
async fn notified(label: &str) -> Option<(String, String, PostgresBackend, PostgresBackend)> {
    let base = base_url()?;
    let namespace = unique_namespace(label);
    let watcher = connect(&base, &namespace, PostgresOptions::default()).await;
    let writer = connect(&base, &namespace, PostgresOptions::default()).await;
    Some((base, namespace, watcher, writer))
}

/// A coord watch of `prefix` on `store`.
async fn watch(store: &PostgresBackend, prefix: &str) -> Box<dyn ChangeWatch> {
    store.changes().unwrap().watch(prefix).await.unwrap()
}

/// Fails the test (saying `what`) unless `watch` wakes within the changes
/// suite's bound.
async fn woken(watch: &mut Box<dyn ChangeWatch>, what: &str) {
    tokio::time::timeout(coord_conformance::changes::WAKE_BOUND, watch.changed())
        .await
        .unwrap_or_else(|_| panic!("{what}: no wake-up"))
        .unwrap();
}

/// The next notification on `listener`, within 10 s (else fails saying `what`).
async fn notification(
    listener: &mut sqlx::postgres::PgListener,
    what: &str,
) -> sqlx::postgres::PgNotification {
    tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .unwrap_or_else(|_| panic!("no notification within 10 s {what}"))
        .unwrap()
}

/// A session inside a transaction that already checked `namespace` for a
/// lease (finding none, it will not notify) and has not committed yet.
async fn writer_that_missed_the_lease(base: &str, namespace: &str) -> PgConnection {
    let mut writer = admin(base).await;
    sqlx::query("BEGIN").execute(&mut writer).await.unwrap();
    let answered: bool = sqlx::query_scalar("SELECT coord_notify($1, ARRAY['k/1'])")
        .bind(namespace)
        .fetch_one(&mut writer)
        .await
        .unwrap();
    assert!(answered);
    writer
}

/// A LISTEN on the namespace's channel, outside coord (so it holds no lease).
async fn raw_listener(base: &str, namespace: &str) -> sqlx::postgres::PgListener {
    let mut listener = sqlx::postgres::PgListener::connect(base).await.unwrap();
    let channel: String = sqlx::query_scalar("SELECT 'coord_' || md5($1)")
        .bind(namespace)
        .fetch_one(&mut listener)
        .await
        .unwrap();
    listener.listen(&channel).await.unwrap();
    listener
}

/// Writes to a namespace nobody watches through coord send no NOTIFY (they
/// would pay NOTIFY's global commit lock for nothing); once a coord watch
/// holds the namespace's lease, every write notifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_watched_namespace_is_notified() {
    let Some((base, namespace, watcher, writer)) = notified("pg_notify_watched").await else {
        return;
    };
    let mut listener = raw_listener(&base, &namespace).await;
    let writer = &writer;
    let put = |key: &'static str| async move {
        let applied = writer.txn(&[], &[Mutation::put(key, b"1".to_vec())]).await;
        assert!(applied.unwrap().applied, "{key}");
    };
    put("unwatched").await;
    let early = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
    assert!(
        early.is_err(),
        "an unwatched namespace was notified: {early:?}"
    );

    let mut watch = watch(&watcher, "").await;
    put("watched").await;
    let first = notification(&mut listener, "while watched").await;
    assert_eq!(first.payload(), "watched");
    woken(&mut watch, "the coord watch").await;
}

/// A writer that checked for a lease before the first watch registered one
/// (and so will not notify) commits before that watch returns: the watch
/// waits for it, so no change committed after `watch` returned goes
/// unreported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_watch_waits_for_writers_that_missed_its_lease() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("pg_notify_barrier");
    let watcher = connect(&base, &namespace, PostgresOptions::default()).await;
    // A writer between its check (no lease yet: nothing will be sent) and its commit.
    let mut writer = writer_that_missed_the_lease(&base, &namespace).await;
    first_watch_across_a_commit(watcher, async move {
        sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
    })
    .await;
}

/// A first watch waiting for a writer that missed its lease holds up no
/// other writer: the listener requests no lock, so nobody queues behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_first_watch_holds_up_no_writer() {
    let Some((base, namespace, watcher, writer)) = notified("pg_notify_no_queue").await else {
        return;
    };
    let mut open_writer = writer_that_missed_the_lease(&base, &namespace).await;
    let watching = tokio::spawn(async move {
        let watch = watch(&watcher, "k/").await;
        (watcher, watch)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Written while the watch still waits for the open writer.
    // One through `coord_txn`, one through the single-key statement.
    let written = tokio::time::timeout(Duration::from_secs(3), async {
        let multi = writer
            .txn(&[], &[Mutation::put("k/2", b"2".to_vec())])
            .await?;
        let single = writer
            .txn(
                &[Assert::missing("k/3")],
                &[Mutation::put("k/3", b"3".to_vec())],
            )
            .await?;
        Ok::<_, Error>(multi.applied && single.applied)
    })
    .await;
    let still_waiting = !watching.is_finished();
    sqlx::query("COMMIT")
        .execute(&mut open_writer)
        .await
        .unwrap();
    let (_watcher, _watch) = watching.await.unwrap();
    assert!(
        matches!(written, Ok(Ok(true))),
        "a writer queued behind a first watch that waits for another writer: {written:?}"
    );
    assert!(
        still_waiting,
        "the watch returned while a writer that missed its lease was open"
    );
}

/// Starts `watcher`'s first watch (on `k/`) while a writer that missed its
/// lease is still open, gives it 500 ms, then lets the writer commit
/// (`commit`): a watch that had returned by then must be woken by that
/// commit.
async fn first_watch_across_a_commit(watcher: PostgresBackend, commit: impl Future<Output = ()>) {
    let watching = tokio::spawn(async move {
        let watch = watch(&watcher, "k/").await;
        (watcher, watch)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let returned_before_commit = watching.is_finished();
    commit.await;
    let (_watcher, mut watch) = watching.await.unwrap();
    if returned_before_commit {
        // The writer committed after the watch returned: the watch owes it a wake-up.
        let woken =
            tokio::time::timeout(coord_conformance::changes::WAKE_BOUND, watch.changed()).await;
        assert!(
            matches!(woken, Ok(Ok(()))),
            "the watch returned while a writer that missed its lease was still open, \
             and that writer's commit woke nobody"
        );
    }
}

/// The same for the single-key statement, whose check is inlined: a writer
/// whose snapshot was taken before the first watch's lease (it then waits
/// for the key's lock, held here by another transaction) will not notify;
/// the watch waits for it, or is woken by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_watch_waits_for_single_key_writers_that_missed_its_lease() {
    let Some((base, namespace, watcher, writer)) = notified("pg_notify_barrier_fast").await else {
        return;
    };
    let mut blocker = admin(&base).await;
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(
        "SELECT pg_advisory_xact_lock((h >> 32)::int4, ((h & 4294967295) - 2147483648)::int4) \
           FROM (SELECT hashtextextended($1 || '/' || 'k/1', 0) AS h) AS x",
    )
    .bind(&namespace)
    .execute(&mut blocker)
    .await
    .unwrap();
    let blocker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut blocker)
        .await
        .unwrap();
    let writing = tokio::spawn(async move {
        writer
            .txn(
                &[Assert::missing("k/1")],
                &[Mutation::put("k/1", b"1".to_vec())],
            )
            .await
    });
    // The writer has bound its statement and taken its snapshot once it waits for the key.
    let mut probe = admin(&base).await;
    while !sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))",
    )
    .bind(blocker_pid)
    .fetch_one(&mut probe)
    .await
    .unwrap()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first_watch_across_a_commit(watcher, async move {
        sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
        assert!(writing.await.unwrap().unwrap().applied);
    })
    .await;
}

/// The listening connection killed and its lease gone (what a server
/// restart does: crash recovery empties `coord_watch`): the listener
/// reconnects, registers its lease again, and writes notify again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_listener_registers_its_lease_again() {
    let Some((base, namespace, watcher, writer)) = notified("pg_notify_reconnect").await else {
        return;
    };
    let mut conn = admin(&base).await;
    let _watch = watch(&watcher, "").await;
    sqlx::query("DELETE FROM coord_watch WHERE ns = $1")
        .bind(&namespace)
        .execute(&mut conn)
        .await
        .unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
          WHERE query LIKE 'LISTEN %' || md5($1) || '%'",
    )
    .bind(&namespace)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(killed, 1, "the listener's connection");
    wait_for("the lease to be registered again", || async {
        let back: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM coord_watch WHERE ns = $1 AND until > clock_timestamp())",
        )
        .bind(&namespace)
        .fetch_one(&mut admin(&base).await)
        .await
        .unwrap();
        back.then_some(())
    })
    .await;
    let mut listener = raw_listener(&base, &namespace).await;
    let out = writer
        .txn(&[], &[Mutation::put("after", b"1".to_vec())])
        .await;
    assert!(out.unwrap().applied);
    let note = notification(&mut listener, "after the listener came back").await;
    assert_eq!(note.payload(), "after");
}

// ---------------------------------------------------------------- single-key fast path

/// A single-key txn (the fast path: one statement instead of `coord_txn`)
/// waits for the advisory lock `coord_txn` takes on its key, in both shapes
/// (assert missing, assert live), and decides on what the lock holder left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_key_txns_take_the_coord_txn_lock() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("fast_lock");
    let store = connect(&base, &namespace, PostgresOptions::default()).await;
    let mut holder = admin(&base).await;
    for round in 0..2u64 {
        hold_txn_lock(&mut holder, &namespace, "k").await;
        let current = store.get("k").await.unwrap().version;
        assert_eq!(current, Version(round));
        let waiting = {
            let store = store.clone();
            tokio::spawn(async move { store.put_if("k", current, b"v".to_vec()).await })
        };
        wait_for("the single-key txn to wait for the key's lock", || async {
            let waiters = txn_lock_waiters(&mut admin(&base).await, &namespace, "k").await;
            (!waiters.is_empty()).then_some(())
        })
        .await;
        free_txn_lock(&mut holder, &namespace, "k").await;
        let out = waiting.await.unwrap().unwrap();
        assert!(out.applied, "round {round}");
    }
    assert_eq!(store.get("k").await.unwrap().version, Version(2));
}

/// Single-key increments (fast path) and two-key increments (`coord_txn`)
/// of one counter, racing: every applied increment counts, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_key_and_coord_txn_writers_never_lose_an_update() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("fast_mixed");
    let store = connect(
        &base,
        &namespace,
        PostgresOptions::default().with_max_connections(4),
    )
    .await;
    const PER_TASK: u64 = 25;
    let mut tasks = Vec::new();
    for task in 0..4u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let other = format!("other-{task}");
            for _ in 0..PER_TASK {
                if task % 2 == 0 {
                    increment(&store, "counter").await;
                    continue;
                }
                // Through coord_txn: assert two keys, write both.
                let keys = ["counter".to_owned(), other.clone()];
                loop {
                    let entries = store.snapshot(&keys).await.unwrap();
                    let n = counter(&entries[0]);
                    let out = store
                        .txn(
                            &[
                                Assert::at("counter", entries[0].version),
                                Assert::at(other.as_str(), entries[1].version),
                            ],
                            &[
                                Mutation::put("counter", (n + 1).to_string().into_bytes()),
                                Mutation::put(other.as_str(), b"x".to_vec()),
                            ],
                        )
                        .await
                        .unwrap();
                    if out.applied {
                        break;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counter = store.get("counter").await.unwrap();
    assert_eq!(counter.value.as_deref(), Some(&b"100"[..]));
    assert_eq!(counter.version, Version(4 * PER_TASK));
}

/// The fast path's rejections are `coord_txn`'s: the current entry comes
/// back, also for a tombstone and for a version beyond `i64`.
#[tokio::test]
async fn single_key_rejections_answer_the_current_entry() {
    let Some(base) = base_url() else { return };
    let namespace = unique_namespace("fast_reject");
    let store = connect(&base, &namespace, PostgresOptions::default()).await;
    assert!(applied(store.put_if("k", Version(0), b"a".to_vec())).await);
    let out = store.put_if("k", Version(0), b"b".to_vec()).await.unwrap();
    assert!(!out.applied);
    assert_eq!(
        out.current,
        vec![Entry::present("k", Version(1), b"a".to_vec())]
    );
    let out = store
        .put_if("k", Version(u64::MAX), b"b".to_vec())
        .await
        .unwrap();
    assert!(!out.applied);
    assert_eq!(out.current[0].version, Version(1));
    let deleted = store
        .txn(&[Assert::at("k", Version(1))], &[Mutation::delete("k")])
        .await
        .unwrap();
    assert!(deleted.applied);
    // A tombstone at version 2: asserting it live fails, asserting missing holds.
    let out = store.put_if("k", Version(2), b"c".to_vec()).await.unwrap();
    assert!(!out.applied);
    assert_eq!(out.current, vec![Entry::missing("k")]);
    assert!(applied(store.put_if("k", Version(0), b"c".to_vec())).await);
    assert_eq!(
        store.get("k").await.unwrap(),
        Entry::present("k", Version(3), b"c".to_vec())
    );
}

async fn ns_rows(conn: &mut PgConnection, schema: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {schema}.coord_kv WHERE ns = 'ns'");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A reclaim deletes tombstone rows for real (through both the single-key
/// statement and `coord_txn` deletes), in batches, and keeps the floor; a
/// listing's plan reads the live-row index, not the table.
#[tokio::test]
async fn reclaim_deletes_tombstone_rows_and_listings_skip_them() {
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "reclaim").await;
    let store = connect(&scoped, "ns", PostgresOptions::default()).await;
    for i in 0..300 {
        let key = format!("t/{i:03}");
        assert!(applied(store.put_if(&key, Version::MISSING, vec![])).await);
        if i % 2 == 0 {
            assert!(applied(store.delete_if(&key, Version(1))).await);
        } else {
            let out = store
                .txn(
                    &[Assert::at(key.as_str(), Version(1))],
                    &[
                        Mutation::delete(key.as_str()),
                        Mutation::put("other", b"o".to_vec()),
                    ],
                )
                .await
                .unwrap();
            assert!(out.applied);
        }
    }
    assert_eq!(ns_rows(&mut conn, &schema).await, 301);
    // Before the reclaim (and its VACUUM, after which the planner knows the
    // table holds one row and rightly scans it).
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN SELECT key FROM {schema}.coord_kv \
         WHERE ns = 'ns' AND key >= 't/' AND key < 't0' AND value IS NOT NULL ORDER BY key"
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let first = store
        .reclaim(&coord_backend::ReclaimOptions::DEFAULT.with_max_tombstones(280))
        .await
        .unwrap();
    assert_eq!((first.removed, first.more), (280, true));
    let rest = store.reclaim(&Default::default()).await.unwrap();
    assert_eq!((rest.removed, rest.more), (20, false));
    assert_eq!(
        ns_rows(&mut conn, &schema).await,
        1,
        "only the live row is left"
    );
    assert!(applied(store.put_if("t/000", Version::MISSING, b"x".to_vec())).await);
    assert_eq!(store.get("t/000").await.unwrap().version, Version(3));
    // Plans made for the namespace at hand: a pooled session's generic plan
    // walked every deleted row again on each batch (O(N²) per reclaim).
    let config: Option<Vec<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT proconfig FROM pg_proc WHERE oid = '{schema}.coord_reclaim(text,integer)'::regprocedure"
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        config,
        Some(vec!["plan_cache_mode=force_custom_plan".to_owned()]),
        "coord_reclaim must plan each batch for its namespace"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    assert!(
        plan.iter().any(|line| line.contains("coord_kv_live")),
        "the listing does not use the live-row index: {plan:#?}"
    );
}

async fn exec(conn: &mut PgConnection, statement: String) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(conn)
        .await
        .unwrap();
}

/// A reclaim refuses while a client announcing an older storage format was
/// seen recently (an announcement written as such a client's reads): the
/// tombstone it keeps is what stops that client, which ignores the floor,
/// from creating the key again at a version it had. Rows from before
/// announcements make a reclaim wait for the operator's word; a client
/// older than what a namespace requires refuses to write.
#[tokio::test]
async fn reclaim_refuses_beside_an_older_client() {
    use coord_backend::reclaim::{now_ms, ReclaimOptions, ANNOUNCEMENT_TTL, STORAGE_FORMAT};
    let Some(base) = base_url() else { return };
    let (schema, scoped, mut conn) = private_schema(&base, "formats").await;
    let store = connect(&scoped, "ns", PostgresOptions::default()).await;
    assert!(applied(store.put_if("k", Version::MISSING, b"1".to_vec())).await);
    assert!(applied(store.delete_if("k", Version(1))).await);
    let older = STORAGE_FORMAT - 1;
    exec(
        &mut conn,
        format!(
            "INSERT INTO {schema}.coord_clients VALUES ('ns', 'older', {older}, {})",
            now_ms() - 60_000
        ),
    )
    .await;
    let refused = store.reclaim(&ReclaimOptions::DEFAULT).await;
    let stopped = store
        .reclaim(&ReclaimOptions::DEFAULT.with_older_clients_stopped(true))
        .await;
    // The older client creates `k` as clients before the floor did.
    exec(
        &mut conn,
        format!(
            "INSERT INTO {schema}.coord_kv AS c VALUES ('ns', 'k', 1, 'o') ON CONFLICT (ns, key) \
             DO UPDATE SET version = c.version + 1, value = EXCLUDED.value"
        ),
    )
    .await;
    let k = store.get("k").await.unwrap();
    assert!(
        k.version > Version(2),
        "k had versions 1 and 2; the older client's create got {}: handed out twice",
        k.version
    );
    assert!(
        matches!(&refused, Err(Error::FormatMismatch { theirs, .. }) if *theirs == older),
        "{refused:?}"
    );
    assert!(
        matches!(stopped, Err(Error::FormatMismatch { .. })),
        "{stopped:?}"
    );
    assert!(applied(store.delete_if("k", k.version)).await);
    exec(
        &mut conn,
        format!(
            "UPDATE {schema}.coord_clients SET seen_ms = {} WHERE client = 'older'",
            now_ms() - ANNOUNCEMENT_TTL.as_millis() as u64 - 1000
        ),
    )
    .await;
    let done = store.reclaim(&ReclaimOptions::DEFAULT).await.unwrap();
    assert_eq!((done.removed, done.more), (1, false));

    // Rows from before announcements: refused until the operator's word.
    exec(
        &mut conn,
        format!("INSERT INTO {schema}.coord_kv VALUES ('old', 'x', 1, NULL)"),
    )
    .await;
    let legacy = connect(&scoped, "old", PostgresOptions::default()).await;
    let refused = legacy.reclaim(&ReclaimOptions::DEFAULT).await;
    assert!(
        matches!(refused, Err(Error::FormatMismatch { theirs: 0, .. })),
        "{refused:?}"
    );
    let done = legacy
        .reclaim(&ReclaimOptions::DEFAULT.with_older_clients_stopped(true))
        .await
        .unwrap();
    assert_eq!(done.removed, 1);
    assert!(legacy.reclaim(&ReclaimOptions::DEFAULT).await.is_ok());

    // A namespace a newer coord requires: a new client refuses to write.
    exec(
        &mut conn,
        format!(
            "UPDATE {schema}.coord_clients SET format = {} WHERE ns = 'ns' AND client = ''",
            STORAGE_FORMAT + 1
        ),
    )
    .await;
    let newer = connect(&scoped, "ns", PostgresOptions::default()).await;
    let refused = newer.put_if("n", Version::MISSING, b"n".to_vec()).await;
    assert!(
        matches!(&refused, Err(Error::FormatMismatch { theirs, .. }) if *theirs == STORAGE_FORMAT + 1),
        "{refused:?}"
    );
    assert!(!newer.get("n").await.unwrap().exists());
    drop((store, legacy, newer));
    exec(&mut conn, format!("DROP SCHEMA {schema} CASCADE")).await;
}

// ---------------------------------------------------------------- several hosts

/// libpq's multi-host URLs (`coord_postgres::servers`).
mod multi_host {
    use super::*;

    /// `base` with `first` written before its own host.
    fn hosts_before(base: &str, first: &str) -> String {
        let (head, host, tail) = split_host(base);
        with_params(&format!("{head}{first},{host}{tail}"), "sslmode=disable")
    }

    fn closed_port() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        addr
    }

    #[tokio::test]
    async fn a_dead_first_host_is_skipped() {
        let Some(base) = base_url() else { return };
        let url = hosts_before(&base, &closed_port().to_string());
        let store = connect_within(&url, &unique_namespace("multi"), Duration::from_secs(2))
            .await
            .unwrap();
        let put = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"v".to_vec())],
            )
            .await
            .unwrap();
        assert!(put.applied);
    }

    #[tokio::test]
    async fn no_host_answering_is_unavailable_and_names_each() {
        let (a, b) = (closed_port(), closed_port());
        let url = format!("postgres://postgres:s3cret@{a},{b}/postgres?sslmode=disable");
        let result = connect_within(&url, "down", Duration::from_secs(1)).await;
        let Err(Error::Unavailable { message, .. }) = &result else {
            panic!("{result:?}");
        };
        assert!(message.contains(&a.to_string()), "{message}");
        assert!(message.contains(&b.to_string()), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
        assert!(!format!("{result:?}").contains("s3cret"));
    }

    #[tokio::test]
    async fn unsupported_session_attrs_are_config_errors() {
        let Some(base) = base_url() else { return };
        let url = with_params(
            &hosts_before(&base, &closed_port().to_string()),
            "target_session_attrs=standby",
        );
        let result = connect_within(&url, "attrs", Duration::from_secs(1)).await;
        assert!(
            matches!(&result, Err(Error::Config(m)) if m.contains("standby")),
            "{result:?}"
        );
    }

    /// The first host dies (its port closes and its sessions drop): the
    /// store's next calls fail at most a few times (each says what it
    /// knows), then go to the second host, without reconnecting by hand.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_follows_when_the_first_host_dies() {
        let Some(base) = base_url() else { return };
        let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
        let url = hosts_before(&base, &proxy.addr().to_string());
        let store = connect_within(&url, &unique_namespace("follow"), Duration::from_secs(2))
            .await
            .unwrap();
        let first = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"1".to_vec())],
            )
            .await
            .unwrap();
        assert!(first.applied);
        drop(proxy);
        let mut failures = Vec::new();
        let entry = loop {
            match store.get("k").await {
                Ok(entry) => break entry,
                Err(error) => {
                    assert!(
                        matches!(error, Error::Unavailable { .. }),
                        "a read fails as Unavailable: {error:?}"
                    );
                    failures.push(error);
                    assert!(failures.len() <= 3, "never followed: {failures:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        // Both hosts are the same server here: the write is there.
        assert_eq!(entry.value.as_deref(), Some(&b"1"[..]));
        let second = store
            .txn(
                &[Assert::at("k", entry.version)],
                &[Mutation::put("k", b"2".to_vec())],
            )
            .await
            .unwrap();
        assert!(second.applied);
    }

    /// Forward every connection accepted on `addr` to `upstream`.
    async fn forward(addr: std::net::SocketAddr, upstream: std::net::SocketAddr) {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
    }

    /// The first host dies while the second does not answer yet (a standby
    /// not yet promoted): a call made then waits, and goes to the second
    /// host soon after it answers, not after its own session timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_follows_a_promotion_that_comes_later() {
        let Some(base) = base_url() else { return };
        let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
        let second = closed_port();
        let (head, _, tail) = split_host(&base);
        let url = with_params(
            &format!("{head}{},{second}{tail}", proxy.addr()),
            "sslmode=disable",
        );
        // Long enough that a call waiting for it is told apart from one that
        // followed the promotion.
        let timeout = Duration::from_secs(30);
        let store = connect_within(&url, &unique_namespace("promote"), timeout)
            .await
            .unwrap();
        let first = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"1".to_vec())],
            )
            .await
            .unwrap();
        assert!(first.applied);
        drop(proxy);
        let upstream = upstream(&base).await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            forward(second, upstream).await;
        });
        let started = std::time::Instant::now();
        let mut failures = Vec::new();
        let entry = loop {
            match store.get("k").await {
                Ok(entry) => break entry,
                Err(error) => {
                    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
                    failures.push(error);
                    assert!(failures.len() <= 3, "never followed: {failures:?}");
                }
            }
        };
        assert_eq!(entry.value.as_deref(), Some(&b"1"[..]));
        assert!(
            started.elapsed() < timeout / 2,
            "the call waited {:?}, as for its session timeout ({timeout:?}): {failures:?}",
            started.elapsed()
        );
    }

    /// On the replicated topology of `scripts/ha` (`COORD_HA_POSTGRES_URL`):
    /// a standby written first in the list is skipped; a list of standbys
    /// only is `Unavailable`, naming each as read-only.
    #[tokio::test]
    async fn a_standby_is_skipped() {
        let Some(ha) = coord_conformance::server_env("COORD_HA_POSTGRES_URL") else {
            return;
        };
        let (head, rest) = ha.split_once('@').unwrap();
        let (hosts, tail) = rest.split_at(rest.find('/').unwrap());
        let db = tail.split('?').next().unwrap();
        let mut standbys = Vec::new();
        let mut primaries = Vec::new();
        for host in hosts.split(',') {
            let one = format!("{head}@{host}{db}");
            let Ok(mut conn) = PgConnection::connect(&one).await else {
                continue;
            };
            let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            if in_recovery {
                standbys.push(host.to_owned());
            } else {
                primaries.push(host.to_owned());
            }
        }
        let (Some(standby), Some(primary)) = (standbys.first(), primaries.first()) else {
            panic!("{ha} has no standby and primary up: {standbys:?} {primaries:?}");
        };
        let url = format!("{head}@{standby},{primary}{db}");
        let namespace = unique_namespace("standby");
        let store = connect_within(&url, &namespace, Duration::from_secs(2))
            .await
            .unwrap();
        let put = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"v".to_vec())],
            )
            .await
            .unwrap();
        assert!(put.applied);
        let mut on_primary = admin(&format!("{head}@{primary}{db}")).await;
        let stored: i64 =
            sqlx::query_scalar("SELECT count(*) FROM coord_kv WHERE ns = $1 AND key = 'k'")
                .bind(&namespace)
                .fetch_one(&mut on_primary)
                .await
                .unwrap();
        assert_eq!(stored, 1);

        let only_standby = format!("{head}@{standby},{standby}{db}");
        let result = connect_within(&only_standby, "ro", Duration::from_secs(2)).await;
        let Err(Error::Unavailable { message, .. }) = &result else {
            panic!("{result:?}");
        };
        assert!(message.contains("read-only"), "{message}");
        assert!(message.contains(standby.as_str()), "{message}");
    }
}

// ---------------------------------------------------------------- poolers

/// PgBouncer in front of the primary of `scripts/ha` (`COORD_HA_PGBOUNCER_*_URL`).
mod pgbouncer {
    use super::*;

    /// Transaction pooling, declared by `pooler=transaction` (connect's probe
    /// can miss it while other clients keep the pooler busy): no
    /// notifications (their waiters poll), calls work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transaction_pooling_offers_no_notifications() {
        let Some(url) = coord_conformance::server_env("COORD_HA_PGBOUNCER_TX_URL") else {
            return;
        };
        let url = with_params(&url, "pooler=transaction");
        let store = connect_within(&url, &unique_namespace("pooled"), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            store.changes().is_none(),
            "LISTEN through a transaction pooler"
        );
        let put = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"v".to_vec())],
            )
            .await
            .unwrap();
        assert!(put.applied);
        assert_eq!(store.get("k").await.unwrap().version, Version(1));
    }

    /// Session pooling: txns, reads and change notifications work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn session_pooling_works() {
        let Some(url) = coord_conformance::server_env("COORD_HA_PGBOUNCER_SESSION_URL") else {
            return;
        };
        let store = connect_within(&url, &unique_namespace("bouncer"), Duration::from_secs(5))
            .await
            .unwrap();
        let mut watch = store.changes().unwrap().watch("k").await.unwrap();
        let put = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"v".to_vec())],
            )
            .await
            .unwrap();
        assert!(put.applied);
        tokio::time::timeout(Duration::from_secs(30), watch.changed())
            .await
            .expect("a notification through the pooler")
            .unwrap();
        assert_eq!(
            store.get("k").await.unwrap().value.as_deref(),
            Some(&b"v"[..])
        );
    }
}

/// `pooler=transaction` straight to PostgreSQL: the transaction-pooled mode
/// (docs/shapes.md, "Poolers") without a pooler, so that its fault model can
/// be checked through a `FaultProxy`.
mod declared_pooler {
    use super::*;

    fn pooled(base: &str) -> String {
        with_params(base, "pooler=transaction")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn declared_pooler_runs_without_session_state() {
        let Some(base) = suite_base() else { return };
        let store = connect(
            &pooled(&base),
            &unique_namespace("declared"),
            PostgresOptions::default(),
        )
        .await;
        assert!(store.changes().is_none());
        let put = store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", b"v".to_vec())],
            )
            .await
            .unwrap();
        assert_eq!(put.written, vec![("k".to_owned(), Version(1))]);
    }

    /// The reply of a pooled txn is cut after the whole message (BEGIN …
    /// COMMIT) reached the server: `Indeterminate`, and the txn committed.
    /// The marker travels in the key (values are sent as hex).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_reply_is_indeterminate_and_committed() {
        let Some(base) = base_url() else { return };
        let namespace = unique_namespace("pooled_lost");
        let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
        let proxied = connect(
            &pooled(&via(&base, proxy.addr())),
            &namespace,
            PostgresOptions::default()
                .with_max_connections(1)
                .with_ping_idle_after(None),
        )
        .await;
        assert!(proxied.get("k").await.unwrap().version.is_missing());
        for multi in [false, true] {
            let key = format!("marker-{}-{multi}", unique_namespace("m"));
            proxy.cut_next_reply(key.as_bytes());
            let mut puts = vec![Mutation::put(key.as_str(), b"v".to_vec())];
            if multi {
                // Not the single-key shape: coord_txn.
                puts.push(Mutation::put("other", b"w".to_vec()));
            }
            let result = proxied.txn(&[Assert::missing(key.as_str())], &puts).await;
            assert!(
                matches!(result, Err(Error::Indeterminate { .. })),
                "a lost txn reply must be Indeterminate, got {result:?}"
            );
            let fresh = connect(&base, &namespace, PostgresOptions::default()).await;
            assert_eq!(fresh.get(&key).await.unwrap().version, Version(1));
        }
        assert_eq!(proxy.cuts(), 2);
    }

    /// A transaction-rollback error raised at the explicit COMMIT (a
    /// deferred constraint trigger), or an error of the statement itself:
    /// rolled back, `Unavailable`; the connection is not lent again in an
    /// aborted transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rollbacks_are_unavailable() {
        let Some(base) = base_url() else { return };
        let (schema, scoped, mut conn) = private_schema(&base, "pooled_rollback").await;
        let store = connect(
            &pooled(&scoped),
            "rollback",
            PostgresOptions::default().with_max_connections(1),
        )
        .await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            r#"
            CREATE FUNCTION {schema}.fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.key LIKE 'doomed-%' THEN
                    RAISE EXCEPTION 'injected' USING ERRCODE = substr(NEW.key, 8, 5);
                END IF;
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT OR UPDATE ON {schema}.coord_kv
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.fail_at_commit();
            CREATE FUNCTION {schema}.fail_now() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.key LIKE 'now-%' THEN
                    RAISE EXCEPTION 'injected' USING ERRCODE = 'P0001';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER fail_now BEFORE INSERT ON {schema}.coord_kv
                FOR EACH ROW EXECUTE FUNCTION {schema}.fail_now();
            "#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let mut results = Vec::new();
        for key in ["doomed-40001", "doomed-40P01", "now-1"] {
            for multi in [false, true] {
                let mut puts = vec![Mutation::put(key, b"v".to_vec())];
                if multi {
                    puts.push(Mutation::put(format!("{key}-2"), b"w".to_vec()));
                }
                let txn = store.txn(&[Assert::missing(key)], &puts).await;
                let stored = store.get(key).await;
                results.push((key, multi, txn, stored));
            }
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut conn)
            .await
            .unwrap();
        for (key, multi, txn, stored) in results {
            assert!(
                matches!(txn, Err(Error::Unavailable { .. })),
                "{key} (multi {multi}) rolled back: must be Unavailable, got {txn:?}"
            );
            assert!(stored.unwrap().version.is_missing(), "{key}: rolled back");
        }
    }
}

/// The namespace's rows of the three tables, as JSON.
async fn dump_namespace(conn: &mut PgConnection, namespace: &str) -> serde_json::Value {
    use sqlx::Row;
    let kv = sqlx::query(
        "SELECT key, version, encode(value, 'hex') AS value FROM coord_kv WHERE ns = $1 ORDER BY key",
    )
    .bind(namespace)
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .iter()
    .map(|r| {
        serde_json::json!({
            "key": r.get::<String, _>("key"),
            "version": r.get::<i64, _>("version"),
            "value": r.get::<Option<String>, _>("value"),
        })
    })
    .collect::<Vec<_>>();
    let floor = sqlx::query("SELECT floor FROM coord_floor WHERE ns = $1")
        .bind(namespace)
        .fetch_optional(&mut *conn)
        .await
        .unwrap()
        .map(|r| r.get::<i64, _>("floor"));
    let clients = sqlx::query(
        "SELECT client, format, seen_ms FROM coord_clients WHERE ns = $1 ORDER BY client",
    )
    .bind(namespace)
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .iter()
    .map(|r| {
        serde_json::json!({
            "client": r.get::<String, _>("client"),
            "format": r.get::<i32, _>("format"),
            "seen_ms": r.get::<i64, _>("seen_ms"),
        })
    })
    .collect::<Vec<_>>();
    serde_json::json!({ "coord_kv": kv, "coord_floor": floor, "coord_clients": clients })
}

/// Insert the dumped rows under `namespace` (into this release's tables: a
/// release that changes them restores this dump into a database made with
/// the old tables first, then lets its own migration run).
async fn restore_namespace(conn: &mut PgConnection, namespace: &str, rows: &serde_json::Value) {
    for row in rows["coord_kv"].as_array().unwrap() {
        sqlx::query(
            "INSERT INTO coord_kv (ns, key, version, value) VALUES ($1, $2, $3, decode($4, 'hex'))",
        )
        .bind(namespace)
        .bind(row["key"].as_str().unwrap())
        .bind(row["version"].as_i64().unwrap())
        .bind(row["value"].as_str())
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    if let Some(floor) = rows["coord_floor"].as_i64() {
        sqlx::query("INSERT INTO coord_floor (ns, floor) VALUES ($1, $2)")
            .bind(namespace)
            .bind(floor)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    for row in rows["coord_clients"].as_array().unwrap() {
        sqlx::query(
            "INSERT INTO coord_clients (ns, client, format, seen_ms) VALUES ($1, $2, $3, $4)",
        )
        .bind(namespace)
        .bind(row["client"].as_str().unwrap())
        .bind(row["format"].as_i64().unwrap() as i32)
        .bind(row["seen_ms"].as_i64().unwrap())
        .execute(&mut *conn)
        .await
        .unwrap();
    }
}

/// A namespace written by the release that introduced storage format 3,
/// restored row by row from its dump (`tests/golden/format-3.json`), reads
/// the same keys, versions and values with this release, and versions
/// continue above them and above the floor (`coord_conformance::golden`).
/// `COORD_WRITE_GOLDEN=1` writes the dump of the current format (for a NEW
/// format only: the old ones stay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_format_3_is_read_by_this_release() {
    const FORMAT: u32 = 3;
    let Some(base) = base_url() else {
        return;
    };
    if std::env::var_os("COORD_WRITE_GOLDEN").is_some() {
        let namespace = unique_namespace("golden");
        let store = connect(&base, &namespace, PostgresOptions::default()).await;
        if let Err(failure) = coord_conformance::golden::write_namespace(&store).await {
            panic!("{}", failure.message);
        }
        let mut conn = PgConnection::connect(&base).await.unwrap();
        let dump = dump_namespace(&mut conn, &namespace).await;
        coord_conformance::golden::save_dump(env!("CARGO_MANIFEST_DIR"), dump);
        return;
    }
    let dump = coord_conformance::golden::load_dump(env!("CARGO_MANIFEST_DIR"), FORMAT);
    let namespace = unique_namespace("golden_read");
    // The tables exist once a client of this release connected.
    let store = connect(&base, &namespace, PostgresOptions::default()).await;
    let mut conn = PgConnection::connect(&base).await.unwrap();
    restore_namespace(&mut conn, &namespace, &dump).await;
    if let Err(failure) = coord_conformance::golden::read_back(&store).await {
        panic!("{}", failure.message);
    }
}

// ---------------------------------------------------------------- in the caller's transaction

/// `InTransaction` (crate docs, "In the caller's transaction") and the
/// `fenced` helper, on the real server; plus every suite but `reclaim`
/// through a backend that opens an `InTransaction` per call and commits
/// right after it.
mod in_transaction {
    use super::*;
    use coord_adapters::board::TaskSpec;
    use coord_adapters::{Board, BoardAdapter, BoardError};
    use coord_backend::{InvalidInput, ReclaimOptions};
    use coord_postgres::fenced::{FencedTable, FencedWrite};
    use coord_postgres::{InTransaction, TransactionOptions};
    use sqlx::postgres::{PgPool, PgPoolOptions};

    /// The server for these tests (`None`: SKIPPED), a fresh namespace, a
    /// pooled store in it (which creates the schema), and a plain pool.
    async fn setup(label: &str) -> Option<(String, String, PostgresBackend, PgPool)> {
        let base = suite_base()?;
        let namespace = unique_namespace(label);
        let pooled = connect(&base, &namespace, PostgresOptions::default()).await;
        let pool = pool(&base, 4).await;
        Some((base, namespace, pooled, pool))
    }

    /// A caller's transaction for the outbox's in-transaction checks.
    struct Caller(Arc<InTransaction>);

    #[coord_adapters::async_trait]
    impl coord_conformance::outbox::CallerTransaction for Caller {
        fn backend(&self) -> Arc<dyn Backend> {
            self.0.clone()
        }
        async fn commit(&self) -> coord_backend::Result<()> {
            self.0.commit().await
        }
        async fn rollback(&self) -> coord_backend::Result<()> {
            self.0.rollback().await
        }
    }

    /// The outbox's in-transaction checks on the database at `url`.
    async fn outbox_in_transactions_at(url: &str, label: &str) {
        outbox_in_transactions_with(url, label, TransactionOptions::default()).await;
    }

    /// [`outbox_in_transactions_at`], each transaction begun with `options`.
    async fn outbox_in_transactions_with(url: &str, label: &str, options: TransactionOptions) {
        use coord_conformance::outbox::{in_transactions, BeginTransaction, CallerTransaction};
        let namespace = unique_namespace(label);
        let pooled = connect(url, &namespace, PostgresOptions::default()).await;
        let pool = pool(url, 8).await;
        let begin: BeginTransaction = Arc::new(move || {
            let (pool, namespace) = (pool.clone(), namespace.clone());
            Box::pin(async move {
                let tx = InTransaction::begin_with(&pool, &namespace, options).await?;
                Ok(Arc::new(Caller(tx)) as Arc<dyn CallerTransaction>)
            })
        });
        in_transactions(begin, Arc::new(pooled))
            .await
            .unwrap_or_else(|f| panic!("outbox in PostgreSQL transactions ({label}): {f}"));
    }

    /// The outbox in callers' transactions: rolled back never runs,
    /// committed runs once, one key enqueued by two transactions is one
    /// intent; also on databases whose sessions default to REPEATABLE READ
    /// and SERIALIZABLE (`begin` opens READ COMMITTED whatever the default).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outbox_in_transactions() {
        let Some(base) = suite_base() else { return };
        outbox_in_transactions_at(&base, "outbox-tx").await;
        for (name, isolation) in [
            ("coord_rr", "repeatable read"),
            ("coord_ser", "serializable"),
        ] {
            let url = isolation_database_once(&base, name, isolation)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            outbox_in_transactions_at(&url, &format!("outbox-tx-{name}")).await;
        }
    }

    /// The same through PgBouncer (scripts/ha), in session pooling and in
    /// transaction pooling: there (PgBouncer 1.18, no prepared statements
    /// kept per client) the transactions are begun
    /// `behind_transaction_pooler`, the pooled store declared
    /// `pooler=transaction`. Without the option the first coord statement
    /// fails: "prepared statement "sqlx_s_1" does not exist".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outbox_in_transactions_through_pgbouncer() {
        if let Some(url) = coord_conformance::server_env("COORD_HA_PGBOUNCER_SESSION_URL") {
            outbox_in_transactions_at(&url, "outbox-tx-bouncer-session").await;
        }
        if let Some(url) = coord_conformance::server_env("COORD_HA_PGBOUNCER_TX_URL") {
            let url = with_params(&url, "pooler=transaction");
            let options = TransactionOptions::default().behind_transaction_pooler();
            outbox_in_transactions_with(&url, "outbox-tx-bouncer-tx", options).await;
        }
    }

    async fn pool(url: &str, max: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .connect(url)
            .await
            .unwrap()
    }

    /// Whether an answered txn applied (an error fails the test).
    #[track_caller]
    fn applied(result: Result<TxnOutcome, Error>) -> bool {
        match result {
            Ok(outcome) => outcome.applied,
            Err(error) => panic!("{error:?}"),
        }
    }

    fn put(key: &str, value: &str) -> Mutation {
        Mutation::put(key, value.as_bytes().to_vec())
    }

    async fn value(store: &dyn Backend, key: &str) -> Option<Vec<u8>> {
        store.get(key).await.unwrap().value
    }

    #[track_caller]
    fn assert_finished<T: std::fmt::Debug>(result: &Result<T, Error>) {
        assert!(
            matches!(result, Err(Error::InvalidInput(InvalidInput::Argument(m))) if m.contains("finished")),
            "{result:?}"
        );
    }

    /// A table of the caller's own rows.
    async fn orders_table(base: &str, label: &str) -> String {
        let table = format!("intx_{}", unique_namespace(label).replace('-', "_"));
        exec(
            &mut admin(base).await,
            format!(
                "CREATE TABLE {table} (id text PRIMARY KEY, status text NOT NULL, fence bigint)"
            ),
        )
        .await;
        table
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_are_seen_inside_only_until_commit_and_never_after_rollback() {
        let Some((_, namespace, pooled, pool)) = setup("intx_visibility").await else {
            return;
        };
        // Rolled back: a coord_txn (two keys) and a fast-path write (one).
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert_eq!(tx.store_name(), "postgres-in-transaction");
        assert!(applied(tx.txn(&[], &[put("a", "1"), put("b", "1")]).await));
        assert!(applied(
            tx.txn(&[Assert::missing("c")], &[put("c", "1")]).await
        ));
        assert_eq!(value(&*tx, "a").await.as_deref(), Some(&b"1"[..]));
        assert_eq!(tx.get("c").await.unwrap().version, Version(1));
        assert_eq!(tx.keys("").await.unwrap(), ["a", "b", "c"]);
        assert_eq!(tx.first_keys("", 2).await.unwrap(), ["a", "b"]);
        assert!(pooled.keys("").await.unwrap().is_empty());
        assert_eq!(value(&pooled, "a").await, None);
        tx.rollback().await.unwrap();
        assert!(pooled.keys("").await.unwrap().is_empty());

        // Committed: visible to the pooled store, versions as it would give them.
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(tx.txn(&[], &[put("a", "2"), put("b", "2")]).await));
        assert!(applied(
            tx.txn(&[Assert::missing("c")], &[put("c", "2")]).await
        ));
        // A rejected assert is a plain rejection with the current entry.
        let rejected = tx
            .txn(&[Assert::missing("c")], &[put("c", "3")])
            .await
            .unwrap();
        assert!(!rejected.applied);
        assert_eq!(
            rejected.current,
            [Entry::present("c", Version(1), b"2".to_vec())]
        );
        assert!(pooled.keys("").await.unwrap().is_empty());
        tx.commit().await.unwrap();
        assert_eq!(pooled.keys("").await.unwrap(), ["a", "b", "c"]);
        assert_eq!(
            pooled.get("c").await.unwrap(),
            Entry::present("c", Version(1), b"2".to_vec())
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn business_rows_and_board_tasks_commit_and_roll_back_together() {
        let Some((base, namespace, pooled, pool)) = setup("intx_board").await else {
            return;
        };
        let table = orders_table(&base, "orders").await;
        let board = BoardAdapter::new(Arc::new(pooled.clone()));
        for (id, commit) in [("o1", false), ("o2", true)] {
            let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {table} (id, status) VALUES ($1, 'new')"
            )))
            .bind(id)
            .execute(&mut *tx.conn().await.unwrap())
            .await
            .unwrap();
            let in_tx = BoardAdapter::new(tx.clone());
            in_tx
                .add(TaskSpec::new(format!("ship-{id}"), id))
                .await
                .unwrap();
            // Seen inside, not outside.
            assert_eq!(
                in_tx.get(&format!("ship-{id}")).await.unwrap().payload,
                id.as_bytes()
            );
            assert!(matches!(
                board.get(&format!("ship-{id}")).await,
                Err(BoardError::NotFound { .. })
            ));
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
        }
        assert!(matches!(
            board.get("ship-o1").await,
            Err(BoardError::NotFound { .. })
        ));
        assert_eq!(board.get("ship-o2").await.unwrap().payload, b"o2");
        let ids: Vec<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT id FROM {table}")))
                .fetch_all(&mut admin(&base).await)
                .await
                .unwrap();
        assert_eq!(ids, ["o2"]);
        exec(&mut admin(&base).await, format!("DROP TABLE {table}")).await;
    }

    /// Two transactions race to create the same record: the second waits
    /// for the first's advisory lock; after the first commits it sees a
    /// plain rejection with the winner's entry, and both commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_transactions_create_one_record() {
        let Some((_, namespace, pooled, pool)) = setup("intx_race").await else {
            return;
        };
        let first = InTransaction::begin(&pool, &namespace).await.unwrap();
        let second = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(
            first
                .txn(&[Assert::missing("r")], &[put("r", "first")])
                .await
        ));
        let racing = {
            let second = second.clone();
            tokio::spawn(async move {
                second
                    .txn(&[Assert::missing("r")], &[put("r", "second")])
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !racing.is_finished(),
            "the second txn must wait for the first's lock"
        );
        first.commit().await.unwrap();
        let lost = racing.await.unwrap().unwrap();
        assert!(!lost.applied);
        assert_eq!(
            lost.current,
            [Entry::present("r", Version(1), b"first".to_vec())]
        );
        second.commit().await.unwrap();
        assert_eq!(
            pooled.get("r").await.unwrap(),
            Entry::present("r", Version(1), b"first".to_vec())
        );
    }

    /// Two transactions claim the same board task at once: exactly one
    /// claim commits. The other is aborted by PostgreSQL's deadlock
    /// detection (`Unavailable` with 40P01; its transaction rolls back):
    /// each engine confirmed its first guess ("missing") with an assert-only
    /// txn, which locks the record shared until COMMIT, and then both need
    /// it exclusive to claim. (Had only one of them taken the shared lock,
    /// the other would wait for the winner's COMMIT and find the task
    /// `AlreadyClaimed`: also accepted.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_claims_grant_one() {
        let Some((_, namespace, pooled, pool)) = setup("intx_claims").await else {
            return;
        };
        let board = BoardAdapter::new(Arc::new(pooled.clone()));
        board.add(TaskSpec::new("job", "x")).await.unwrap();
        let txs = [
            InTransaction::begin(&pool, &namespace).await.unwrap(),
            InTransaction::begin(&pool, &namespace).await.unwrap(),
        ];
        let mut claims = tokio::task::JoinSet::new();
        for (i, tx) in txs.iter().enumerate() {
            let tx = tx.clone();
            claims.spawn(async move {
                let claimed = BoardAdapter::new(tx)
                    .claim("job", &format!("agent-{i}"), Duration::from_secs(60))
                    .await;
                (i, claimed)
            });
        }
        let mut winners = Vec::new();
        let mut losses = Vec::new();
        while let Some(done) = claims.join_next().await {
            let (i, claimed) = done.unwrap();
            match claimed {
                Ok(claimed) => {
                    txs[i].commit().await.unwrap();
                    winners.push((i, claimed));
                }
                Err(BoardError::AlreadyClaimed { agent, .. }) => {
                    losses.push(format!("already claimed by {agent}"));
                    txs[i].commit().await.unwrap();
                }
                Err(BoardError::Store(error @ Error::Unavailable { .. }))
                    if format!("{error:?}").contains("40P01") =>
                {
                    losses.push("deadlock".to_owned());
                    assert_unavailable(&txs[i].commit().await);
                }
                Err(other) => panic!("agent-{i}: {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "{losses:?}");
        let (winner, claimed) = winners.pop().unwrap();
        if let [loss] = &losses[..] {
            assert!(
                loss == "deadlock" || *loss == format!("already claimed by agent-{winner}"),
                "{loss}"
            );
        }
        let task = board.get("job").await.unwrap();
        assert_eq!(task.fence, claimed.fence);
        assert!(
            matches!(task.state, coord_adapters::board::TaskState::Claimed { agent, .. } if agent == format!("agent-{winner}"))
        );
    }

    /// Two transactions taking two coord keys in opposite orders deadlock;
    /// PostgreSQL aborts one (40P01): `Unavailable`, and its commit is
    /// refused; the other applies and commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crossing_transactions_deadlock_into_unavailable() {
        let Some((_, namespace, pooled, pool)) = setup("intx_deadlock").await else {
            return;
        };
        let one = InTransaction::begin(&pool, &namespace).await.unwrap();
        let two = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(one.txn(&[], &[put("x", "one")]).await));
        assert!(applied(two.txn(&[], &[put("y", "two")]).await));
        let crossing = |tx: Arc<InTransaction>, key: &'static str, v: &'static str| {
            tokio::spawn(async move { tx.txn(&[], &[put(key, v)]).await })
        };
        let a = crossing(one.clone(), "y", "one");
        let b = crossing(two.clone(), "x", "two");
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let (survivor, victim, victim_result, survivor_result) = match (&a, &b) {
            (Err(_), Ok(_)) => (two, one, a, b),
            (Ok(_), Err(_)) => (one, two, b, a),
            other => panic!("exactly one must lose the deadlock: {other:?}"),
        };
        assert_unavailable(&victim_result);
        assert!(
            format!("{victim_result:?}").contains("40P01"),
            "{victim_result:?}"
        );
        assert!(applied(survivor_result));
        assert_unavailable(&victim.commit().await);
        survivor.commit().await.unwrap();
        let x = value(&pooled, "x").await.unwrap();
        let y = value(&pooled, "y").await.unwrap();
        assert_eq!(x, y, "the survivor wrote both keys");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_after_commit_or_rollback_are_refused_and_send_nothing() {
        let Some((base, namespace, _, _)) = setup("intx_finished").await else {
            return;
        };
        // One connection: the finished transaction must have given it back.
        let pool = pool(&base, 1).await;
        for end in ["commit", "rollback"] {
            let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
            assert!(applied(tx.txn(&[], &[put(end, "1")]).await));
            match end {
                "commit" => tx.commit().await.unwrap(),
                _ => tx.rollback().await.unwrap(),
            }
            assert_finished(&tx.txn(&[], &[put("k", "1")]).await);
            assert_finished(&tx.snapshot(&["k".to_owned()]).await);
            assert_finished(&tx.keys("").await);
            assert_finished(&tx.first_keys("", 1).await);
            assert_finished(&tx.conn().await.map(|_| ()));
            assert_finished(&tx.commit().await);
            assert_finished(&tx.rollback().await);
            // The only connection is free: the finished one holds none.
            let other = tokio::time::timeout(Duration::from_secs(5), pool.begin())
                .await
                .expect("the pool's one connection was given back")
                .unwrap();
            other.rollback().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_and_reclaim_are_refused() {
        let Some((_, namespace, _, pool)) = setup("intx_watch").await else {
            return;
        };
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        let changes = tx.changes().expect("a Changes that refuses");
        match changes.watch("").await {
            Err(Error::Unsupported { what, store }) => {
                assert_eq!(
                    what,
                    "waiting for other clients' commits inside a caller's transaction"
                );
                assert_eq!(store, "postgres-in-transaction");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            tx.reclaim(&ReclaimOptions::default()).await,
            Err(Error::Unsupported { .. })
        ));
        // Neither touched the transaction.
        assert!(applied(tx.txn(&[], &[put("k", "1")]).await));
        tx.commit().await.unwrap();
    }

    /// A transaction the caller began at REPEATABLE READ: every coord txn
    /// (fast path and coord_txn) is `Config` naming READ COMMITTED, and the
    /// transaction can no longer commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeatable_read_transaction_is_refused_with_a_config_error() {
        let Some((_, namespace, pooled, pool)) = setup("intx_rr").await else {
            return;
        };
        for shape in ["single", "multi"] {
            let raw = pool
                .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
                .await
                .unwrap();
            let tx = InTransaction::from_transaction(raw, &namespace).unwrap();
            // Reads work at any level.
            assert!(tx.get("k").await.unwrap().version.is_missing());
            let result = match shape {
                "single" => tx.txn(&[Assert::missing("k")], &[put("k", "1")]).await,
                _ => tx.txn(&[], &[put("k", "1"), put("l", "1")]).await,
            };
            assert!(
                matches!(&result, Err(Error::Config(m)) if m.contains("READ COMMITTED")),
                "{shape}: {result:?}"
            );
            assert_unavailable(&tx.get("k").await);
            assert_unavailable(&tx.commit().await);
        }
        assert!(pooled.keys("").await.unwrap().is_empty());
    }

    /// `begin` runs at READ COMMITTED on a database whose sessions default
    /// to REPEATABLE READ.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn begin_is_read_committed_whatever_the_database_default() {
        let Some(base) = suite_base() else { return };
        let url = isolation_database_once(&base, "coord_rr", "repeatable read")
            .await
            .unwrap();
        let namespace = unique_namespace("intx_rr_default");
        let pooled = connect(&url, &namespace, PostgresOptions::default()).await;
        let pool = pool(&url, 2).await;
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        let level: String = sqlx::query_scalar("SHOW transaction_isolation")
            .fetch_one(&mut *tx.conn().await.unwrap())
            .await
            .unwrap();
        assert_eq!(level, "read committed");
        assert!(applied(
            tx.txn(&[Assert::missing("k")], &[put("k", "1")]).await
        ));
        assert!(applied(tx.txn(&[], &[put("k", "2"), put("l", "2")]).await));
        tx.commit().await.unwrap();
        assert_eq!(pooled.get("k").await.unwrap().version, Version(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_schema_is_a_config_error_naming_the_fix() {
        let Some(base) = suite_base() else { return };
        let (schema, scoped, mut conn) = private_schema(&base, "intx_noschema").await;
        let pool = pool(&scoped, 1).await;
        for call in ["snapshot", "txn"] {
            let tx = InTransaction::begin(&pool, "ns").await.unwrap();
            let result = match call {
                "snapshot" => tx.get("k").await.map(|_| ()),
                _ => tx.txn(&[], &[put("k", "1")]).await.map(|_| ()),
            };
            assert!(
                matches!(&result, Err(Error::Config(m)) if m.contains("connect a PostgresBackend once")),
                "{call}: {result:?}"
            );
            tx.rollback().await.unwrap();
        }
        pool.close().await;
        exec(&mut conn, format!("DROP SCHEMA {schema} CASCADE")).await;
    }

    /// A failed statement of the caller's own aborts the transaction: sqlx
    /// would report its COMMIT (a silent ROLLBACK) as a success; `commit`
    /// says `Unavailable`, and nothing of it is applied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_statement_of_the_caller_makes_commit_unavailable() {
        let Some((_, namespace, pooled, pool)) = setup("intx_aborted").await else {
            return;
        };
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(tx.txn(&[], &[put("k", "1")]).await));
        let failed = sqlx::query("SELECT 1 / 0")
            .execute(&mut *tx.conn().await.unwrap())
            .await;
        assert!(failed.is_err());
        // Every later coord call is refused by the server (25P02)…
        assert_unavailable(&tx.get("k").await);
        let tx2 = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(tx2.txn(&[], &[put("m", "1")]).await));
        let failed = sqlx::query("SELECT 1 / 0")
            .execute(&mut *tx2.conn().await.unwrap())
            .await;
        assert!(failed.is_err());
        // …and a commit is refused, with or without a coord call after the failure.
        assert_unavailable(&tx.commit().await);
        assert_unavailable(&tx2.commit().await);
        assert!(pooled.keys("").await.unwrap().is_empty());
    }

    /// A COMMIT the server refuses (a deferred unique constraint checked at
    /// COMMIT): `Unavailable`, and neither the caller's rows nor the coord
    /// writes are applied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_the_server_refuses_is_unavailable() {
        let Some((base, namespace, pooled, pool)) = setup("intx_refused").await else {
            return;
        };
        let table = format!("intx_{}", unique_namespace("deferred").replace('-', "_"));
        exec(
            &mut admin(&base).await,
            format!(
                "CREATE TABLE {table} (v int, CONSTRAINT {table}_v UNIQUE (v) DEFERRABLE \
                 INITIALLY DEFERRED)"
            ),
        )
        .await;
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(tx.txn(&[], &[put("k", "1")]).await));
        exec(
            &mut tx.conn().await.unwrap(),
            format!("INSERT INTO {table} VALUES (1), (1)"),
        )
        .await;
        assert_unavailable(&tx.commit().await);
        assert_eq!(value(&pooled, "k").await, None);
        let rows: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&mut admin(&base).await)
                .await
                .unwrap();
        assert_eq!(rows, 0);
        exec(&mut admin(&base).await, format!("DROP TABLE {table}")).await;
    }

    /// A call whose connection is cut (the statement sent, its reply lost):
    /// `Unavailable`, never `Indeterminate`; the transaction rolled back.
    /// A COMMIT whose reply is lost: `Indeterminate`, and it did commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cut_call_is_unavailable_and_a_cut_commit_indeterminate() {
        let Some((base, namespace, pooled, _)) = setup("intx_cut").await else {
            return;
        };
        let proxy = FaultProxy::start(upstream(&base).await).await.unwrap();
        let pool = pool(&via(&base, proxy.addr()), 2).await;

        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        let marker = format!("marker-{}", unique_namespace("m"));
        proxy.cut_next_reply(marker.as_bytes());
        let cut = tx.txn(&[Assert::missing("k")], &[put("k", &marker)]).await;
        assert_eq!(proxy.cuts(), 1);
        assert_unavailable(&cut);
        assert_unavailable(&tx.commit().await);
        assert_eq!(value(&pooled, "k").await, None);

        // A read cut the same way.
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(tx.txn(&[], &[put("k2", "1")]).await));
        let key = format!("read-{}", unique_namespace("r"));
        proxy.cut_next_reply(key.as_bytes());
        let cut = tx.snapshot(&[key]).await;
        assert_eq!(proxy.cuts(), 2);
        assert_unavailable(&cut);
        assert_unavailable(&tx.commit().await);
        assert_eq!(value(&pooled, "k2").await, None);

        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        assert!(applied(
            tx.txn(&[Assert::missing("k")], &[put("k", "landed")]).await
        ));
        proxy.cut_next_reply(b"COMMIT");
        let commit = tx.commit().await;
        assert_eq!(proxy.cuts(), 3);
        assert!(
            matches!(commit, Err(Error::Indeterminate { .. })),
            "{commit:?}"
        );
        let landed = wait_for("the cut commit", || async { value(&pooled, "k").await }).await;
        assert_eq!(landed, b"landed");
    }

    /// A coord call dropped while its statement waits for a lock: the
    /// statement may still apply in the transaction, and nobody learned
    /// its outcome, so the transaction refuses later calls and its commit
    /// (`Unavailable`); nothing of it is applied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_cancelled_mid_statement_dooms_the_transaction() {
        let Some((base, namespace, pooled, pool)) = setup("intx_cancel").await else {
            return;
        };
        let mut holder = admin(&base).await;
        hold_txn_lock(&mut holder, &namespace, "k").await;
        let tx = InTransaction::begin(&pool, &namespace).await.unwrap();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            tx.txn(&[Assert::missing("k")], &[put("k", "1")]),
        )
        .await;
        assert!(cancelled.is_err(), "the txn waits for the held lock");
        free_txn_lock(&mut holder, &namespace, "k").await;
        assert_unavailable(&tx.get("k").await);
        assert_unavailable(&tx.commit().await);
        assert_eq!(value(&pooled, "k").await, None);
    }

    // ------------------------------------------------------------ fenced writes

    async fn fenced_setup(label: &str) -> Option<(String, String, PgPool, FencedTable)> {
        let base = suite_base()?;
        let table_name = orders_table(&base, label).await;
        exec(
            &mut admin(&base).await,
            format!("INSERT INTO {table_name} (id, status, fence) VALUES ('o', 'new', 5), ('n', 'new', NULL)"),
        )
        .await;
        let pool = pool(&base, 4).await;
        let table = FencedTable::new(&table_name, "id", "fence").unwrap();
        Some((base, table_name, pool, table))
    }

    async fn row(base: &str, table: &str, id: &str) -> (String, Option<i64>) {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, fence FROM {table} WHERE id = $1"
        )))
        .bind(id)
        .fetch_one(&mut admin(base).await)
        .await
        .unwrap()
    }

    async fn fenced_write(
        conn: &mut PgConnection,
        table: &FencedTable,
        id: &str,
        fence: u64,
        status: &str,
    ) -> FencedWrite {
        table
            .update(id, fence)
            .unwrap()
            .set("status", status)
            .unwrap()
            .execute(conn)
            .await
            .unwrap()
    }

    /// Through PgBouncer in transaction pooling (scripts/ha, 1.18: no
    /// prepared statements kept per client): 4 callers × 8 transactions,
    /// each a coord txn and an `unprepared` fenced write; every write lands.
    /// Prepared (the default), a later transaction on another server
    /// session fails: "prepared statement … does not exist".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fenced_writes_behind_a_transaction_pooler() {
        // Setup and checks through the session-pooling port (same server).
        let (Some(ha), Some(bouncer)) = (
            coord_conformance::server_env("COORD_HA_PGBOUNCER_SESSION_URL"),
            coord_conformance::server_env("COORD_HA_PGBOUNCER_TX_URL"),
        ) else {
            return;
        };
        let bouncer = with_params(&bouncer, "pooler=transaction");
        let namespace = unique_namespace("fenced-bouncer");
        drop(connect(&bouncer, &namespace, PostgresOptions::default()).await);
        let name = orders_table(&ha, "fenced_bouncer").await;
        exec(
            &mut admin(&ha).await,
            format!("INSERT INTO {name} (id, status, fence) SELECT 'c' || g, 'new', 0 FROM generate_series(0, 3) g"),
        )
        .await;
        let table = FencedTable::new(&name, "id", "fence").unwrap();
        let pool = pool(&bouncer, 4).await;
        let options = TransactionOptions::default().behind_transaction_pooler();
        let mut callers = Vec::new();
        for c in 0..4 {
            let (pool, table, namespace) = (pool.clone(), table.clone(), namespace.clone());
            callers.push(tokio::spawn(async move {
                for fence in 1..=8u64 {
                    let tx = InTransaction::begin_with(&pool, &namespace, options).await?;
                    let key = format!("c{c}/{fence}");
                    tx.txn(
                        &[Assert::missing(key.as_str())],
                        &[Mutation::put(key.as_str(), "x")],
                    )
                    .await?;
                    let written = table
                        .update(format!("c{c}"), fence)?
                        .set("status", format!("by {fence}"))?
                        .unprepared()
                        .execute(&mut *tx.conn().await?)
                        .await?;
                    assert_eq!(written, FencedWrite::Written);
                    tx.commit().await?;
                }
                Ok::<_, Error>(())
            }));
        }
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        for c in 0..4 {
            assert_eq!(
                row(&ha, &name, &format!("c{c}")).await,
                ("by 8".to_owned(), Some(8))
            );
        }
        exec(&mut admin(&ha).await, format!("DROP TABLE {name}")).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fenced_writes_refuse_lower_fences_and_roll_back_with_the_transaction() {
        let Some((base, name, pool, table)) = fenced_setup("fenced").await else {
            return;
        };
        let mut conn = pool.acquire().await.unwrap();
        // Lower: refused, nothing written.
        assert_eq!(
            fenced_write(&mut conn, &table, "o", 4, "stale").await,
            FencedWrite::Stale { highest: 5 }
        );
        assert_eq!(row(&base, &name, "o").await, ("new".to_owned(), Some(5)));
        // Equal, then higher: written.
        assert_eq!(
            fenced_write(&mut conn, &table, "o", 5, "equal").await,
            FencedWrite::Written
        );
        assert_eq!(row(&base, &name, "o").await, ("equal".to_owned(), Some(5)));
        assert_eq!(
            fenced_write(&mut conn, &table, "o", 6, "higher").await,
            FencedWrite::Written
        );
        assert_eq!(row(&base, &name, "o").await, ("higher".to_owned(), Some(6)));
        // No fence yet: any fence writes. No row: Missing.
        assert_eq!(
            fenced_write(&mut conn, &table, "n", 1, "first").await,
            FencedWrite::Written
        );
        assert_eq!(row(&base, &name, "n").await, ("first".to_owned(), Some(1)));
        assert_eq!(
            fenced_write(&mut conn, &table, "none", 9, "x").await,
            FencedWrite::Missing
        );
        drop(conn);

        // In an InTransaction: rolled back with it.
        let tx = InTransaction::begin(&pool, "fenced").await.unwrap();
        assert_eq!(
            fenced_write(&mut tx.conn().await.unwrap(), &table, "o", 7, "rolled back").await,
            FencedWrite::Written
        );
        tx.rollback().await.unwrap();
        assert_eq!(row(&base, &name, "o").await, ("higher".to_owned(), Some(6)));
        // A bad column is a typed error before anything is sent.
        assert!(matches!(
            table
                .update("o", 8)
                .unwrap()
                .set("status; DROP TABLE x", "y"),
            Err(Error::InvalidInput(InvalidInput::Argument(_)))
        ));
        exec(&mut admin(&base).await, format!("DROP TABLE {name}")).await;
    }

    /// Two transactions write the same row with different fences; the one
    /// that writes second waits for the first's row lock. Whichever order,
    /// the row ends with the higher fence's values.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_fenced_writers_end_with_the_higher() {
        let Some((base, name, pool, table)) = fenced_setup("fenced_race").await else {
            return;
        };
        for (first, second) in [(10_u64, 20_u64), (40, 30)] {
            let one = pool.begin().await.unwrap();
            let two = pool.begin().await.unwrap();
            let mut one = one;
            assert_eq!(
                fenced_write(&mut one, &table, "o", first, &format!("by {first}")).await,
                FencedWrite::Written
            );
            let table2 = table.clone();
            let racing = tokio::spawn(async move {
                let mut two = two;
                let outcome =
                    fenced_write(&mut two, &table2, "o", second, &format!("by {second}")).await;
                two.commit().await.unwrap();
                outcome
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(
                !racing.is_finished(),
                "the second writer waits for the row lock"
            );
            one.commit().await.unwrap();
            let outcome = racing.await.unwrap();
            let high = first.max(second);
            if second > first {
                assert_eq!(outcome, FencedWrite::Written);
            } else {
                assert_eq!(outcome, FencedWrite::Stale { highest: first });
            }
            assert_eq!(
                row(&base, &name, "o").await,
                (format!("by {high}"), Some(high as i64))
            );
        }
        exec(&mut admin(&base).await, format!("DROP TABLE {name}")).await;
    }

    // ------------------------------------------------------------ the suites, autocommitted

    /// Every raw call in an `InTransaction` of its own, committed right
    /// after it: the suites then run the in-transaction statements.
    #[derive(Debug)]
    struct Autocommit {
        pool: PgPool,
        namespace: String,
        options: TransactionOptions,
    }

    impl Autocommit {
        async fn begin(&self) -> Result<Arc<InTransaction>, Error> {
            InTransaction::begin_with(&self.pool, &self.namespace, self.options).await
        }
    }

    /// Commit after an answer, roll back after an error.
    async fn finish<T>(tx: Arc<InTransaction>, answer: Result<T, Error>) -> Result<T, Error> {
        match answer {
            Ok(answer) => tx.commit().await.map(|()| answer),
            Err(error) => {
                tx.rollback().await?;
                Err(error)
            }
        }
    }

    #[async_trait::async_trait]
    impl Backend for Autocommit {
        fn namespace(&self) -> &str {
            &self.namespace
        }

        fn store_name(&self) -> &'static str {
            "postgres-autocommitted-in-transaction"
        }

        async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>, Error> {
            let tx = self.begin().await?;
            let answer = tx.raw_snapshot(keys).await;
            finish(tx, answer).await
        }

        async fn raw_txn(
            &self,
            asserts: &[Assert],
            mutations: &[Mutation],
        ) -> Result<TxnOutcome, Error> {
            let tx = self.begin().await?;
            let answer = tx.raw_txn(asserts, mutations).await;
            finish(tx, answer).await
        }

        async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>, Error> {
            let tx = self.begin().await?;
            let answer = tx.raw_keys(prefix).await;
            finish(tx, answer).await
        }

        async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>, Error> {
            let tx = self.begin().await?;
            let answer = tx.raw_first_keys(prefix, limit).await;
            finish(tx, answer).await
        }
    }

    fn autocommit_factory() -> Option<BackendFactory> {
        autocommit_factory_at(suite_base()?, TransactionOptions::default())
    }

    /// Autocommitted `InTransaction`s begun with `options` on `base`.
    fn autocommit_factory_at(base: String, options: TransactionOptions) -> Option<BackendFactory> {
        Some(coord_conformance::factory(move |namespace| {
            let base = base.clone();
            async move {
                // Creates the schema.
                drop(suite_store(&base, &namespace).await?);
                let pool = PgPoolOptions::new()
                    .max_connections(8)
                    .connect(&base)
                    .await
                    .map_err(|e| Error::unavailable("test pool", e))?;
                Ok(Arc::new(Autocommit {
                    pool,
                    namespace,
                    options,
                }) as Arc<dyn Backend>)
            }
        }))
    }

    /// Through PgBouncer in transaction pooling (scripts/ha), every
    /// statement inlined (`behind_transaction_pooler`).
    fn through_transaction_pooler() -> Option<BackendFactory> {
        let url = coord_conformance::server_env("COORD_HA_PGBOUNCER_TX_URL")?;
        autocommit_factory_at(
            with_params(&url, "pooler=transaction"),
            TransactionOptions::default().behind_transaction_pooler(),
        )
    }

    /// The primitives' suite with every statement inlined, through the
    /// pooler that needs it.
    mod backend_suite_behind_transaction_pooler {
        use super::*;
        coord_conformance::backend_tests!(through_transaction_pooler());
    }

    /// The board's, whose txns are the outbox's.
    mod board_suite_behind_transaction_pooler {
        use super::*;
        coord_conformance::board_tests!(through_transaction_pooler());
    }

    // Every suite but `reclaim`: maintenance is refused inside a caller's
    // transaction (it runs on the pooled store). About 25 s in all.
    mod backend_suite {
        use super::*;
        coord_conformance::backend_tests!(autocommit_factory());
    }

    mod lock_suite {
        use super::*;
        coord_conformance::lock_tests!(autocommit_factory());
    }

    mod board_suite {
        use super::*;
        coord_conformance::board_tests!(autocommit_factory());
    }

    mod queue_suite {
        use super::*;
        coord_conformance::queue_tests!(autocommit_factory());
    }

    mod sideeffect_suite {
        use super::*;
        coord_conformance::sideeffect_tests!(autocommit_factory());
    }

    mod scheduler_suite {
        use super::*;
        coord_conformance::scheduler_tests!(autocommit_factory());
    }

    mod rwlock_suite {
        use super::*;
        coord_conformance::rwlock_tests!(autocommit_factory());
    }

    mod election_suite {
        use super::*;
        coord_conformance::election_tests!(autocommit_factory());
    }

    mod fair_lock_suite {
        use super::*;
        coord_conformance::fair_lock_tests!(autocommit_factory());
    }

    mod semaphore_suite {
        use super::*;
        coord_conformance::semaphore_tests!(autocommit_factory());
    }

    mod fault_model_suite {
        use super::*;
        coord_conformance::fault_model_tests!(autocommit_factory());
    }

    mod changes_suite {
        use super::*;
        coord_conformance::changes_tests!(autocommit_factory());
    }

    mod retention_suite {
        use super::*;
        coord_conformance::retention_tests!(autocommit_factory());
    }
}
