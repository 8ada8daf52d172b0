//! coord-sqlite against the conformance suite and its own boundary: many
//! processes on one file, reopen, bad URLs and paths.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use coord_backend::{
    Assert, Backend, BackendExt, Entry, Error, InvalidInput, Mutation, StoreUrl, Version,
};
use coord_conformance::support::applied;
use coord_conformance::{unique_namespace, BackendFactory};
use coord_sqlite::{SqliteBackend, SqliteOptions};

/// Every test of this binary shares one database file (namespaces keep the
/// cases apart), as many applications would share one store.
fn shared_file() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("coord-sqlite")
        .join("shared.db")
}

/// A file of its own, for tests that reopen or inspect one.
fn private_file(label: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("coord-sqlite")
        .join(format!("{}.db", unique_namespace(label)))
}

/// Each call opens a new pool on the shared file: a factory call with a
/// namespace already used gives a second, independent client of the same store.
fn factory() -> BackendFactory {
    coord_conformance::factory(|namespace| async move {
        let store = SqliteBackend::open(shared_file(), &namespace).await?;
        Ok(Arc::new(store) as Arc<dyn Backend>)
    })
}

coord_conformance::all_suites_tests!(factory());

async fn open(namespace: &str) -> SqliteBackend {
    SqliteBackend::open(shared_file(), namespace).await.unwrap()
}

fn put(key: &str, value: &str) -> Mutation {
    Mutation::put(key, value.as_bytes().to_vec())
}

const CHILD_ENV: &str = "COORD_SQLITE_TEST_CHILD";
const CHILDREN: usize = 4;
const INCREMENTS: u64 = 50;

fn counter(entry: &Entry) -> u64 {
    match &entry.value {
        Some(bytes) => std::str::from_utf8(bytes).unwrap().parse().unwrap(),
        None => 0,
    }
}

/// Writes the counter `current` (the entry last seen) + 1, re-deciding from
/// the entry each rejected txn returns, and counting the rejections in
/// `rejections` (which must stay below `limit`); returns the entry written.
async fn cas_increment(
    store: &SqliteBackend,
    mut current: Entry,
    rejections: &mut u64,
    limit: u64,
) -> Entry {
    loop {
        let (key, n) = (current.key.as_str(), counter(&current));
        let out = store
            .txn(
                &[Assert::at(key, current.version)],
                &[put(key, &(n + 1).to_string())],
            )
            .await
            .unwrap();
        if out.applied {
            let version = Version(current.version.0 + 1);
            return Entry::present(current.key, version, (n + 1).to_string().into_bytes());
        }
        *rejections += 1;
        assert!(*rejections < limit, "CAS loop does not converge");
        current = out.current.into_iter().next().unwrap();
    }
}

/// CAS-increment the counter at `key` once; returns the rejected attempts.
async fn increment_one(store: &SqliteBackend, key: &str) -> u64 {
    let mut rejections = 0;
    cas_increment(
        store,
        store.get(key).await.unwrap(),
        &mut rejections,
        10_000,
    )
    .await;
    rejections
}

/// CAS-increment the counter at `key` `INCREMENTS` times, re-deciding from
/// the entries a rejected txn returns.
async fn increment_many(store: &SqliteBackend, key: &str) -> u64 {
    let mut current = store.get(key).await.unwrap();
    let mut rejections = 0u64;
    for _ in 0..INCREMENTS {
        // Let the other writers in: SQLite's busy handler sleeps, so a tight
        // loop would mostly run its increments in one uncontended burst.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        current = cas_increment(store, current, &mut rejections, 100_000).await;
    }
    rejections
}

/// Several OS processes (this test binary re-executed) race CAS increments
/// on one key of one file: no increment may be lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_cas_increments() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (path, namespace) = spec.split_once('\n').unwrap();
        let mut options = SqliteOptions::default();
        options.max_connections = 2;
        let store = SqliteBackend::open_with(path, namespace, options)
            .await
            .unwrap();
        // Start together, so the increments really overlap: check in, then
        // wait (bounded) until every child has.
        let _ = increment_one(&store, "ready").await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while counter(&store.get("ready").await.unwrap()) < CHILDREN as u64 {
            assert!(
                std::time::Instant::now() < deadline,
                "siblings never started"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let rejections = increment_many(&store, "counter").await;
        println!("child {}: {rejections} rejected txns", std::process::id());
        store.close().await;
        return;
    }
    let namespace = unique_namespace("cross_process");
    let spec = format!("{}\n{namespace}", shared_file().display());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "cross_process_cas_increments", "--nocapture"])
                .env(CHILD_ENV, &spec)
                .spawn()
                .unwrap()
        })
        .collect();
    let statuses = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|mut c| c.wait().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for status in statuses {
        assert!(status.success(), "a child process failed: {status}");
    }
    let total = CHILDREN as u64 * INCREMENTS;
    let entry = open(&namespace).await.get("counter").await.unwrap();
    assert_eq!(entry.value, Some(total.to_string().into_bytes()));
    assert_eq!(entry.version, Version(total));
}

/// Many connections of one process (separate pools) racing on one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_pools_cas_increments() {
    let namespace = unique_namespace("many_pools");
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let store = open(&namespace).await;
        tasks.push(tokio::spawn(async move {
            increment_many(&store, "counter").await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let entry = open(&namespace).await.get("counter").await.unwrap();
    assert_eq!(entry.version, Version(3 * INCREMENTS));
    assert_eq!(entry.value, Some((3 * INCREMENTS).to_string().into_bytes()));
}

#[tokio::test]
async fn data_and_versions_survive_reopen() {
    let path = private_file("reopen");
    let store = SqliteBackend::open(&path, "app").await.unwrap();
    let out = store
        .txn(&[], &[put("kept", "1"), put("gone", "x")])
        .await
        .unwrap();
    assert!(out.applied);
    assert!(applied(store.delete_if("gone", Version(1))).await);
    store.close().await;
    drop(store);

    let store = SqliteBackend::open(&path, "app").await.unwrap();
    assert_eq!(
        store.get("kept").await.unwrap(),
        Entry::present("kept", Version(1), b"1".to_vec())
    );
    assert_eq!(store.get("gone").await.unwrap(), Entry::missing("gone"));
    // The tombstone survived too: the re-created key continues the count.
    assert!(applied(store.put_if("gone", Version::MISSING, b"y".to_vec())).await);
    assert_eq!(store.get("gone").await.unwrap().version, Version(3));
    assert_eq!(store.keys("").await.unwrap(), vec!["gone", "kept"]);
    store.close().await;
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test]
async fn versions_are_never_reused() {
    let store = open(&unique_namespace("versions")).await;
    assert!(applied(store.put_if("k", Version::MISSING, vec![])).await);
    // An empty value is a value, not a tombstone.
    assert_eq!(
        store.get("k").await.unwrap(),
        Entry::present("k", Version(1), vec![])
    );
    assert!(applied(store.delete_if("k", Version(1))).await);
    assert_eq!(store.get("k").await.unwrap(), Entry::missing("k"));
    assert!(store.keys("k").await.unwrap().is_empty());
    // A stale assert at the old version must not pass again (ABA).
    let stale = store.put_if("k", Version(1), b"x".to_vec()).await.unwrap();
    assert!(!stale.applied);
    assert_eq!(stale.current, vec![Entry::missing("k")]);
    assert!(applied(store.put_if("k", Version::MISSING, b"again".to_vec())).await);
    assert_eq!(store.get("k").await.unwrap().version, Version(3));
    // Deleting a key that never existed still moves its hidden counter.
    assert!(applied(store.txn(&[], &[Mutation::delete("m")])).await);
    assert!(applied(store.put_if("m", Version::MISSING, b"1".to_vec())).await);
    assert_eq!(store.get("m").await.unwrap().version, Version(2));
}

#[tokio::test]
async fn rejected_txn_writes_nothing_and_returns_current_entries() {
    let store = open(&unique_namespace("reject")).await;
    assert!(applied(store.txn(&[], &[put("a", "1"), put("b", "1")])).await);
    let out = store
        .txn(
            &[
                Assert::at("a", Version(1)),
                Assert::missing("b"),
                Assert::at("a", Version(1)),
                Assert::missing("c"),
            ],
            &[put("a", "2"), put("c", "2"), Mutation::delete("b")],
        )
        .await
        .unwrap();
    assert!(!out.applied);
    assert_eq!(
        out.current,
        vec![
            Entry::present("a", Version(1), b"1".to_vec()),
            Entry::present("b", Version(1), b"1".to_vec()),
            Entry::missing("c"),
        ]
    );
    let now = store
        .snapshot(&["c".into(), "a".into(), "b".into(), "a".into()])
        .await
        .unwrap();
    assert_eq!(
        now,
        vec![
            Entry::missing("c"),
            Entry::present("a", Version(1), b"1".to_vec()),
            Entry::present("b", Version(1), b"1".to_vec()),
        ]
    );
}

#[tokio::test]
async fn prefixes_are_literal_and_sorted_by_bytes() {
    let store = open(&unique_namespace("prefix")).await;
    let keys = [
        "a%b", "a%", "aXb", "a_b", "a\\b", "a*", "a[1]", "é1", "é2", "ê", "f", "B", "\u{7f}x",
        "\u{80}",
    ];
    let mutations: Vec<_> = keys.iter().map(|k| put(k, "v")).collect();
    assert!(applied(store.txn(&[], &mutations)).await);
    let mut all: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    all.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    assert_eq!(store.keys("").await.unwrap(), all);
    assert_eq!(store.keys("a%").await.unwrap(), vec!["a%", "a%b"]);
    assert_eq!(store.keys("a_").await.unwrap(), vec!["a_b"]);
    assert_eq!(store.keys("a\\").await.unwrap(), vec!["a\\b"]);
    assert_eq!(store.keys("a[").await.unwrap(), vec!["a[1]"]);
    assert_eq!(store.keys("a*").await.unwrap(), vec!["a*"]);
    assert_eq!(store.keys("é").await.unwrap(), vec!["é1", "é2"]);
    assert_eq!(store.keys("\u{7f}").await.unwrap(), vec!["\u{7f}x"]);
    assert!(store.keys("zz").await.unwrap().is_empty());
}

#[tokio::test]
async fn namespaces_are_isolated_and_clients_share_a_namespace() {
    let base = unique_namespace("ns");
    let short = open(&base).await;
    let long = open(&format!("{base}x")).await;
    assert!(applied(short.txn(&[], &[put("k", "short")])).await);
    assert!(long.keys("").await.unwrap().is_empty());
    assert_eq!(long.get("k").await.unwrap(), Entry::missing("k"));
    let second_client = open(&base).await;
    assert_eq!(
        second_client.get("k").await.unwrap(),
        Entry::present("k", Version(1), b"short".to_vec())
    );
}

#[tokio::test]
async fn rows_not_written_by_coord_are_malformed() {
    let path = private_file("malformed");
    let store = SqliteBackend::open(&path, "app").await.unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("INSERT INTO coord_kv VALUES ('app', CAST(x'ff' AS TEXT), 1, x'00')")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert!(matches!(
        store.keys("").await,
        Err(Error::MalformedRecord { .. })
    ));
    store.close().await;
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test]
async fn bad_input_is_refused_before_touching_the_file() {
    let store = open(&unique_namespace("input")).await;
    let err = store
        .txn(&[], &[put("k", "1"), Mutation::delete("k")])
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidInput(InvalidInput::DuplicateMutation(_))
    ));
    assert!(matches!(
        store.keys("a\0").await,
        Err(Error::InvalidInput(InvalidInput::NulByte(_)))
    ));
    assert!(matches!(
        store.snapshot(&[String::new()]).await,
        Err(Error::InvalidInput(InvalidInput::EmptyKey))
    ));
    assert_eq!(store.get("k").await.unwrap(), Entry::missing("k"));
    assert!(matches!(
        SqliteBackend::open(shared_file(), "{bad}").await,
        Err(Error::InvalidInput(InvalidInput::Namespace { .. }))
    ));
}

#[tokio::test]
async fn urls_open_files_and_bad_ones_are_config_errors() {
    let path = std::path::absolute(private_file("url")).unwrap();
    let url = StoreUrl::parse(&format!(
        "sqlite://{}?namespace=app&durability=normal",
        path.display()
    ))
    .unwrap();
    let store = SqliteBackend::connect(&url).await.unwrap();
    assert_eq!(store.namespace(), "app");
    assert_eq!(store.path(), path);
    assert!(applied(store.txn(&[], &[put("k", "v")])).await);
    store.close().await;
    assert!(path.is_file());
    std::fs::remove_file(&path).unwrap();

    for bad in [
        "sqlite://",
        "sqlite://x.db?pool=3",
        "sqlite://x.db?busy_timeout_ms=soon",
        "postgres://x.db",
    ] {
        let result = SqliteBackend::connect(&StoreUrl::parse(bad).unwrap()).await;
        assert!(matches!(result, Err(Error::Config(_))), "{bad}: {result:?}");
    }
}

#[tokio::test]
async fn unusable_paths_are_unavailable() {
    // A regular file where a directory should be: no privilege can create it.
    let blocker = private_file("blocker");
    std::fs::create_dir_all(blocker.parent().unwrap()).unwrap();
    std::fs::write(&blocker, b"not a directory").unwrap();
    let result = SqliteBackend::open(blocker.join("coord.db"), "app").await;
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    // A file that is not a database.
    let result = SqliteBackend::open(&blocker, "app").await;
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    std::fs::remove_file(&blocker).unwrap();
    // A directory where the file should be.
    let dir = private_file("dir");
    std::fs::create_dir_all(&dir).unwrap();
    let result = SqliteBackend::open(&dir, "app").await;
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    std::fs::remove_dir(&dir).unwrap();
}

#[tokio::test]
async fn a_closed_store_is_unavailable_not_empty() {
    let store = open(&unique_namespace("closed")).await;
    store.close().await;
    assert!(matches!(
        store.get("k").await,
        Err(Error::Unavailable { .. })
    ));
    assert!(matches!(
        store.txn(&[], &[put("k", "v")]).await,
        Err(Error::Unavailable { .. })
    ));
    assert!(matches!(
        store.keys("").await,
        Err(Error::Unavailable { .. })
    ));
}

/// Set in the child of `another_process_wakes_a_watch`: `path\nnamespace` to write in.
const WRITER_ENV: &str = "COORD_SQLITE_TEST_WRITER";

/// A commit by another OS process on the same file wakes a watch (the
/// poller sees SQLite's `data_version` move; see docs/shapes.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_wakes_a_watch() {
    if let Ok(spec) = std::env::var(WRITER_ENV) {
        let (path, namespace) = spec.split_once('\n').unwrap();
        let store = SqliteBackend::open(path, namespace).await.unwrap();
        let out = store
            .put_if("w/from-child", Version::MISSING, b"1".to_vec())
            .await;
        assert!(out.unwrap().applied);
        store.close().await;
        return;
    }
    let path = private_file("wake_process");
    let namespace = unique_namespace("wake_process");
    let store = SqliteBackend::open(&path, &namespace).await.unwrap();
    let mut watch = store.changes().unwrap().watch("w/").await.unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "another_process_wakes_a_watch", "--nocapture"])
        .env(WRITER_ENV, format!("{}\n{namespace}", path.display()))
        .spawn()
        .unwrap();
    tokio::time::timeout(coord_conformance::changes::WAKE_BOUND, watch.changed())
        .await
        .expect("the child's commit did not wake the watch")
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "the writer process failed: {status}");
    assert!(store.get("w/from-child").await.unwrap().exists());
}

async fn rows(path: &std::path::Path, namespace: &str) -> i64 {
    use sqlx::Connection;
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT count(*) FROM coord_kv WHERE ns = ?1")
        .bind(namespace)
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

/// A revision-1 file (as earlier releases wrote it) is upgraded in place
/// without changing a row; a reclaim then deletes the tombstone rows for
/// real, and a re-created key starts above its old counter.
#[tokio::test]
async fn reclaim_deletes_tombstone_rows_and_upgrades_revision_1_files() {
    use sqlx::Connection;
    let path = private_file("reclaim");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        sqlx::raw_sql(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE coord_kv (ns TEXT NOT NULL COLLATE BINARY,
                 key TEXT NOT NULL COLLATE BINARY,
                 version INTEGER NOT NULL CHECK (version > 0), value BLOB,
                 PRIMARY KEY (ns, key)) STRICT, WITHOUT ROWID;
             INSERT INTO coord_kv VALUES ('ns', 'gone', 4, NULL), ('ns', 'live', 2, x'6c');
             PRAGMA user_version = 1;",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let store = SqliteBackend::open(&path, "ns").await.unwrap();
    assert_eq!(
        store.get("live").await.unwrap(),
        Entry::present("live", Version(2), b"l".to_vec())
    );
    assert_eq!(store.keys("").await.unwrap(), vec!["live".to_owned()]);
    for i in 0..10 {
        let key = format!("t/{i}");
        assert!(applied(store.put_if(&key, Version::MISSING, vec![])).await);
        assert!(applied(store.delete_if(&key, Version(1))).await);
    }
    assert_eq!(rows(&path, "ns").await, 12);
    // Rows from before storage formats were announced: a client that
    // ignores the floor may still run, until the operator says otherwise.
    let options = coord_backend::ReclaimOptions::DEFAULT.with_max_tombstones(8);
    let refused = store.reclaim(&options).await;
    assert!(
        matches!(refused, Err(Error::FormatMismatch { theirs: 0, .. })),
        "{refused:?}"
    );
    assert_eq!(rows(&path, "ns").await, 12);
    let first = store
        .reclaim(&options.with_older_clients_stopped(true))
        .await
        .unwrap();
    assert_eq!((first.removed, first.more), (8, true));
    let second = store.reclaim(&options).await.unwrap();
    assert_eq!((second.removed, second.more), (3, false));
    assert_eq!(rows(&path, "ns").await, 1, "only the live row is left");
    assert!(applied(store.put_if("gone", Version::MISSING, b"g".to_vec())).await);
    assert_eq!(store.get("gone").await.unwrap().version, Version(5));
    assert!(applied(store.put_if("t/0", Version::MISSING, b"t".to_vec())).await);
    assert_eq!(store.get("t/0").await.unwrap().version, Version(5));
    store.close().await;
    // Reopened, the file is at the new revision and keeps its floor.
    let reopened = SqliteBackend::open(&path, "ns").await.unwrap();
    assert!(applied(reopened.put_if("t/1", Version::MISSING, b"t".to_vec())).await);
    assert_eq!(reopened.get("t/1").await.unwrap().version, Version(5));
}

async fn exec(path: &std::path::Path, statement: &str) {
    use sqlx::Connection;
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// A reclaim refuses while a client announcing an older storage format was
/// seen recently (here an announcement written as such a client's would
/// read): the tombstone it keeps is what stops that client, which ignores
/// the floor, from creating the key again at a version it had. Once the
/// announcement is older than the TTL the reclaim goes on. A client older
/// than the format a namespace requires refuses to write.
#[tokio::test]
async fn reclaim_refuses_beside_an_older_client() {
    use coord_backend::reclaim::{now_ms, ReclaimOptions, ANNOUNCEMENT_TTL, STORAGE_FORMAT};
    let path = private_file("formats");
    let store = SqliteBackend::open(&path, "ns").await.unwrap();
    assert!(applied(store.put_if("k", Version::MISSING, b"1".to_vec())).await);
    assert!(applied(store.delete_if("k", Version(1))).await);
    let older = STORAGE_FORMAT - 1;
    exec(
        &path,
        &format!(
            "INSERT INTO coord_clients VALUES ('ns', 'older', {older}, {})",
            now_ms() - 60_000
        ),
    )
    .await;
    let refused = store.reclaim(&ReclaimOptions::DEFAULT).await;
    let stopped = store
        .reclaim(&ReclaimOptions::DEFAULT.with_older_clients_stopped(true))
        .await;
    // The older client creates `k` as clients before the floor did: at
    // version 1 where no row exists, else one above the row's counter.
    exec(
        &path,
        "INSERT INTO coord_kv VALUES ('ns', 'k', 1, x'6f') \
         ON CONFLICT (ns, key) DO UPDATE SET version = version + 1, value = excluded.value",
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
    assert!(refused.unwrap_err().to_string().contains("upgrade or stop"));
    // The operator's word does not hide an announced client.
    assert!(
        matches!(stopped, Err(Error::FormatMismatch { .. })),
        "{stopped:?}"
    );
    assert!(applied(store.delete_if("k", k.version)).await);
    exec(
        &path,
        &format!(
            "UPDATE coord_clients SET seen_ms = {} WHERE client = 'older'",
            now_ms() - ANNOUNCEMENT_TTL.as_millis() as u64 - 1000
        ),
    )
    .await;
    let done = store.reclaim(&ReclaimOptions::DEFAULT).await.unwrap();
    assert_eq!((done.removed, done.more), (1, false));

    // A namespace a newer coord requires: this client refuses to write.
    exec(
        &path,
        &format!(
            "UPDATE coord_clients SET format = {} WHERE ns = 'ns' AND client = ''",
            STORAGE_FORMAT + 1
        ),
    )
    .await;
    let newer = SqliteBackend::open(&path, "ns").await.unwrap();
    let refused = newer.put_if("n", Version::MISSING, b"n".to_vec()).await;
    assert!(
        matches!(&refused, Err(Error::FormatMismatch { theirs, .. }) if *theirs == STORAGE_FORMAT + 1),
        "{refused:?}"
    );
    assert!(!newer.get("n").await.unwrap().exists());
}

/// Every put of an applied txn reports the version it stored, also over a
/// tombstone and after a reclaim raised the floor (the upsert's `RETURNING`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_puts_report_their_versions() {
    let store = Arc::new(open(&unique_namespace("every_put")).await);
    if let Err(failure) = coord_conformance::backend::every_put_reports_its_version(store).await {
        panic!("{}", failure.message);
    }
}

/// The golden file of storage format 3: a database written by the release
/// that introduced it (`tests/golden/format-3.db`, namespace `golden`).
fn golden_file(format: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("format-{format}.db"))
}

/// A database file written by the release that introduced storage format 3
/// opens with this release (its schema migrated if it changed) and reads
/// the same keys, versions and values; versions continue above them and
/// above the floor its reclaim raised. A release that cannot breaks the
/// stored-data promise of api-lifecycle.yaml. `COORD_WRITE_GOLDEN=1` writes
/// the file of the current format (for a NEW format only: the old ones stay).
#[tokio::test]
async fn a_database_of_format_3_is_read_by_this_release() {
    use coord_backend::reclaim::STORAGE_FORMAT;
    const FORMAT: u32 = 3;
    if std::env::var_os("COORD_WRITE_GOLDEN").is_some() {
        let scratch = private_file("golden");
        let store = SqliteBackend::open(&scratch, "golden").await.unwrap();
        if let Err(failure) = coord_conformance::golden::write_namespace(&store).await {
            panic!("{}", failure.message);
        }
        store.close().await;
        drop(store);
        let target = golden_file(STORAGE_FORMAT);
        let _ = std::fs::remove_file(&target);
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", scratch.display()))
            .await
            .unwrap();
        // The path is this crate's own directory, not input.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "VACUUM INTO '{}'",
            target.display()
        )))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        return;
    }
    let copy = private_file("golden_copy");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(golden_file(FORMAT), &copy).expect("the golden file");
    let store = SqliteBackend::open(&copy, "golden").await.unwrap();
    if let Err(failure) = coord_conformance::golden::read_back(&store).await {
        panic!("{}", failure.message);
    }
    store.close().await;
    std::fs::remove_file(&copy).unwrap();
}

/// `coord_sqlite::InTransaction` (a backend bound to the caller's
/// transaction) and `coord_sqlite::fenced` (see the crate docs, "In the
/// caller's transaction"). Each test has a file of its own: a transaction
/// begun with `BEGIN IMMEDIATE` locks the whole file.
mod in_transaction {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::Poll;
    use std::time::Duration;

    use coord_adapters::board::{Board, BoardAdapter, BoardError, TaskSpec};
    use coord_backend::{
        Assert, Backend, BackendExt, Error, InvalidInput, Mutation, ReclaimOptions, Version,
    };
    use coord_conformance::BackendFactory;
    use coord_sqlite::fenced::{FencedTable, FencedWrite};
    use coord_sqlite::{InTransaction, SqliteBackend};
    use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

    use super::{private_file, put};

    const NS: &str = "app";
    const TTL: Duration = Duration::from_secs(60);

    /// The coord store (which creates the schema) and the application's
    /// own pool on the same file, with the application's tables.
    async fn setup(label: &str) -> (SqliteBackend, SqlitePool) {
        let path = private_file(label);
        let store = SqliteBackend::open(&path, NS).await.unwrap();
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(coord_sqlite::pool_options(&path))
            .await
            .unwrap();
        for table in [
            "CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)",
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, \
             fence INTEGER NOT NULL DEFAULT 0)",
        ] {
            sqlx::query(table).execute(&pool).await.unwrap();
        }
        (store, pool)
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

    /// The outbox in callers' transactions: rolled back never runs,
    /// committed runs once, one key enqueued by two transactions is one intent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outbox_in_transactions() {
        use coord_conformance::outbox::{in_transactions, BeginTransaction, CallerTransaction};
        let (store, pool) = setup("outbox-in-tx").await;
        let begin: BeginTransaction = Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let tx = InTransaction::begin(&pool, NS).await?;
                Ok(Arc::new(Caller(tx)) as Arc<dyn CallerTransaction>)
            })
        });
        in_transactions(begin, Arc::new(store))
            .await
            .unwrap_or_else(|f| panic!("outbox in SQLite transactions: {f}"));
    }

    async fn orders(pool: &SqlitePool) -> Vec<String> {
        sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap()
    }

    async fn insert_order(tx: &InTransaction, id: &str) {
        sqlx::query("INSERT INTO orders (id, item) VALUES (?1, 'book')")
            .bind(id)
            .execute(&mut *tx.conn().await.unwrap())
            .await
            .unwrap();
    }

    fn finished(error: Error) {
        assert!(
            matches!(&error, Error::InvalidInput(InvalidInput::Argument(m)) if m.contains("finished")),
            "{error:?}"
        );
    }

    /// The caller's row and a board task (added through the adapter over
    /// the transaction) roll back together, then commit together; reads
    /// through the transaction see its own writes, the pooled store does not.
    #[tokio::test]
    async fn business_rows_and_coord_records_commit_and_roll_back_together() {
        let (store, pool) = setup("intx_together").await;
        let pooled = BoardAdapter::new(Arc::new(store.clone()));
        for commit in [false, true] {
            let tx = InTransaction::begin(&pool, NS).await.unwrap();
            insert_order(&tx, "o1").await;
            let board = BoardAdapter::new(tx.clone());
            board
                .add(TaskSpec::new("ship-o1", b"o1".to_vec()))
                .await
                .unwrap();
            // Its own writes, inside; nothing outside.
            assert_eq!(board.get("ship-o1").await.unwrap().payload, b"o1");
            assert_eq!(
                tx.keys("board/task/").await.unwrap(),
                ["board/task/ship-o1"]
            );
            assert!(matches!(
                pooled.get("ship-o1").await,
                Err(BoardError::NotFound { .. })
            ));
            assert!(store.keys("board/").await.unwrap().is_empty());
            assert!(orders(&pool).await.is_empty());
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
                assert!(orders(&pool).await.is_empty());
                assert!(store.keys("").await.unwrap().is_empty());
                assert!(matches!(
                    pooled.get("ship-o1").await,
                    Err(BoardError::NotFound { .. })
                ));
            }
        }
        assert_eq!(orders(&pool).await, ["o1"]);
        assert_eq!(pooled.get("ship-o1").await.unwrap().payload, b"o1");
        store.close().await;
    }

    /// Raw txns inside: the versions follow the pooled store's rules (a new
    /// row at floor + 1, +1 per write), a rejected assert is a plain
    /// rejection with the current entries, and the transaction goes on.
    #[tokio::test]
    async fn txns_inside_follow_the_stores_rules() {
        let (store, pool) = setup("intx_rules").await;
        store.txn(&[], &[put("a", "1")]).await.unwrap();
        let tx = InTransaction::begin(&pool, NS).await.unwrap();
        let a = tx.get("a").await.unwrap();
        assert_eq!(
            (a.version, a.value.as_deref()),
            (Version(1), Some(&b"1"[..]))
        );
        let out = tx
            .txn(
                &[Assert::at("a", Version(1))],
                &[put("a", "2"), put("b", "1")],
            )
            .await
            .unwrap();
        assert!(out.applied);
        assert_eq!(
            out.written,
            [("a".to_owned(), Version(2)), ("b".to_owned(), Version(1))]
        );
        let rejected = tx
            .txn(
                &[Assert::at("a", Version(1)), Assert::missing("b")],
                &[put("c", "x")],
            )
            .await
            .unwrap();
        assert!(!rejected.applied);
        assert_eq!(rejected.current.len(), 2);
        assert_eq!(rejected.current[0].version, Version(2));
        assert_eq!(rejected.current[1].version, Version(1));
        assert_eq!(tx.keys("").await.unwrap(), ["a", "b"]);
        assert_eq!(tx.first_keys("", 1).await.unwrap(), ["a"]);
        // Uncommitted: the pooled store still reads version 1 and no `b`.
        assert_eq!(store.get("a").await.unwrap().version, Version(1));
        assert_eq!(store.keys("").await.unwrap(), ["a"]);
        tx.txn(&[], &[Mutation::delete("b")]).await.unwrap();
        tx.commit().await.unwrap();
        let a = store.get("a").await.unwrap();
        assert_eq!(
            (a.version, a.value.as_deref()),
            (Version(2), Some(&b"2"[..]))
        );
        assert_eq!(store.keys("").await.unwrap(), ["a"]);
        // `b`'s tombstone keeps its count.
        let out = store.txn(&[], &[put("b", "again")]).await.unwrap();
        assert_eq!(out.written, [("b".to_owned(), Version(3))]);
        store.close().await;
    }

    /// Two transactions begun with `BEGIN IMMEDIATE` race to claim one
    /// task: the second waits for the first's lock, then sees its commit,
    /// so exactly one claim exists after both committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_immediate_transactions_race_for_one_claim() {
        let (store, pool) = setup("intx_race").await;
        BoardAdapter::new(Arc::new(store.clone()))
            .add(TaskSpec::new("job", b"".to_vec()))
            .await
            .unwrap();
        let first = InTransaction::begin(&pool, NS).await.unwrap();
        let second = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let tx = InTransaction::begin(&pool, NS).await.unwrap();
                let claim = BoardAdapter::new(tx.clone())
                    .claim("job", "second", TTL)
                    .await;
                tx.commit().await.unwrap();
                claim
            })
        };
        // The second is waiting for the write lock the first holds.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished());
        let won = BoardAdapter::new(first.clone())
            .claim("job", "first", TTL)
            .await
            .unwrap();
        first.commit().await.unwrap();
        let lost = second.await.unwrap();
        assert!(
            matches!(&lost, Err(BoardError::AlreadyClaimed { agent, .. }) if agent == "first"),
            "{lost:?}"
        );
        let task = BoardAdapter::new(Arc::new(store.clone()))
            .get("job")
            .await
            .unwrap();
        assert_eq!(task.fence, won.fence);
        store.close().await;
    }

    /// Two DEFERRED transactions (the caller's own `pool.begin()`) read the
    /// same missing record and both create it: the first commits, the
    /// second's write meets SQLITE_BUSY (its snapshot is stale), which is
    /// `Unavailable`; its transaction is broken (its own row included) and
    /// its COMMIT rolls back.
    #[tokio::test]
    async fn deferred_transactions_racing_one_record_one_wins_one_is_unavailable() {
        let (store, pool) = setup("intx_deferred").await;
        let one = InTransaction::from_transaction(pool.begin().await.unwrap(), NS).unwrap();
        let two = InTransaction::from_transaction(pool.begin().await.unwrap(), NS).unwrap();
        assert!(one.get("rec").await.unwrap().value.is_none());
        assert!(two.get("rec").await.unwrap().value.is_none());
        let create = |who: &str| (vec![Assert::missing("rec")], vec![put("rec", who)]);
        let (asserts, mutations) = create("one");
        assert!(one.txn(&asserts, &mutations).await.unwrap().applied);
        insert_order(&one, "o-one").await;
        one.commit().await.unwrap();
        let (asserts, mutations) = create("two");
        let err = two.txn(&asserts, &mutations).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        // Broken: refused until rolled back; its COMMIT rolls back.
        assert!(matches!(two.conn().await, Err(Error::Unavailable { .. })));
        assert!(matches!(
            two.get("rec").await,
            Err(Error::Unavailable { .. })
        ));
        let err = two.commit().await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        finished(two.get("rec").await.unwrap_err());
        let rec = store.get("rec").await.unwrap();
        assert_eq!(rec.value.as_deref(), Some(&b"one"[..]));
        assert_eq!(orders(&pool).await, ["o-one"]);
        store.close().await;
    }

    /// After commit or rollback every call is refused before reaching
    /// SQLite: the pool's only connection is held elsewhere, and every
    /// call still answers at once.
    #[tokio::test]
    async fn calls_after_commit_or_rollback_are_refused_and_send_nothing() {
        let (store, _) = setup("intx_finished").await;
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(coord_sqlite::pool_options(store.path()))
            .await
            .unwrap();
        for commit in [true, false] {
            let tx = InTransaction::begin(&pool, NS).await.unwrap();
            tx.txn(&[], &[put("k", "v")]).await.unwrap();
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            let _only = pool.acquire().await.unwrap();
            let calls = async {
                finished(tx.txn(&[], &[put("k", "w")]).await.unwrap_err());
                finished(tx.get("k").await.unwrap_err());
                finished(tx.keys("").await.unwrap_err());
                finished(tx.first_keys("", 1).await.unwrap_err());
                finished(tx.conn().await.unwrap_err());
                finished(tx.commit().await.unwrap_err());
                finished(tx.rollback().await.unwrap_err());
            };
            tokio::time::timeout(Duration::from_secs(5), calls)
                .await
                .expect("a call on a finished transaction waited for a connection");
        }
        let k = store.get("k").await.unwrap();
        assert_eq!(
            (k.version, k.value.as_deref()),
            (Version(1), Some(&b"v"[..]))
        );
        store.close().await;
    }

    /// A coord call cancelled half way (its future dropped while its
    /// statement runs) breaks the transaction: nothing of it commits.
    #[tokio::test]
    async fn a_cancelled_call_breaks_the_transaction() {
        let (store, pool) = setup("intx_cancelled").await;
        // SQLite's worker thread may answer before the first poll looks:
        // then the call finished, and the case is tried again.
        for _ in 0..50 {
            let tx = InTransaction::begin(&pool, NS).await.unwrap();
            insert_order(&tx, "o1").await;
            let cancelled = {
                let (asserts, mutations) = ([Assert::missing("k")], [put("k", "v")]);
                let call = tx.txn(&asserts, &mutations);
                let mut call = std::pin::pin!(call);
                std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending())).await
            };
            if !cancelled {
                tx.rollback().await.unwrap();
                continue;
            }
            assert!(matches!(tx.get("k").await, Err(Error::Unavailable { .. })));
            assert!(matches!(tx.commit().await, Err(Error::Unavailable { .. })));
            assert!(orders(&pool).await.is_empty());
            assert!(store.get("k").await.unwrap().value.is_none());
            store.close().await;
            return;
        }
        panic!("no txn was still running after its first poll");
    }

    /// A namespace that requires a newer storage format than this crate
    /// writes refuses txns inside a transaction too (it is read, not
    /// announced, there), and the transaction is not broken by it.
    #[tokio::test]
    async fn a_namespace_requiring_a_newer_format_refuses_txns() {
        let (store, pool) = setup("intx_format").await;
        store.txn(&[], &[put("k", "v")]).await.unwrap();
        sqlx::query("UPDATE coord_clients SET format = 999 WHERE ns = ?1 AND client = ''")
            .bind(NS)
            .execute(&pool)
            .await
            .unwrap();
        let tx = InTransaction::begin(&pool, NS).await.unwrap();
        let err = tx.txn(&[], &[put("k", "w")]).await.unwrap_err();
        assert!(
            matches!(err, Error::FormatMismatch { theirs: 999, .. }),
            "{err:?}"
        );
        assert_eq!(tx.get("k").await.unwrap().value.as_deref(), Some(&b"v"[..]));
        tx.commit().await.unwrap();
        store.close().await;
    }

    /// Waiting is refused (the watch), and so is maintenance.
    #[tokio::test]
    async fn watch_and_reclaim_are_refused() {
        let (store, pool) = setup("intx_watch").await;
        let tx = InTransaction::begin(&pool, NS).await.unwrap();
        assert_eq!(tx.store_name(), "sqlite-in-transaction");
        let changes = tx.changes().expect("changes() is Some");
        match changes.watch("").await {
            Err(Error::Unsupported { what, store }) => {
                assert_eq!(
                    what,
                    "waiting for other clients' commits inside a caller's transaction"
                );
                assert_eq!(store, "sqlite-in-transaction");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            tx.reclaim(&ReclaimOptions::default()).await,
            Err(Error::Unsupported { .. })
        ));
        // Neither broke the transaction.
        tx.txn(&[], &[put("k", "v")]).await.unwrap();
        tx.commit().await.unwrap();
        assert!(store.get("k").await.unwrap().value.is_some());
        store.close().await;
    }

    /// A pool on a file coord never prepared: a typed configuration error
    /// naming the fix.
    #[tokio::test]
    async fn a_database_without_the_schema_is_a_config_error() {
        let path = private_file("intx_no_schema");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let pool =
            SqlitePool::connect_with(coord_sqlite::pool_options(&path).create_if_missing(true))
                .await
                .unwrap();
        let tx = InTransaction::begin(&pool, NS).await.unwrap();
        for result in [
            tx.txn(&[], &[put("k", "v")]).await.map(|_| ()),
            tx.get("k").await.map(|_| ()),
            tx.keys("").await.map(|_| ()),
        ] {
            match result {
                Err(Error::Config(message)) => {
                    assert!(message.contains("SqliteBackend::open"), "{message}")
                }
                other => panic!("{other:?}"),
            }
        }
        tx.rollback().await.unwrap();
        assert!(matches!(
            InTransaction::begin(&pool, "").await,
            Err(Error::InvalidInput(InvalidInput::Namespace { .. }))
        ));
    }

    async fn account(pool: &SqlitePool, id: &str) -> Option<(i64, i64)> {
        sqlx::query_as("SELECT balance, fence FROM accounts WHERE id = ?1")
            .bind(id)
            .fetch_optional(pool)
            .await
            .unwrap()
    }

    async fn fenced_update(
        conn: &mut sqlx::SqliteConnection,
        id: &str,
        balance: i64,
        fence: u64,
    ) -> FencedWrite {
        FencedTable::new("accounts", "id", "fence")
            .unwrap()
            .update(id, fence)
            .unwrap()
            .set("balance", balance)
            .unwrap()
            .execute(conn)
            .await
            .unwrap()
    }

    /// A lower fence is refused and writes nothing; an equal or higher one
    /// writes; a missing row is `Missing` (and is not created); all inside
    /// the transaction, and rolled back with it.
    #[tokio::test]
    async fn fenced_writes_refuse_lower_fences_and_roll_back_with_the_transaction() {
        let (store, pool) = setup("intx_fenced").await;
        sqlx::query("INSERT INTO accounts (id, balance, fence) VALUES ('a', 100, 5)")
            .execute(&pool)
            .await
            .unwrap();
        let tx = InTransaction::begin(&pool, NS).await.unwrap();
        {
            let mut conn = tx.conn().await.unwrap();
            assert_eq!(
                fenced_update(&mut conn, "a", 1, 4).await,
                FencedWrite::Stale { highest: 5 }
            );
            assert_eq!(
                fenced_update(&mut conn, "a", 2, 5).await,
                FencedWrite::Written
            );
            assert_eq!(
                fenced_update(&mut conn, "a", 3, 5).await,
                FencedWrite::Written
            );
            assert_eq!(
                fenced_update(&mut conn, "a", 4, 7).await,
                FencedWrite::Written
            );
            assert_eq!(
                fenced_update(&mut conn, "a", 5, 6).await,
                FencedWrite::Stale { highest: 7 }
            );
            assert_eq!(
                fenced_update(&mut conn, "nobody", 1, 9).await,
                FencedWrite::Missing
            );
            let (balance, fence): (i64, i64) =
                sqlx::query_as("SELECT balance, fence FROM accounts WHERE id = 'a'")
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
            assert_eq!((balance, fence), (4, 7));
        }
        // Not visible outside, and gone after the rollback.
        assert_eq!(account(&pool, "a").await, Some((100, 5)));
        tx.rollback().await.unwrap();
        assert_eq!(account(&pool, "a").await, Some((100, 5)));
        // On the caller's own transaction, committed.
        let mut own = pool.begin().await.unwrap();
        assert_eq!(
            fenced_update(&mut own, "a", 6, 6).await,
            FencedWrite::Written
        );
        own.commit().await.unwrap();
        assert_eq!(account(&pool, "a").await, Some((6, 6)));
        store.close().await;
    }

    /// Two holders race to write one row, each in a transaction of its own,
    /// in both orders: the row ends with the higher fence's write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_fenced_writers_end_with_the_higher_fence() {
        let (store, pool) = setup("intx_fenced_race").await;
        for (round, first_is_higher) in [(0, true), (1, false), (2, true), (3, false)] {
            let id = format!("acct{round}");
            sqlx::query("INSERT INTO accounts (id, balance, fence) VALUES (?1, 0, 1)")
                .bind(&id)
                .execute(&pool)
                .await
                .unwrap();
            let (low, high) = (10 * round + 2, 10 * round + 3);
            let order = if first_is_higher {
                [high, low]
            } else {
                [low, high]
            };
            let writers: Vec<_> = order
                .into_iter()
                .map(|fence| {
                    let (pool, id) = (pool.clone(), id.clone());
                    tokio::spawn(async move {
                        let tx = InTransaction::begin(&pool, NS).await.unwrap();
                        let out = {
                            let mut conn = tx.conn().await.unwrap();
                            fenced_update(&mut conn, &id, fence as i64, fence).await
                        };
                        tx.commit().await.unwrap();
                        (fence, out)
                    })
                })
                .collect();
            let mut results = Vec::new();
            for writer in writers {
                results.push(writer.await.unwrap());
            }
            assert_eq!(
                account(&pool, &id).await,
                Some((high as i64, high as i64)),
                "{results:?}"
            );
            let high_result = results.iter().find(|(f, _)| *f == high).unwrap().1;
            assert_eq!(high_result, FencedWrite::Written, "{results:?}");
        }
        store.close().await;
    }

    /// Names are validated and quoted, never interpolated; a table or
    /// column that is not there is a configuration error.
    #[tokio::test]
    async fn fenced_identifiers_are_validated() {
        for (table, key, fence) in [
            ("accounts; DROP TABLE accounts", "id", "fence"),
            ("accounts", "id\"", "fence"),
            ("accounts", "id", ""),
            ("1accounts", "id", "fence"),
            ("a.b.c", "id", "fence"),
            ("accounts", "id", "id"),
        ] {
            let err = FencedTable::new(table, key, fence).unwrap_err();
            assert!(
                matches!(err, Error::InvalidInput(InvalidInput::Argument(_))),
                "{table} {key} {fence}: {err:?}"
            );
        }
        let accounts = FencedTable::new("main.accounts", "id", "fence").unwrap();
        for column in ["balance = 0 --", "id", "fence"] {
            assert!(matches!(
                accounts.update("a", 1).unwrap().set(column, 1_i64),
                Err(Error::InvalidInput(InvalidInput::Argument(_)))
            ));
        }
        let (store, pool) = setup("intx_fenced_names").await;
        let mut conn = pool.acquire().await.unwrap();
        for (table, column) in [("nothing", "balance"), ("accounts", "nothing")] {
            let err = FencedTable::new(table, "id", "fence")
                .unwrap()
                .update("a", 1)
                .unwrap()
                .set(column, 1_i64)
                .unwrap()
                .execute(&mut conn)
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{err:?}");
        }
        // The quoted name of a real table works, with its schema.
        assert_eq!(
            accounts
                .update("a", 1)
                .unwrap()
                .execute(&mut conn)
                .await
                .unwrap(),
            FencedWrite::Missing
        );
        store.close().await;
    }

    /// A backend that opens an `InTransaction` per raw call and commits
    /// right after it: the conformance suites through the in-transaction
    /// statements. `begin` is retried while the file is busy (nothing began,
    /// as a caller would).
    #[derive(Debug)]
    struct AutoCommit {
        pool: SqlitePool,
        namespace: String,
    }

    impl AutoCommit {
        async fn begin(&self) -> coord_backend::Result<Arc<InTransaction>> {
            let mut tries = 0;
            loop {
                match InTransaction::begin(&self.pool, &self.namespace).await {
                    Err(Error::Unavailable { .. }) if tries < 5 => tries += 1,
                    other => return other,
                }
            }
        }

        async fn finish<T>(
            tx: Arc<InTransaction>,
            result: coord_backend::Result<T>,
        ) -> coord_backend::Result<T> {
            match result {
                Ok(value) => tx.commit().await.map(|()| value),
                Err(error) => {
                    let _ = tx.rollback().await;
                    Err(error)
                }
            }
        }
    }

    #[async_trait::async_trait]
    impl Backend for AutoCommit {
        fn namespace(&self) -> &str {
            &self.namespace
        }

        async fn raw_snapshot(
            &self,
            keys: &[&str],
        ) -> coord_backend::Result<Vec<coord_backend::Entry>> {
            let tx = self.begin().await?;
            let result = tx.raw_snapshot(keys).await;
            Self::finish(tx, result).await
        }

        async fn raw_txn(
            &self,
            asserts: &[Assert],
            mutations: &[Mutation],
        ) -> coord_backend::Result<coord_backend::TxnOutcome> {
            let tx = self.begin().await?;
            let result = tx.raw_txn(asserts, mutations).await;
            Self::finish(tx, result).await
        }

        async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
            let tx = self.begin().await?;
            let result = tx.raw_keys(prefix).await;
            Self::finish(tx, result).await
        }

        async fn raw_first_keys(
            &self,
            prefix: &str,
            limit: usize,
        ) -> coord_backend::Result<Vec<String>> {
            let tx = self.begin().await?;
            let result = tx.raw_first_keys(prefix, limit).await;
            Self::finish(tx, result).await
        }
    }

    /// One file for every autocommit client of this binary (so namespaces
    /// share a store, as the suites expect).
    fn autocommit() -> BackendFactory {
        coord_conformance::factory(|namespace| async move {
            let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join("coord-sqlite")
                .join("in-transaction.db");
            SqliteBackend::open(&path, &namespace).await?.close().await;
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(coord_sqlite::pool_options(&path))
                .await
                .map_err(|e| Error::unavailable("pool", e))?;
            Ok(Arc::new(AutoCommit { pool, namespace }) as Arc<dyn Backend>)
        })
    }

    mod autocommit_backend {
        use super::*;
        coord_conformance::backend_tests!(autocommit());
    }
    mod autocommit_board {
        use super::*;
        coord_conformance::board_tests!(autocommit());
    }
    mod autocommit_sideeffect {
        use super::*;
        coord_conformance::sideeffect_tests!(autocommit());
    }
}
