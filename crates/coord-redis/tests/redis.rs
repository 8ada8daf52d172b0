//! coord-redis against real servers: the conformance suite on standalone Redis
//! (`COORD_TEST_REDIS_URL`) and on Redis Cluster (`COORD_TEST_REDIS_CLUSTER_URL`,
//! see scripts/redis-cluster.sh), plus what only a real Redis shows: a race
//! between processes, a connection cut after a txn was sent, a server that is
//! down, records this crate did not write.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Assert, Backend, BackendExt, Error, Mutation, StoreUrl, Version};
use coord_conformance::fault::FaultProxy;
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
    assert!(store.delete_if("k", Version(1)).await.unwrap().applied);
    let gone = store.get("k").await.unwrap();
    assert_eq!((gone.version, gone.value), (Version::MISSING, None));
    let stale = store.put_if("k", Version(1), b"x".to_vec()).await.unwrap();
    assert!(!stale.applied, "a stale assert passed after delete");
    assert!(
        store
            .put_if("k", Version::MISSING, b"2".to_vec())
            .await
            .unwrap()
            .applied
    );
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
    assert!(
        store
            .put_if("never", Version::MISSING, b"n".to_vec())
            .await
            .unwrap()
            .applied
    );
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
        assert!(
            store
                .put_if(key, Version::MISSING, b"x".to_vec())
                .await
                .unwrap()
                .applied
        );
    }
    assert!(store.delete_if("pa", Version(1)).await.unwrap().applied);
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

mod standalone {
    use super::{factory_for, STANDALONE};
    coord_conformance::all_suites_tests!(factory_for(STANDALONE));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semantics() {
        let Some(base) = coord_conformance::server_env(super::STANDALONE) else {
            return;
        };
        super::semantics(&base).await;
    }
}

mod cluster {
    use super::{factory_for, CLUSTER};
    coord_conformance::all_suites_tests!(factory_for(CLUSTER));

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semantics() {
        let Some(base) = coord_conformance::server_env(super::CLUSTER) else {
            return;
        };
        super::semantics(&base).await;
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
        assert!(store.txn(&[], &mutations).await.unwrap().applied);
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
    // Also makes sure the server has the script cached, so the cut hits the real EVALSHA.
    assert!(
        store
            .put_if("k", Version::MISSING, b"1".to_vec())
            .await
            .unwrap()
            .applied
    );

    proxy.cut_next_reply(b"EVALSHA");
    let result = store.put_if("k", Version(1), b"2".to_vec()).await;
    assert_eq!(proxy.cuts(), 1);
    assert!(
        matches!(result, Err(Error::Indeterminate { .. })),
        "expected Indeterminate, got {result:?}"
    );

    let fresh = connect(&base, &ns).await.get("k").await.unwrap();
    assert_eq!(fresh.version, Version(2), "the cut txn did not commit");
    assert_eq!(fresh.value.as_deref(), Some(&b"2"[..]));

    // The old client reconnects by itself.
    let again = store.get("k").await.unwrap();
    assert_eq!(again.version, Version(2));
    assert!(
        store
            .put_if("k", Version(2), b"3".to_vec())
            .await
            .unwrap()
            .applied
    );
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
    let store = RedisBackend::connect_with(&with_namespace(&url, &ns), impatient())
        .await
        .unwrap();
    assert!(
        store
            .put_if("k", Version::MISSING, b"1".to_vec())
            .await
            .unwrap()
            .applied
    );
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
    let client = redis::Client::open(base.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
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
    let raw_client = redis::Client::open(base.as_str()).unwrap();
    let mut raw = raw_client.get_multiplexed_async_connection().await.unwrap();
    for protocol in ["resp2", "resp3"] {
        let ns = unique_namespace(&format!("kill_{protocol}"));
        let store = connect(&format!("{base}/7?protocol={protocol}"), &ns).await;
        assert!(
            store
                .put_if("k", Version::MISSING, b"1".to_vec())
                .await
                .unwrap()
                .applied
        );
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
        assert!(
            store
                .put_if("k", now.version, b"3".to_vec())
                .await
                .unwrap()
                .applied
        );
    }
}
