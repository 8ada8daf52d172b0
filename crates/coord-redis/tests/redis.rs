//! coord-redis against real servers: the conformance suite on standalone Redis
//! (`COORD_TEST_REDIS_URL`) and on Redis Cluster (`COORD_TEST_REDIS_CLUSTER_URL`,
//! see scripts/redis-cluster.sh), plus what only a real Redis shows: a race
//! between processes, a connection cut after a txn was sent, a server that is
//! down, records this crate did not write.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Assert, Backend, BackendExt, Error, Mutation, StoreUrl, Version};
use coord_conformance::fault::FaultProxy;
use coord_conformance::support::applied;
use coord_conformance::{factory, server_env, unique_namespace, BackendFactory};
use coord_redis::{RedisBackend, RedisOptions};

const STANDALONE: &str = "COORD_TEST_REDIS_URL";
const CLUSTER: &str = "COORD_TEST_REDIS_CLUSTER_URL";

/// `base` with `?namespace=` (or `&namespace=`) appended.
fn with_namespace(base: &str, namespace: &str) -> StoreUrl {
    let sep = if base.contains('?') { '&' } else { '?' };
    StoreUrl::parse(&format!("{base}{sep}namespace={namespace}")).expect("test URL parses")
}

async fn connect(base: &str, namespace: &str) -> RedisBackend {
    RedisBackend::connect(&with_namespace(base, namespace))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {base}: {e}"))
}

/// A plain client connection to `base`, for looking behind the store's back.
async fn raw_connection(base: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(base).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

fn factory_for(var: &str) -> Option<BackendFactory> {
    let base = server_env(var)?;
    Some(factory(move |namespace| {
        let url = with_namespace(&base, &namespace);
        async move {
            let store = RedisBackend::connect(&url).await?;
            Ok(Arc::new(store) as Arc<dyn Backend>)
        }
    }))
}

/// Options that give up quickly, for the "server is down" checks.
fn impatient() -> RedisOptions {
    RedisOptions::default()
        .with_connect_timeout(Duration::from_secs(1))
        .with_response_timeout(Some(Duration::from_secs(2)))
        .with_reconnect_retries(0)
        .with_read_retries(1)
}

/// Redis-specific semantics, run on both deployments (the shared suite covers the rest).
async fn semantics(base: &str) {
    let ns = unique_namespace("semantics");
    let store = connect(base, &ns).await;

    // Versions: +1 per write, a tombstone keeps counting, re-create continues.
    let put = store
        .put_if("k", Version::MISSING, b"1".to_vec())
        .await
        .unwrap();
    assert!(put.applied);
    assert_eq!(store.get("k").await.unwrap().version, Version(1));
    assert!(applied(store.delete_if("k", Version(1))).await);
    let gone = store.get("k").await.unwrap();
    assert_eq!((gone.version, gone.value), (Version::MISSING, None));
    let stale = store.put_if("k", Version(1), b"x".to_vec()).await.unwrap();
    assert!(!stale.applied, "a stale assert passed after delete");
    assert!(applied(store.put_if("k", Version::MISSING, b"2".to_vec())).await);
    let again = store.get("k").await.unwrap();
    assert_eq!(
        again.version,
        Version(3),
        "re-create must not reuse a version"
    );
    assert_eq!(again.value.as_deref(), Some(&b"2"[..]));

    // A rejected txn writes nothing and returns the asserted keys, one per distinct key.
    let out = store
        .txn(
            &[
                Assert::at("k", Version(3)),
                Assert::missing("other"),
                Assert::at("k", Version(3)),
                Assert::at("absent", Version(7)),
            ],
            &[
                Mutation::put("k", b"no".to_vec()),
                Mutation::put("new", b"no".to_vec()),
            ],
        )
        .await
        .unwrap();
    assert!(!out.applied);
    let seen: Vec<(&str, Version)> = out
        .current
        .iter()
        .map(|e| (e.key.as_str(), e.version))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("k", Version(3)),
            ("other", Version::MISSING),
            ("absent", Version::MISSING)
        ]
    );
    assert_eq!(out.current[0].value.as_deref(), Some(&b"2"[..]));
    let after = store
        .snapshot(&["k".into(), "new".into(), "k".into()])
        .await
        .unwrap();
    assert_eq!(after.len(), 2, "duplicated keys count once");
    assert_eq!(after[0].version, Version(3));
    assert!(!after[1].exists(), "a rejected txn wrote a key");

    // Multi-key all-or-nothing, binary values, deleting a missing key bumps its counter.
    let value = vec![0u8, 255, 10, 13, 0];
    let out = store
        .txn(
            &[Assert::at("k", Version(3))],
            &[
                Mutation::put("k", value.clone()),
                Mutation::put("bin", value.clone()),
                Mutation::delete("never"),
            ],
        )
        .await
        .unwrap();
    assert!(out.applied && out.current.is_empty());
    let all = store
        .snapshot(&["k".into(), "bin".into(), "never".into()])
        .await
        .unwrap();
    assert_eq!(all[0].value.as_deref(), Some(value.as_slice()));
    assert_eq!(all[0].version, Version(4));
    assert_eq!(all[1].version, Version(1));
    assert!(!all[2].exists());
    assert!(applied(store.put_if("never", Version::MISSING, b"n".to_vec())).await);
    assert_eq!(store.get("never").await.unwrap().version, Version(2));

    // Prefixes are literal bytes; tombstones are not listed; namespaces are disjoint.
    let keys = [
        "p*",
        "p*x",
        "p%",
        "p_",
        "p?",
        "p[",
        "p{",
        "p\\",
        "p\u{e9}",
        "p\u{e9}\u{1F600}",
        "pa",
        "q",
    ];
    for key in keys {
        assert!(applied(store.put_if(key, Version::MISSING, b"x".to_vec())).await);
    }
    assert!(applied(store.delete_if("pa", Version(1))).await);
    let listed = |prefix: &'static str| {
        let store = store.clone();
        async move { store.keys(prefix).await.unwrap() }
    };
    assert_eq!(listed("p*").await, vec!["p*", "p*x"]);
    assert_eq!(listed("p%").await, vec!["p%"]);
    assert_eq!(listed("p[").await, vec!["p["]);
    assert_eq!(listed("p{").await, vec!["p{"]);
    assert_eq!(listed("p\\").await, vec!["p\\"]);
    assert_eq!(listed("p\u{e9}").await, vec!["p\u{e9}", "p\u{e9}\u{1F600}"]);
    assert_eq!(listed("pa").await, Vec::<String>::new(), "tombstone listed");
    let mut expected: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with('p') && **k != "pa")
        .map(|k| k.to_string())
        .collect();
    expected.sort();
    assert_eq!(listed("p").await, expected, "not sorted by bytes");
    let everything = listed("").await;
    assert!(everything.contains(&"q".to_string()) && everything.contains(&"k".to_string()));

    let neighbour = connect(base, &format!("{ns}x")).await;
    assert!(neighbour.keys("").await.unwrap().is_empty());
    assert!(!neighbour.get("k").await.unwrap().exists());

    // Bad input is refused before anything is sent.
    assert!(matches!(
        store.txn(&[], &[Mutation::put("", b"x".to_vec())]).await,
        Err(Error::InvalidInput(_))
    ));
}

/// [`semantics`] against the server named by the variable `var` (skipped when unset).
async fn semantics_on(var: &str) {
    if let Some(base) = coord_conformance::server_env(var) {
        semantics(&base).await;
    }
}

/// Every put of an applied txn reports the version the script stored (both
/// txn scripts), also over a tombstone and after a reclaim raised the floor;
/// against the server named by `var` (skipped when unset).
async fn puts_report_on(var: &str) {
    let Some(factory) = factory_for(var) else {
        return;
    };
    let store = factory(unique_namespace("every_put")).await.unwrap();
    if let Err(failure) = coord_conformance::backend::every_put_reports_its_version(store).await {
        panic!("{}", failure.message);
    }
}

mod standalone {
    use super::{factory_for, STANDALONE};
    coord_conformance::all_suites_tests!(factory_for(STANDALONE));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semantics() {
        super::semantics_on(super::STANDALONE).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn committed_puts_report_their_versions() {
        super::puts_report_on(super::STANDALONE).await;
    }
}

mod cluster {
    use super::{factory_for, CLUSTER};
    coord_conformance::all_suites_tests!(factory_for(CLUSTER));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semantics() {
        super::semantics_on(super::CLUSTER).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn committed_puts_report_their_versions() {
        super::puts_report_on(super::CLUSTER).await;
    }

    /// Every Redis key of one namespace hashes to one slot (one shard).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespace_is_one_slot() {
        let Some(base) = coord_conformance::server_env(super::CLUSTER) else {
            return;
        };
        let ns = coord_conformance::unique_namespace("slot");
        let store = super::connect(&base, &ns).await;
        let mut mutations = Vec::new();
        for i in 0..40 {
            mutations.push(coord_backend::Mutation::put(
                format!("key-{i}"),
                b"x".to_vec(),
            ));
        }
        // Forty keys in one script: a cross-slot script would be refused by the cluster.
        use coord_backend::Backend;
        assert!(super::applied(store.txn(&[], &mutations)).await);
        assert_eq!(store.keys("key-").await.unwrap().len(), 40);
    }
}

/// Four processes each add 1 to one counter fifty times through CAS; the
/// total must be exact. The children are this test binary, re-run with
/// `COORD_REDIS_CHILD_NAMESPACE` set, running only this test.
mod cross_process {
    use super::*;

    const CHILDREN: usize = 4;
    const INCREMENTS: u64 = 50;
    const CHILD_ENV: &str = "COORD_REDIS_CHILD_NAMESPACE";

    async fn increment_many(store: &RedisBackend) {
        for _ in 0..INCREMENTS {
            let mut current = store.get("counter").await.unwrap();
            let mut attempts = 0;
            loop {
                attempts += 1;
                assert!(attempts < 10_000, "CAS never won");
                let n: u64 = match &current.value {
                    Some(raw) => std::str::from_utf8(raw).unwrap().parse().unwrap(),
                    None => 0,
                };
                let out = store
                    .put_if("counter", current.version, (n + 1).to_string().into_bytes())
                    .await
                    .unwrap();
                if out.applied {
                    break;
                }
                // The rejected txn carries the fresh entry: no extra read.
                current = out
                    .current
                    .into_iter()
                    .next()
                    .expect("asserted key returned");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cas_race() {
        if let Ok(ns) = std::env::var(CHILD_ENV) {
            let base = std::env::var(STANDALONE).unwrap();
            increment_many(&connect(&base, &ns).await).await;
            return;
        }
        let Some(base) = server_env(STANDALONE) else {
            return;
        };
        let ns = unique_namespace("cross_process");
        let exe = std::env::current_exe().unwrap();
        let mut children = Vec::new();
        for _ in 0..CHILDREN {
            children.push(
                tokio::process::Command::new(&exe)
                    .args(["--exact", "cross_process::cas_race", "--test-threads", "1"])
                    .env(CHILD_ENV, &ns)
                    .env(STANDALONE, &base)
                    .stdout(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap(),
            );
        }
        for mut child in children {
            let status = child.wait().await.unwrap();
            assert!(status.success(), "a child process failed: {status}");
        }
        let total = CHILDREN as u64 * INCREMENTS;
        let counter = connect(&base, &ns).await.get("counter").await.unwrap();
        assert_eq!(counter.value, Some(total.to_string().into_bytes()));
        assert_eq!(counter.version, Version(total));
    }
}

/// `host:port` of a `redis://[user:pass@]host:port[/db][?query]` URL, and the
/// URL with that authority replaced by `addr`.
fn reroute(base: &str, addr: SocketAddr) -> (String, String) {
    let (scheme, rest) = base.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    (
        hostport.to_owned(),
        format!("{scheme}://{userinfo}{addr}{tail}"),
    )
}

async fn proxied(base: &str) -> (FaultProxy, String) {
    let (hostport, _) = reroute(base, "127.0.0.1:1".parse().unwrap());
    let upstream = tokio::net::lookup_host(&hostport)
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = FaultProxy::start(upstream).await.unwrap();
    let (_, url) = reroute(base, proxy.addr());
    (proxy, url)
}

/// The connection breaks after the txn script was sent and before its reply:
/// the answer is Indeterminate (never applied=false), and the txn did commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_cut_after_send_is_indeterminate() {
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    if base.starts_with("rediss") {
        eprintln!("SKIPPED: the fault proxy needs to see the plaintext EVALSHA");
        return;
    }
    let ns = unique_namespace("fault");
    let (proxy, url) = proxied(&base).await;
    let store = connect(&url, &ns).await;
    // Also makes sure the server has both txn scripts cached (the general
    // one creates the key, the one-key put overwrites it), so the cut hits
    // the real EVALSHA and not a NOSCRIPT answer.
    assert!(applied(store.put_if("k", Version::MISSING, b"0".to_vec())).await);
    assert!(applied(store.put_if("k", Version(1), b"1".to_vec())).await);

    proxy.cut_next_reply(b"EVALSHA");
    let result = store.put_if("k", Version(2), b"2".to_vec()).await;
    assert_eq!(proxy.cuts(), 1);
    assert!(
        matches!(result, Err(Error::Indeterminate { .. })),
        "expected Indeterminate, got {result:?}"
    );

    let fresh = connect(&base, &ns).await.get("k").await.unwrap();
    assert_eq!(fresh.version, Version(3), "the cut txn did not commit");
    assert_eq!(fresh.value.as_deref(), Some(&b"2"[..]));

    // The old client reconnects by itself.
    let again = store.get("k").await.unwrap();
    assert_eq!(again.version, Version(3));
    assert!(applied(store.put_if("k", Version(3), b"3".to_vec())).await);
}

/// Nothing listens: connecting fails as Unavailable, never a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_is_unavailable() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    for raw in [
        format!("redis://127.0.0.1:{closed}"),
        format!("redis+cluster://127.0.0.1:{closed}"),
    ] {
        let url = StoreUrl::parse(&raw).unwrap();
        let result = RedisBackend::connect_with(&url, impatient()).await;
        assert!(
            matches!(result, Err(Error::Unavailable { .. })),
            "{raw}: expected Unavailable, got {result:?}"
        );
    }
}

/// An [`impatient`] store on `url` that has written `k` at version 1.
async fn impatient_with_k(url: &str, ns: &str) -> RedisBackend {
    let store = RedisBackend::connect_with(&with_namespace(url, ns), impatient())
        .await
        .unwrap();
    let put = store.put_if("k", Version::MISSING, b"1".to_vec()).await;
    assert!(put.unwrap().applied);
    store
}

/// The server goes away under a connected client: every call fails, reads as
/// Unavailable, a txn as Unavailable or Indeterminate, never as a success or
/// as applied=false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_gone_fails_every_call() {
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let ns = unique_namespace("gone");
    let (proxy, url) = proxied(&base).await;
    let store = impatient_with_k(&url, &ns).await;
    drop(proxy);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let read = store.get("k").await;
    assert!(matches!(read, Err(Error::Unavailable { .. })), "{read:?}");
    let listed = store.keys("").await;
    assert!(
        matches!(listed, Err(Error::Unavailable { .. })),
        "{listed:?}"
    );
    let txn = store.put_if("k", Version(1), b"2".to_vec()).await;
    assert!(
        matches!(
            txn,
            Err(Error::Unavailable { .. } | Error::Indeterminate { .. })
        ),
        "{txn:?}"
    );
    // Nothing got through.
    assert_eq!(
        connect(&base, &ns).await.get("k").await.unwrap().version,
        Version(1)
    );
}

/// Bytes this crate did not write are MalformedRecord, and a txn touching
/// them writes nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_records_are_malformed() {
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let ns = unique_namespace("malformed");
    let store = connect(&base, &ns).await;
    let mut raw = raw_connection(&base).await;
    let record = |key: &str| format!("coord:{{{ns}}}:k:{key}");
    let _: () = redis::cmd("SET")
        .arg(record("string"))
        .arg("oops")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(record("noversion"))
        .arg("d")
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();

    for key in ["string", "noversion"] {
        let read = store.get(key).await;
        assert!(
            matches!(&read, Err(Error::MalformedRecord { key: k, .. }) if k == key),
            "{key}: {read:?}"
        );
        let write = store
            .txn(
                &[Assert::missing("fine")],
                &[
                    Mutation::put("fine", b"x".to_vec()),
                    Mutation::put(key, b"y".to_vec()),
                ],
            )
            .await;
        assert!(
            matches!(&write, Err(Error::MalformedRecord { .. })),
            "{key}: {write:?}"
        );
        assert!(
            !store.get("fine").await.unwrap().exists(),
            "half a txn applied"
        );
    }

    let _: () = redis::cmd("SET")
        .arg(format!("coord:{{{ns}}}:idx"))
        .arg("not a zset")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(matches!(
        store.keys("").await,
        Err(Error::MalformedRecord { .. })
    ));
    assert!(matches!(
        store.put_if("fine", Version::MISSING, b"x".to_vec()).await,
        Err(Error::MalformedRecord { .. })
    ));
    assert!(
        !store.get("fine").await.unwrap().exists(),
        "half a txn applied"
    );
}

/// The server closes an idle client connection (`CLIENT KILL`). With RESP2
/// the client only learns of it when it next sends, so that txn is
/// Indeterminate (it cannot tell "not sent" from "reply lost") and the one
/// after it succeeds; with RESP3 the manager reconnects as soon as the
/// connection reports the drop, and the next txn succeeds. Either way the
/// txn is never applied=false and never applied twice. Uses db 7 so that
/// the kill finds only this test's connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_killed_by_server() {
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let authority_only = base
        .split_once("://")
        .is_some_and(|(_, rest)| !rest.trim_end_matches('/').contains(['/', '?']));
    if !authority_only || base.starts_with("rediss") {
        eprintln!("SKIPPED: needs a plaintext URL without a db path or query");
        return;
    }
    let base = base.trim_end_matches('/').to_owned();
    let mut raw = raw_connection(&base).await;
    for protocol in ["resp2", "resp3"] {
        let ns = unique_namespace(&format!("kill_{protocol}"));
        let store = connect(&format!("{base}/7?protocol={protocol}"), &ns).await;
        assert!(applied(store.put_if("k", Version::MISSING, b"1".to_vec())).await);
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut raw)
            .await
            .unwrap();
        let ids: Vec<String> = list
            .lines()
            .filter(|line| line.split(' ').any(|f| f == "db=7"))
            .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_owned)
            .collect();
        assert!(!ids.is_empty(), "the store's connection is not listed");
        for id in ids {
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(&id)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let first = store.put_if("k", Version(1), b"2".to_vec()).await;
        match (protocol, &first) {
            (_, Ok(out)) => assert!(out.applied, "{protocol}: {out:?}"),
            // Only RESP2 may not know yet; the version check below shows it never left.
            ("resp2", Err(Error::Indeterminate { .. })) => {}
            _ => panic!("{protocol}: {first:?}"),
        }
        let expected = if first.is_ok() { 2 } else { 1 };
        let now = store.get("k").await.unwrap();
        assert_eq!(now.version, Version(expected), "{protocol}: {first:?}");
        eprintln!("{protocol}: first txn after the kill: {first:?}");
        assert!(applied(store.put_if("k", now.version, b"3".to_vec())).await);
    }
}

/// Redis servers started by a test, for what must not touch the shared ones:
/// a server that is stopped, another eviction policy, a slot migration.
mod private {
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// One `redis-server` child on a free loopback port, killed on drop.
    pub(crate) struct PrivateRedis {
        pub(crate) port: u16,
        child: Option<Child>,
        dir: PathBuf,
    }

    impl PrivateRedis {
        /// `None` (SKIPPED, or a panic under `COORD_REQUIRE_SERVERS=1`) when
        /// `redis-server` is not installed.
        pub(crate) fn start(extra: &[&str]) -> Option<PrivateRedis> {
            if Command::new("redis-server")
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_err()
            {
                if std::env::var("COORD_REQUIRE_SERVERS").as_deref() == Ok("1") {
                    panic!("redis-server is not installed but COORD_REQUIRE_SERVERS=1");
                }
                eprintln!("SKIPPED: redis-server is not installed");
                return None;
            }
            // A clash with another process between the check and the bind
            // makes the child exit: try another port.
            for _ in 0..20 {
                let port = free_port();
                let dir = std::env::temp_dir()
                    .join(format!("coord-redis-test-{}-{port}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let child = Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&dir)
                    .args(extra)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn redis-server");
                let mut server = PrivateRedis {
                    port,
                    child: Some(child),
                    dir,
                };
                if server.wait_until_up() {
                    return Some(server);
                }
            }
            panic!("could not start a private redis-server");
        }

        pub(crate) fn url(&self) -> String {
            format!("redis://127.0.0.1:{}", self.port)
        }

        /// Waits for PING; false when the child exited (port taken).
        fn wait_until_up(&mut self) -> bool {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Some(child) = self.child.as_mut() {
                    if child.try_wait().unwrap().is_some() {
                        self.child = None;
                        return false;
                    }
                }
                if self.ping() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("private redis-server on port {} did not answer", self.port);
        }

        fn ping(&self) -> bool {
            redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        }

        /// Kill the server and wait until its port refuses connections.
        pub(crate) fn stop(&mut self) {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                assert!(Instant::now() < deadline, "port {} still open", self.port);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    impl Drop for PrivateRedis {
        fn drop(&mut self) {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A free port whose cluster bus port (+10000) is free too.
    fn free_port() -> u16 {
        loop {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
            if port <= u16::MAX - 10_000 && free(port) && free(port + 10_000) {
                return port;
            }
        }
    }
}

/// The server stops under a connected client, behind a proxy that still
/// accepts connections (as a load balancer or a sidecar would) and then
/// with nothing listening at all: a txn that could not be sent because no
/// connection could be (re)established is Unavailable, never Indeterminate.
/// (A cut after sending stays Indeterminate: `txn_cut_after_send_is_indeterminate`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_without_a_connection_is_unavailable() {
    if server_env(STANDALONE).is_none() {
        return;
    }
    for protocol in ["resp2", "resp3"] {
        let Some(mut server) = private::PrivateRedis::start(&[]) else {
            return;
        };
        let upstream: SocketAddr = ([127, 0, 0, 1], server.port).into();
        let proxy = FaultProxy::start(upstream).await.unwrap();
        let ns = unique_namespace("unsent");
        let url = format!("redis://{}?protocol={protocol}", proxy.addr());
        let store = impatient_with_k(&url, &ns).await;
        server.stop();
        // A read notices the broken connection (with RESP2 nothing else
        // does); from then on no connection can be made.
        let read = store.get("k").await;
        assert!(
            matches!(read, Err(Error::Unavailable { .. })),
            "{protocol}: {read:?}"
        );
        for attempt in 0..3 {
            let txn = store.put_if("k", Version(1), b"2".to_vec()).await;
            assert!(
                matches!(txn, Err(Error::Unavailable { .. })),
                "{protocol}: txn {attempt} through a proxy with no server behind it: {txn:?}"
            );
        }
        drop(proxy);
        for attempt in 0..3 {
            let txn = store.put_if("k", Version(1), b"2".to_vec()).await;
            assert!(
                matches!(txn, Err(Error::Unavailable { .. })),
                "{protocol}: txn {attempt} with nothing listening: {txn:?}"
            );
        }
    }
}

/// Raw commands on one node, for test setup.
fn raw_cmd<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(5))?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn)
}

/// The versions a txn reports are exact decimals, also where a Lua number
/// (a double) is not (above 2^53, up to the last version `HINCRBY` reaches)
/// and where a carry runs through nines: both txn scripts, each put reported
/// at what a read returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_versions_are_exact_decimals() {
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let ns = unique_namespace("exact");
    let store = connect(&base, &ns).await;
    let mut raw = raw_connection(&base).await;
    let record = format!("coord:{{{ns}}}:k:big");
    for start in [8, 98, 1999, (1 << 53) + 1, i64::MAX as u64 - 2] {
        let _: () = redis::cmd("HSET")
            .arg(&record)
            .arg("v")
            .arg(start.to_string())
            .arg("d")
            .arg("old")
            .query_async(&mut raw)
            .await
            .unwrap();
        // The one-key script, then the general one (with a second key).
        let one = store
            .put_if("big", Version(start), b"one".to_vec())
            .await
            .unwrap();
        assert_eq!(one.written, vec![("big".to_owned(), Version(start + 1))]);
        let two = store
            .txn(
                &[Assert::at("big", Version(start + 1))],
                &[
                    Mutation::put("big", b"two".to_vec()),
                    Mutation::put(format!("other{start}"), b"x".to_vec()),
                ],
            )
            .await
            .unwrap();
        assert_eq!(two.written_version("big"), Some(Version(start + 2)));
        assert_eq!(store.get("big").await.unwrap().version, Version(start + 2));
    }
}

/// Bytes this crate could not have written in a version field (above what
/// `HINCRBY` can reach, leading zeros, not a number, the last value
/// `HINCRBY` can produce): every txn writing such a record is
/// MalformedRecord and writes nothing, also when other keys come first,
/// and also a put asserting only that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_version_fields_are_malformed_and_nothing_is_written() {
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let ns = unique_namespace("damaged");
    let store = connect(&base, &ns).await;
    let mut raw = raw_connection(&base).await;
    let record = format!("coord:{{{ns}}}:k:damaged");
    assert!(applied(store.put_if("other", Version::MISSING, b"before".to_vec())).await);
    for version in [
        "18446744073709551615",
        "9223372036854775808",
        "9223372036854775807",
        "007",
        "abc",
        "-3",
    ] {
        let _: () = redis::cmd("HSET")
            .arg(&record)
            .arg("v")
            .arg(version)
            .arg("d")
            .arg("old")
            .query_async(&mut raw)
            .await
            .unwrap();
        let write = store
            .txn(
                &[Assert::at("other", Version(1))],
                &[
                    Mutation::put("other", b"after".to_vec()),
                    Mutation::put("fresh", b"new".to_vec()),
                    Mutation::put("damaged", b"new".to_vec()),
                ],
            )
            .await;
        assert!(
            matches!(&write, Err(Error::MalformedRecord { key, .. }) if key == "damaged"),
            "version {version}: {write:?}"
        );
        let other = store.get("other").await.unwrap();
        assert_eq!(
            (other.version, other.value.as_deref()),
            (Version(1), Some(&b"before"[..])),
            "version {version}: half a txn applied"
        );
        assert!(
            !store.get("fresh").await.unwrap().exists(),
            "version {version}: half a txn applied"
        );
        assert_eq!(store.keys("").await.unwrap(), vec!["other"]);
        // A put over the one key it asserts runs a script of its own: it
        // judges the same bytes alike (at the last version HINCRBY reaches,
        // asserting exactly that version, the counter is exhausted).
        let asserted = match version.parse::<u64>() {
            Ok(v) if v == i64::MAX as u64 => Version(v),
            _ => Version(7),
        };
        let put = store
            .txn(
                &[Assert::at("damaged", asserted)],
                &[Mutation::put("damaged", b"new".to_vec())],
            )
            .await;
        assert!(
            matches!(&put, Err(Error::MalformedRecord { key, .. }) if key == "damaged"),
            "version {version}, one-key put: {put:?}"
        );
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&record)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(fields.get("v").map(String::as_str), Some(version));
        assert_eq!(fields.get("d").map(String::as_str), Some("old"));
        // A read reports it too rather than handing out a version no txn can
        // assert; the last version HINCRBY can reach is still readable.
        let read = store.get("damaged").await;
        if version == "9223372036854775807" {
            assert_eq!(read.unwrap().version, Version(i64::MAX as u64));
        } else {
            assert!(
                matches!(&read, Err(Error::MalformedRecord { .. })),
                "version {version}: {read:?}"
            );
        }
    }
}

/// `maxmemory-policy` other than `noeviction` lets Redis drop records and
/// with them versions and tombstones: connecting is refused with a typed
/// error unless the caller opts out; the check costs no round trip per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_policy_is_checked_once_at_connect() {
    if server_env(STANDALONE).is_none() {
        return;
    }
    let ns = unique_namespace("eviction");
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let Some(server) = private::PrivateRedis::start(&["--maxmemory-policy", policy]) else {
            return;
        };
        let url = with_namespace(&server.url(), &ns);
        let refused = RedisBackend::connect(&url).await;
        assert!(
            matches!(&refused, Err(Error::Config(m)) if m.contains(policy) && m.contains("noeviction")),
            "{policy}: {refused:?}"
        );
        let allowed =
            RedisBackend::connect_with(&url, RedisOptions::default().with_allow_eviction(true))
                .await
                .unwrap();
        assert!(applied(allowed.put_if("k", Version::MISSING, b"x".to_vec())).await);
    }

    // CONFIG renamed away: the policy cannot be read; connect warns and proceeds.
    let Some(hidden) = private::PrivateRedis::start(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]) else {
        return;
    };
    let store = RedisBackend::connect(&with_namespace(&hidden.url(), &ns))
        .await
        .unwrap();
    assert!(applied(store.put_if("k", Version::MISSING, b"x".to_vec())).await);

    // noeviction: connects, and the policy is read once, not per call.
    let Some(server) = private::PrivateRedis::start(&[]) else {
        return;
    };
    let store = RedisBackend::connect(&with_namespace(&server.url(), &ns))
        .await
        .unwrap();
    for i in 0..20u64 {
        let version = if i == 0 { Version::MISSING } else { Version(i) };
        assert!(applied(store.put_if("k", version, b"x".to_vec())).await);
    }
    let stats: String = raw_cmd(server.port, &["INFO", "commandstats"]).unwrap();
    // Successful calls (the first EVALSHA fails with NOSCRIPT, then loads).
    let calls = |name: &str| -> u64 {
        let line = stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:")))
            .unwrap_or("");
        let field = |f: &str| -> u64 {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                .map_or(0, |n| n.parse().unwrap())
        };
        field("calls") - field("failed_calls")
    };
    assert_eq!(calls("config|get"), 1, "{stats}");
    // 20 txns and the client's one announcement of its storage format.
    assert_eq!(calls("evalsha"), 21, "{stats}");
}

/// A private three-master Redis Cluster (the shared one on 7001-7003 must
/// not be resharded under other tests).
struct PrivateCluster {
    nodes: Vec<private::PrivateRedis>,
}

impl PrivateCluster {
    fn start() -> Option<PrivateCluster> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(private::PrivateRedis::start(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            ])?);
        }
        let status = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli is installed with redis-server");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = PrivateCluster { nodes };
        cluster.wait_until(|info| info.contains("cluster_state:ok"));
        Some(cluster)
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    fn wait_until(&self, ok: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let all = self.nodes.iter().all(|n| {
                raw_cmd::<String>(n.port, &["CLUSTER", "INFO"]).is_ok_and(|info| ok(&info))
            });
            if all {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the private cluster did not settle"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn id(&self, port: u16) -> String {
        raw_cmd(port, &["CLUSTER", "MYID"]).unwrap()
    }

    /// The port of the master serving `slot`.
    fn owner(&self, slot: u16) -> u16 {
        let nodes: String = raw_cmd(self.nodes[0].port, &["CLUSTER", "NODES"]).unwrap();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let port: u16 = fields[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
            for range in &fields[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) {
                    if (lo..=hi).contains(&slot) {
                        return port;
                    }
                }
            }
        }
        panic!("nobody serves slot {slot}");
    }
}

/// Resharding under a connected client: while the namespace's slot is
/// MIGRATING (every key already moved, so the old owner answers `ASK`) and
/// after it moved (the client's slot map is stale, so `MOVED`), txns,
/// snapshots and key listings still succeed, each txn applied exactly once.
/// Then the eviction check covers every master, not only the seed node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_redirects_are_followed_during_resharding() {
    if server_env(CLUSTER).is_none() {
        return;
    }
    let Some(cluster) = PrivateCluster::start() else {
        return;
    };
    let ns = unique_namespace("reshard");
    let store = connect(&cluster.url(), &ns).await;
    for key in ["a", "b"] {
        assert!(applied(store.put_if(key, Version::MISSING, b"1".to_vec())).await);
    }
    let index = format!("coord:{{{ns}}}:idx");
    let slot: u16 = raw_cmd(cluster.nodes[0].port, &["CLUSTER", "KEYSLOT", &index]).unwrap();
    let source = cluster.owner(slot);
    let target = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|p| *p != source)
        .unwrap();
    let (source_id, target_id) = (cluster.id(source), cluster.id(target));
    let slot_arg = slot.to_string();
    let _: () = raw_cmd(
        target,
        &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source_id],
    )
    .unwrap();
    let _: () = raw_cmd(
        source,
        &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target_id],
    )
    .unwrap();
    let keys: Vec<String> =
        raw_cmd(source, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]).unwrap();
    // The index, the tombstone set, the floor, the announcements and the two records.
    assert_eq!(keys.len(), 6, "{keys:?}");
    let target_arg = target.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &target_arg, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    let _: () = raw_cmd(source, &migrate).unwrap();

    // ASK: the old owner still owns the slot but no longer holds the keys.
    for (i, version) in [(2u64, Version(1)), (3, Version(2))] {
        let out = store.put_if("a", version, i.to_string().into_bytes()).await;
        assert!(
            matches!(&out, Ok(o) if o.applied),
            "txn during migration: {out:?}"
        );
    }
    let seen = store.snapshot(&["a".into(), "b".into()]).await.unwrap();
    assert_eq!((seen[0].version, seen[1].version), (Version(3), Version(1)));
    assert_eq!(store.keys("").await.unwrap(), vec!["a", "b"]);
    // Creating a key needs a key the target does not hold yet: Redis
    // answers TRYAGAIN until the migration ends. Nothing ran, so this is
    // Unavailable (never Indeterminate, never applied = false).
    let create = store.put_if("new", Version::MISSING, b"1".to_vec()).await;
    eprintln!("create during migration: {create:?}");
    assert!(
        matches!(&create, Err(Error::Unavailable { .. })),
        "{create:?}"
    );

    // MOVED: the slot now belongs to the target; the client's map is stale.
    for port in cluster.nodes.iter().map(|n| n.port) {
        let _: () = raw_cmd(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id]).unwrap();
    }
    let out = store.put_if("b", Version(1), b"2".to_vec()).await;
    assert!(
        matches!(&out, Ok(o) if o.applied),
        "txn after migration: {out:?}"
    );
    assert!(applied(store.put_if("c", Version::MISSING, b"1".to_vec())).await);
    let seen = store
        .snapshot(&["a".into(), "b".into(), "c".into()])
        .await
        .unwrap();
    let versions: Vec<Version> = seen.iter().map(|e| e.version).collect();
    assert_eq!(versions, vec![Version(3), Version(2), Version(1)]);
    assert_eq!(store.keys("").await.unwrap(), vec!["a", "b", "c"]);
    let on_target: String =
        raw_cmd(target, &["HGET", &format!("coord:{{{ns}}}:k:a"), "v"]).unwrap();
    assert_eq!(on_target, "3", "each txn applied exactly once");

    // Eviction on a master that is not the seed node is found too.
    let last = cluster.nodes[2].port;
    let _: () = raw_cmd(
        last,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    )
    .unwrap();
    let seed_only = with_namespace(
        &format!("redis+cluster://127.0.0.1:{}", cluster.nodes[0].port),
        &ns,
    );
    let refused = RedisBackend::connect(&seed_only).await;
    assert!(
        matches!(&refused, Err(Error::Config(m)) if m.contains("allkeys-random") && m.contains(&last.to_string())),
        "{refused:?}"
    );
}

// ---------------------------------------------------------------- change notifications

/// The txn scripts publish the written keys of an applied txn and nothing
/// for a rejected one: a subscriber's first message is the applied txn's
/// (messages of one server arrive in the order their scripts ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_txns_publish_nothing() {
    use futures_util::StreamExt;
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let namespace = unique_namespace("publish");
    let store = connect(&base, &namespace).await;
    let client = redis::Client::open(base.as_str()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe(format!("coord:{{{namespace}}}:changes"))
        .await
        .unwrap();
    let mut messages = pubsub.into_on_message();
    let (asserts, writes) = (
        [Assert::at("a", Version(3))],
        [Mutation::put("rejected", b"x".to_vec())],
    );
    assert!(!applied(store.txn(&asserts, &writes)).await);
    // A put over the one key it asserts runs a script of its own.
    assert!(!applied(store.put_if("b/1", Version(9), b"y".to_vec())).await);
    let writes = [Mutation::put("b/1", b"x".to_vec()), Mutation::delete("c")];
    assert!(applied(store.txn(&[], &writes)).await);
    async fn next(
        messages: &mut (impl futures_util::Stream<Item = redis::Msg> + Unpin),
    ) -> redis::Msg {
        tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("no message within 10 s")
            .expect("the subscription ended")
    }
    assert_eq!(next(&mut messages).await.get_payload_bytes(), b"b/1\0c");
    let version = store.get("b/1").await.unwrap().version;
    assert!(applied(store.put_if("b/1", version, b"z".to_vec())).await);
    assert_eq!(next(&mut messages).await.get_payload_bytes(), b"b/1");
}

/// A reclaim deletes the tombstone records themselves (and their set
/// entries), in bounded passes, and leaves the floor above them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_deletes_tombstone_records() {
    let Some(base) = coord_conformance::server_env(STANDALONE) else {
        return;
    };
    let ns = unique_namespace("reclaim");
    let store = connect(&base, &ns).await;
    for i in 0..20 {
        let key = format!("t/{i}");
        assert!(applied(store.put_if(&key, Version::MISSING, vec![])).await);
        assert!(applied(store.delete_if(&key, Version(1))).await);
    }
    let mut conn = raw_connection(&base).await;
    let records = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut cmd = redis::cmd("EXISTS");
        for i in 0..20 {
            cmd.arg(format!("coord:{{{ns}}}:k:t/{i}"));
        }
        let mut conn = conn.clone();
        async move { cmd.query_async::<i64>(&mut conn).await.unwrap() }
    };
    assert_eq!(records(&mut conn).await, 20);
    let options = coord_backend::ReclaimOptions::DEFAULT.with_max_tombstones(15);
    let first = store.reclaim(&options).await.unwrap();
    assert_eq!((first.removed, first.more), (15, true));
    let second = store.reclaim(&options).await.unwrap();
    assert_eq!((second.removed, second.more), (5, false));
    assert_eq!(records(&mut conn).await, 0);
    let dead: i64 = redis::cmd("ZCARD")
        .arg(format!("coord:{{{ns}}}:dead"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(dead, 1, "only the placeholder member is left");
    assert!(applied(store.put_if("t/3", Version::MISSING, b"x".to_vec())).await);
    assert_eq!(store.get("t/3").await.unwrap().version, Version(3));
}

/// A reclaim refuses while a client announcing an older storage format was
/// seen recently (an announcement written as such a client's reads): the
/// tombstone it keeps is what stops that client, whose script ignores the
/// floor, from creating the key again at a version it had. Records from
/// before announcements make a reclaim wait for the operator's word; a
/// client older than what a namespace requires refuses to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_refuses_beside_an_older_client() {
    use coord_backend::reclaim::{now_ms, ReclaimOptions, ANNOUNCEMENT_TTL, STORAGE_FORMAT};
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    let ns = unique_namespace("formats");
    let store = connect(&base, &ns).await;
    let mut raw = raw_connection(&base).await;
    let clients = format!("coord:{{{ns}}}:clients");
    let record = format!("coord:{{{ns}}}:k:k");
    assert!(applied(store.put_if("k", Version::MISSING, b"1".to_vec())).await);
    assert!(applied(store.delete_if("k", Version(1))).await);
    let older = STORAGE_FORMAT - 1;
    let _: () = redis::cmd("HSET")
        .arg(&clients)
        .arg("older")
        .arg(format!("{older}:{}", now_ms() - 60_000))
        .query_async(&mut raw)
        .await
        .unwrap();
    let refused = store.reclaim(&ReclaimOptions::DEFAULT).await;
    let stopped = store
        .reclaim(&ReclaimOptions::DEFAULT.with_older_clients_stopped(true))
        .await;
    // The older client's create, as scripts before the floor wrote it.
    let _: () = redis::pipe()
        .cmd("HINCRBY")
        .arg(&record)
        .arg("v")
        .arg(1)
        .ignore()
        .cmd("HSET")
        .arg(&record)
        .arg("d")
        .arg("o")
        .ignore()
        .query_async(&mut raw)
        .await
        .unwrap();
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
    // Aged out: the reclaim goes on.
    let _: () = redis::cmd("HSET")
        .arg(&clients)
        .arg("older")
        .arg(format!(
            "{older}:{}",
            now_ms() - ANNOUNCEMENT_TTL.as_millis() as u64 - 1000
        ))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(applied(store.put_if("gone", Version::MISSING, b"g".to_vec())).await);
    assert!(applied(store.delete_if("gone", Version(1))).await);
    let done = store.reclaim(&ReclaimOptions::DEFAULT).await.unwrap();
    assert_eq!((done.removed, done.more), (1, false));
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg(&clients)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(left.contains(&String::new()), "{left:?}");

    // Records from before announcements (written here as an older client
    // would): refused until the operator's word, which raises the format.
    let old = unique_namespace("legacy");
    let _: () = redis::cmd("HSET")
        .arg(format!("coord:{{{old}}}:k:x"))
        .arg("v")
        .arg(1)
        .arg("d")
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(format!("coord:{{{old}}}:idx"))
        .arg(0)
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    let legacy = connect(&base, &old).await;
    assert!(applied(legacy.delete_if("x", Version(1))).await);
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
    let _: () = redis::cmd("HSET")
        .arg(&clients)
        .arg("")
        .arg(STORAGE_FORMAT + 1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let newer = connect(&base, &ns).await;
    let refused = newer.put_if("n", Version::MISSING, b"n".to_vec()).await;
    assert!(
        matches!(&refused, Err(Error::FormatMismatch { theirs, .. }) if *theirs == STORAGE_FORMAT + 1),
        "{refused:?}"
    );
    assert!(!newer.get("n").await.unwrap().exists());
}

#[path = "support/sentinel.rs"]
mod support;

/// The Sentinel topology of `scripts/ha` (`COORD_HA_REDIS_SENTINEL_URL`,
/// `redis+sentinel://h:p,h:p/MASTER`): every suite through the Sentinels, a
/// failover followed, the errors of a wrong URL; and `?replicas=N` (`WAIT`)
/// there, on standalone Redis (no replica) and on Redis Cluster.
mod sentinel {
    use std::fs::File;

    use async_trait::async_trait;
    use coord_backend::{Changes, Entry, Limits, ReclaimOptions, Reclaimed, Result, TxnOutcome};

    use super::*;
    use support::{cmd, failover, sentinels_of, topology, with_params};

    pub(super) const SENTINEL: &str = "COORD_HA_REDIS_SENTINEL_URL";
    const HA_CLUSTER: &str = "COORD_HA_REDIS_CLUSTER_URL";

    /// A store that holds the topology lock (shared) while it lives.
    #[derive(Debug)]
    struct Held {
        inner: RedisBackend,
        _lock: Arc<File>,
    }

    #[async_trait]
    impl Backend for Held {
        fn namespace(&self) -> &str {
            self.inner.namespace()
        }
        fn limits(&self) -> Limits {
            self.inner.limits()
        }
        fn changes(&self) -> Option<&dyn Changes> {
            self.inner.changes()
        }
        async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
            self.inner.reclaim(options).await
        }
        async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
            self.inner.raw_snapshot(keys).await
        }
        async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
            self.inner.raw_txn(asserts, mutations).await
        }
        async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
            self.inner.raw_keys(prefix).await
        }
    }

    fn held_factory() -> Option<BackendFactory> {
        let base = server_env(SENTINEL)?;
        Some(factory(move |namespace| {
            let url = with_namespace(&base, &namespace);
            async move {
                let lock = Arc::new(topology(false).await);
                let inner = RedisBackend::connect(&url).await?;
                Ok(Arc::new(Held { inner, _lock: lock }) as Arc<dyn Backend>)
            }
        }))
    }

    coord_conformance::all_suites_tests!(held_factory());

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semantics() {
        let _shared = topology(false).await;
        super::semantics_on(SENTINEL).await;
    }

    /// A write acknowledged with `replicas=1` survives a failover, and the
    /// store follows the primary the Sentinels name (writes, reads and
    /// change notifications) within a bounded number of attempts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failover_is_followed() {
        let Some(base) = server_env(SENTINEL) else {
            return;
        };
        let _alone = topology(true).await;
        let ns = unique_namespace("failover");
        let url = with_namespace(&with_params(&base, "replicas=1"), &ns);
        let store = RedisBackend::connect(&url).await.unwrap();
        assert!(format!("{store:?}").contains("sentinel"));
        assert!(applied(store.put_if("before", Version::MISSING, b"kept".to_vec())).await);

        let (old, new) = failover(&base).await;

        let mut attempts = 0;
        loop {
            attempts += 1;
            match store
                .txn(&[], &[Mutation::put("after", b"x".to_vec())])
                .await
            {
                Ok(out) => {
                    assert!(out.applied);
                    break;
                }
                Err(e) => {
                    assert!(
                        matches!(e, Error::Unavailable { .. } | Error::Indeterminate { .. }),
                        "{e}"
                    );
                    assert!(attempts < 50, "not following the failover: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        // On the new primary, never on the old one (a replica now).
        let record = format!("coord:{{{ns}}}:k:after");
        let mut hget = redis::cmd("HGET");
        hget.arg(&record).arg("d");
        let on_new: Option<String> = cmd(&new, &hget).await.unwrap();
        assert_eq!(on_new.as_deref(), Some("x"), "written on {new}, not {old}");
        let kept = store.get("before").await.unwrap();
        assert_eq!(kept.value.as_deref(), Some(&b"kept"[..]));

        // Change notifications come from the new primary.
        let mut watch = None;
        for _ in 0..50 {
            if let Ok(w) = store.changes().unwrap().watch("w/").await {
                watch = Some(w);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut watch = watch.expect("a watch after the failover");
        let writer = RedisBackend::connect(&url).await.unwrap();
        assert!(applied(writer.put_if("w/1", Version::MISSING, b"1".to_vec())).await);
        tokio::time::timeout(Duration::from_secs(30), watch.changed())
            .await
            .expect("a change notification after the failover")
            .unwrap();
    }

    /// A master name no Sentinel knows, Sentinels that do not answer, and
    /// URLs that cannot be used: `Unavailable` naming what was asked (never
    /// the password), or `Config`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wrong_urls() {
        let options = RedisOptions::default().with_connect_timeout(Duration::from_secs(1));
        let open = |url: String| {
            let options = options.clone();
            async move {
                RedisBackend::connect_with(&StoreUrl::parse(&url).unwrap(), options)
                    .await
                    .unwrap_err()
            }
        };
        let nobody = open("redis+sentinel://u:hunter2@127.0.0.1:1,127.0.0.1:2/coord".into()).await;
        let shown = nobody.to_string();
        assert!(matches!(nobody, Error::Unavailable { .. }), "{shown}");
        assert!(
            shown.contains("127.0.0.1:1") && shown.contains("127.0.0.1:2"),
            "{shown}"
        );
        assert!(
            shown.contains("coord") && !shown.contains("hunter2"),
            "{shown}"
        );
        for bad in [
            "redis+sentinel://127.0.0.1:26380",
            "redis+sentinel://127.0.0.1:26380/",
            "redis+sentinel:///coord",
            "redis+sentinel://127.0.0.1:26380/coord?bogus=1",
            "redis+sentinel://127.0.0.1:26380/coord?replicas=two",
            "redis+sentinel://127.0.0.1:26380/coord?replica_timeout_ms=10",
            "redis+sentinel://127.0.0.1:26380/coord?replicas=1&replica_timeout_ms=0",
            "redis://127.0.0.1:6379?replicas=-1",
        ] {
            let error = open(bad.into()).await;
            assert!(matches!(error, Error::Config(_)), "{bad}: {error}");
        }
        let Some(base) = server_env(SENTINEL) else {
            return;
        };
        let (sentinels, _) = sentinels_of(&base);
        let url = format!("redis+sentinel://{}/no-such-master", sentinels.join(","));
        let unknown = open(url).await;
        let shown = unknown.to_string();
        assert!(matches!(unknown, Error::Unavailable { .. }), "{shown}");
        assert!(shown.contains("no-such-master"), "{shown}");
        assert!(shown.contains(&sentinels[0]), "{shown}");
    }

    /// `replicas=N` with fewer replicas than N: every applied write is
    /// `Indeterminate`, and stays written (WAIT rolls nothing back); a
    /// rejected txn is a rejection marked `unconfirmed`, since the state
    /// that rejected it is held by too few replicas.
    async fn short_of_replicas(base: &str, replicas: u32) {
        let ns = unique_namespace("wait");
        let url = with_namespace(
            &with_params(base, &format!("replicas={replicas}&replica_timeout_ms=50")),
            &ns,
        );
        let store = RedisBackend::connect(&url).await.unwrap();
        let plain = connect(base, &ns).await;
        let indeterminate = |r: Result<TxnOutcome>| match r {
            Err(Error::Indeterminate { message, .. }) => {
                assert!(message.contains("replicas"), "{message}");
            }
            other => panic!("expected Indeterminate, got {other:?}"),
        };
        indeterminate(store.put_if("a", Version::MISSING, b"1".to_vec()).await);
        assert_eq!(
            plain.get("a").await.unwrap().value.as_deref(),
            Some(&b"1"[..])
        );
        // The one-key put over a live version (its own script).
        indeterminate(store.put_if("a", Version(1), b"2".to_vec()).await);
        assert_eq!(
            plain.get("a").await.unwrap().value.as_deref(),
            Some(&b"2"[..])
        );
        indeterminate(
            store
                .txn(
                    &[Assert::at("a", Version(2))],
                    &[Mutation::delete("a"), Mutation::put("b", b"3".to_vec())],
                )
                .await,
        );
        let after = plain.snapshot(&["a".into(), "b".into()]).await.unwrap();
        assert!(!after[0].exists());
        assert_eq!(after[1].value.as_deref(), Some(&b"3"[..]));
        // The CAS engine settles a lost answer by sending the same txn again:
        // rejected, with the first one's puts in the store, reads as "my first
        // send applied". No replica holds those puts, so the rejection says
        // so (it once did not: the engine answered success).
        let once = || store.put_if("c", Version::MISSING, b"mine".to_vec());
        indeterminate(once().await);
        let unconfirmed = |r: Result<TxnOutcome>| {
            let outcome = r.unwrap();
            assert!(!outcome.applied);
            let why = outcome.unconfirmed.expect("marked unconfirmed");
            assert!(why.contains("replicas"), "{why}");
            outcome.current
        };
        assert_eq!(
            unconfirmed(once().await)[0].value.as_deref(),
            Some(&b"mine"[..])
        );
        let fresh = RedisBackend::connect(&url).await.unwrap();
        unconfirmed(fresh.put_if("c", Version::MISSING, b"mine".to_vec()).await);
        unconfirmed(fresh.put_if("b", Version(99), b"no".to_vec()).await);
        // What the caller sees through the engine: not success.
        let engine = coord_adapters::CasEngine::new(Arc::new(store.clone()));
        let answer = engine
            .decide::<_, Error, _>(&["d".into()], |_view| {
                Ok(coord_adapters::Decision::commit(
                    vec![Mutation::put("d", b"once".to_vec())],
                    (),
                ))
            })
            .await;
        assert!(
            matches!(&answer, Err(Error::Indeterminate { .. })),
            "{answer:?}"
        );
    }

    /// With enough replicas, a rejection behind the barrier is a plain
    /// rejection, with the current entries.
    async fn rejection_acknowledged(base: &str, replicas: u32) {
        let ns = unique_namespace("wait");
        let url = with_namespace(&with_params(base, &format!("replicas={replicas}")), &ns);
        let store = RedisBackend::connect(&url).await.unwrap();
        assert!(applied(store.put_if("k", Version::MISSING, b"v".to_vec())).await);
        for again in [
            store.put_if("k", Version::MISSING, b"v".to_vec()).await,
            store.put_if("k", Version(99), b"w".to_vec()).await,
            store
                .txn(
                    &[Assert::at("k", Version(99))],
                    &[Mutation::put("x", vec![])],
                )
                .await,
        ] {
            let outcome = again.unwrap();
            assert!(!outcome.applied);
            assert_eq!(outcome.current[0].value.as_deref(), Some(&b"v"[..]));
            assert_eq!(outcome.unconfirmed, None);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_wait_on_standalone_without_replicas() {
        if let Some(base) = server_env(STANDALONE) {
            short_of_replicas(&base, 2).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_wait_on_cluster() {
        // Each primary of the scripts/services.sh cluster has no replica,
        // each of the scripts/ha one has one.
        if let Some(base) = server_env(CLUSTER) {
            short_of_replicas(&base, 1).await;
        }
        let Some(base) = server_env(HA_CLUSTER) else {
            return;
        };
        short_of_replicas(&base, 2).await;
        let ns = unique_namespace("wait");
        let store = RedisBackend::connect(&with_namespace(&with_params(&base, "replicas=1"), &ns))
            .await
            .unwrap();
        for i in 0..20 {
            // Namespaces on different slots: WAIT goes with each to its master.
            let other = RedisBackend::connect(&with_namespace(
                &with_params(&base, "replicas=1"),
                &format!("{ns}-{i}"),
            ))
            .await
            .unwrap();
            assert!(applied(other.put_if("k", Version::MISSING, b"v".to_vec())).await);
        }
        assert!(applied(store.put_if("k", Version::MISSING, b"v".to_vec())).await);
        rejection_acknowledged(&base, 1).await;
    }

    /// The replicas of the settled Sentinel primary, stopped (SIGSTOP) until
    /// dropped (SIGCONT): they take no replication stream meanwhile.
    struct FrozenReplicas(Vec<u32>);

    impl FrozenReplicas {
        async fn stop(url: &str) -> FrozenReplicas {
            let (sentinels, master) = sentinels_of(url);
            let primary = support::settled(&sentinels, &master).await;
            let mut info = redis::cmd("INFO");
            info.arg("replication");
            let info: String = cmd(&primary, &info).await.unwrap();
            let mut pids = Vec::new();
            for line in info.lines().filter(|l| l.starts_with("slave")) {
                let field = |name: &str| {
                    line.split([':', ','])
                        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                        .map(str::to_owned)
                        .unwrap()
                };
                let replica = format!("{}:{}", field("ip"), field("port"));
                let mut server = redis::cmd("INFO");
                server.arg("server");
                let server: String = cmd(&replica, &server).await.unwrap();
                let pid = server
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse().ok())
                    .expect("INFO server names the process");
                pids.push(pid);
            }
            assert_eq!(pids.len(), 2, "the topology has two replicas");
            let frozen = FrozenReplicas(pids);
            frozen.signal("-STOP");
            frozen
        }

        fn signal(&self, signal: &str) {
            for pid in &self.0 {
                let status = std::process::Command::new("kill")
                    .arg(signal)
                    .arg(pid.to_string())
                    .status()
                    .unwrap();
                assert!(status.success(), "kill {signal} {pid}");
            }
        }
    }

    impl Drop for FrozenReplicas {
        fn drop(&mut self) {
            self.signal("-CONT");
        }
    }

    /// A rejection resting on another client's write that no replica holds
    /// is marked `unconfirmed` with `replicas=N`, even on a connection whose own
    /// last write every replica acknowledged: the barrier written behind the
    /// script moves the mark `WAIT` counts to. (Without it, Redis 7.2 and
    /// later count replicas at the connection's older write, which they all
    /// have; Redis 7.0, Debian 12's, moves the mark after every command, so
    /// there this passes with or without the barrier.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rejection_over_an_unreplicated_write_is_unconfirmed() {
        let Some(base) = server_env(SENTINEL) else {
            return;
        };
        // Alone: the replicas are stopped for a moment.
        let _alone = topology(true).await;
        let ns = unique_namespace("barrier");
        let acked = with_params(&base, "replicas=2&replica_timeout_ms=300");
        let store = RedisBackend::connect(&with_namespace(&acked, &ns))
            .await
            .unwrap();
        let plain = connect(&base, &ns).await;
        assert!(applied(store.put_if("mine", Version::MISSING, b"1".to_vec())).await);
        let frozen = FrozenReplicas::stop(&base).await;
        assert!(applied(plain.put_if("k", Version::MISSING, b"theirs".to_vec())).await);
        let answer = store.put_if("k", Version::MISSING, b"mine".to_vec()).await;
        drop(frozen);
        let outcome = answer.unwrap();
        assert!(!outcome.applied);
        assert_eq!(outcome.current[0].value.as_deref(), Some(&b"theirs"[..]));
        let why = outcome.unconfirmed.expect("marked unconfirmed");
        assert!(why.contains("rejected"), "{why}");
        // Replicas back: the same rejection, acknowledged, is a plain one.
        let mut last = None;
        for _ in 0..50 {
            let outcome = store
                .put_if("k", Version::MISSING, b"mine".to_vec())
                .await
                .unwrap();
            assert!(!outcome.applied);
            if outcome.unconfirmed.is_none() {
                assert_eq!(outcome.current[0].value.as_deref(), Some(&b"theirs"[..]));
                return;
            }
            last = outcome.unconfirmed;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the replicas did not come back: {last:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_one_on_the_sentinel_primary() {
        let Some(base) = server_env(SENTINEL) else {
            return;
        };
        let _shared = topology(false).await;
        let ns = unique_namespace("wait");
        let store = RedisBackend::connect(&with_namespace(&with_params(&base, "replicas=1"), &ns))
            .await
            .unwrap();
        assert!(applied(store.put_if("k", Version::MISSING, b"v".to_vec())).await);
        assert!(applied(store.put_if("k", Version(1), b"w".to_vec())).await);
        assert!(
            applied(store.txn(&[], &[Mutation::put("a", vec![]), Mutation::delete("k")])).await
        );
        rejection_acknowledged(&base, 2).await;
        // Three replicas where there are two: Indeterminate, still written.
        short_of_replicas(&base, 3).await;
    }
}

/// Every key of `namespace` as JSON (`{"name", "type", "content"}`), sorted.
async fn dump_namespace(base: &str, namespace: &str) -> serde_json::Value {
    use redis::AsyncCommands;
    let mut conn = raw_connection(base).await;
    let prefix = format!("coord:{{{namespace}}}:");
    let mut names: Vec<String> = conn.keys(format!("{prefix}*")).await.unwrap();
    names.sort();
    let mut keys = Vec::new();
    for name in names {
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        let content = match kind.as_str() {
            "hash" => {
                let map: std::collections::BTreeMap<String, String> =
                    conn.hgetall(&name).await.unwrap();
                serde_json::json!(map)
            }
            "zset" => {
                let members: Vec<(String, f64)> =
                    conn.zrange_withscores(&name, 0, -1).await.unwrap();
                serde_json::json!(members)
            }
            "set" => {
                let mut members: Vec<String> = conn.smembers(&name).await.unwrap();
                members.sort();
                serde_json::json!(members)
            }
            "string" => {
                let value: String = conn.get(&name).await.unwrap();
                serde_json::json!(value)
            }
            other => panic!("{name}: a {other} in a coord namespace"),
        };
        keys.push(serde_json::json!({
            "name": &name[prefix.len()..],
            "type": kind,
            "content": content,
        }));
    }
    serde_json::json!(keys)
}

/// Write the dumped keys under `namespace`'s prefix.
async fn restore_namespace(base: &str, namespace: &str, keys: &serde_json::Value) {
    use redis::AsyncCommands;
    let mut conn = raw_connection(base).await;
    let prefix = format!("coord:{{{namespace}}}:");
    for key in keys.as_array().unwrap() {
        let name = format!("{prefix}{}", key["name"].as_str().unwrap());
        let content = &key["content"];
        match key["type"].as_str().unwrap() {
            "hash" => {
                let fields: Vec<(String, String)> = content
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(f, v)| (f.clone(), v.as_str().unwrap().to_owned()))
                    .collect();
                let _: () = conn.hset_multiple(&name, &fields).await.unwrap();
            }
            "zset" => {
                for member in content.as_array().unwrap() {
                    let _: () = conn
                        .zadd(
                            &name,
                            member[0].as_str().unwrap(),
                            member[1].as_f64().unwrap(),
                        )
                        .await
                        .unwrap();
                }
            }
            "set" => {
                for member in content.as_array().unwrap() {
                    let _: () = conn.sadd(&name, member.as_str().unwrap()).await.unwrap();
                }
            }
            "string" => {
                let _: () = conn.set(&name, content.as_str().unwrap()).await.unwrap();
            }
            other => panic!("{name}: unknown type {other}"),
        }
    }
}

/// A namespace written by the release that introduced storage format 3,
/// restored key by key from its dump (`tests/golden/format-3.json`), reads
/// the same keys, versions and values with this release, and versions
/// continue above them and above the floor (`coord_conformance::golden`).
/// `COORD_WRITE_GOLDEN=1` writes the dump of the current format (for a NEW
/// format only: the old ones stay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_format_3_is_read_by_this_release() {
    const FORMAT: u32 = 3;
    let Some(base) = server_env(STANDALONE) else {
        return;
    };
    if std::env::var_os("COORD_WRITE_GOLDEN").is_some() {
        let namespace = unique_namespace("golden");
        let store = connect(&base, &namespace).await;
        if let Err(failure) = coord_conformance::golden::write_namespace(&store).await {
            panic!("{}", failure.message);
        }
        let dump = dump_namespace(&base, &namespace).await;
        coord_conformance::golden::save_dump(env!("CARGO_MANIFEST_DIR"), dump);
        return;
    }
    let dump = coord_conformance::golden::load_dump(env!("CARGO_MANIFEST_DIR"), FORMAT);
    let namespace = unique_namespace("golden_read");
    restore_namespace(&base, &namespace, &dump).await;
    let store = connect(&base, &namespace).await;
    if let Err(failure) = coord_conformance::golden::read_back(&store).await {
        panic!("{}", failure.message);
    }
}
