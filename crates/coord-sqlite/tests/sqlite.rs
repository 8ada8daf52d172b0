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
