//! coord-etcd against a real etcd (`COORD_TEST_ETCD_ENDPOINTS`, e.g.
//! `127.0.0.1:2379`; start one with `scripts/start-etcd.sh`): the conformance
//! suites (all of them, through `all_suites_tests!`), the version mapping, limits, a cross-process race, a cut
//! connection (indeterminate txn), a commit that lands after the client's connection was cut (also under
//! `GenericLock`) and a server that is down.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_backend::{Assert, Backend, BackendExt, Entry, Error, Mutation, StoreUrl, Version};
use coord_conformance::fault::FaultProxy;
use coord_conformance::support::applied;
use coord_conformance::{factory, server_env, unique_namespace, BackendFactory};
use coord_etcd::{EtcdBackend, EtcdOptions};

const ENV: &str = "COORD_TEST_ETCD_ENDPOINTS";
/// Set in the children of `cross_process_cas_race`: `<endpoints>|<namespace>`.
const CHILD_ENV: &str = "COORD_ETCD_RACE_CHILD";
const CHILDREN: usize = 4;
const INCREMENTS: u64 = 50;

fn endpoints(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect()
}

/// A client that leaves new namespaces in tombstone mode (as every
/// namespace written before coord-etcd started new ones in floor mode).
async fn connect(raw: &str, namespace: &str) -> coord_backend::Result<EtcdBackend> {
    let options = EtcdOptions::default().with_new_namespaces_in_floor_mode(false);
    EtcdBackend::connect_endpoints(&endpoints(raw), namespace, options).await
}

/// A client with the default options: a new namespace starts in floor mode.
async fn connect_default(raw: &str, namespace: &str) -> coord_backend::Result<EtcdBackend> {
    EtcdBackend::connect_endpoints(&endpoints(raw), namespace, EtcdOptions::default()).await
}

fn etcd_factory() -> Option<BackendFactory> {
    let raw = server_env(ENV)?;
    Some(factory(move |namespace| {
        let raw = raw.clone();
        async move { Ok(Arc::new(connect(&raw, &namespace).await?) as Arc<dyn Backend>) }
    }))
}

// Every contract suite, one module each (their case names overlap), in
// tombstone mode: the backend suite counts versions from 1 and +1 per
// write, deletes included, which holds until a namespace's first reclaim.
coord_conformance::all_suites_tests!(etcd_factory());

/// The suites again in floor mode, the default for a new namespace: deletes
/// are real etcd deletes and a key can have several lifetimes. Every suite
/// but the backend suite (see above); the reclaim suite's rule is the one
/// floor mode keeps.
mod floor_mode {
    use super::*;

    fn floor_factory() -> Option<BackendFactory> {
        let raw = server_env(ENV)?;
        Some(factory(move |namespace| {
            let raw = raw.clone();
            async move { Ok(Arc::new(connect_default(&raw, &namespace).await?) as Arc<dyn Backend>) }
        }))
    }

    mod lock {
        use super::*;
        coord_conformance::lock_tests!(floor_factory());
    }
    mod board {
        use super::*;
        coord_conformance::board_tests!(floor_factory());
    }
    mod sideeffect {
        use super::*;
        coord_conformance::sideeffect_tests!(floor_factory());
    }
    mod scheduler {
        use super::*;
        coord_conformance::scheduler_tests!(floor_factory());
    }
    mod rwlock {
        use super::*;
        coord_conformance::rwlock_tests!(floor_factory());
    }
    mod election {
        use super::*;
        coord_conformance::election_tests!(floor_factory());
    }
    mod fair_lock {
        use super::*;
        coord_conformance::fair_lock_tests!(floor_factory());
    }
    mod semaphore {
        use super::*;
        coord_conformance::semaphore_tests!(floor_factory());
    }
    mod fault_model {
        use super::*;
        coord_conformance::fault_model_tests!(floor_factory());
    }
    mod changes {
        use super::*;
        coord_conformance::changes_tests!(floor_factory());
    }
    mod reclaim {
        use super::*;
        coord_conformance::reclaim_tests!(floor_factory());
    }
    mod retention {
        use super::*;
        coord_conformance::retention_tests!(floor_factory());
    }
}

/// Every suite on the 3-member cluster of `scripts/ha`
/// (`COORD_HA_ETCD_ENDPOINTS`), the client given all three endpoints, in
/// tombstone mode as above (floor mode is covered on one member).
mod three_members {
    use super::*;

    fn cluster_factory() -> Option<BackendFactory> {
        let raw = server_env("COORD_HA_ETCD_ENDPOINTS")?;
        Some(factory(move |namespace| {
            let raw = raw.clone();
            async move { Ok(Arc::new(connect(&raw, &namespace).await?) as Arc<dyn Backend>) }
        }))
    }

    coord_conformance::all_suites_tests!(cluster_factory());
}

/// A raw etcd client, to look under coord's layout.
async fn raw_client(raw: &str) -> etcd_client::Client {
    etcd_client::Client::connect(endpoints(raw), None)
        .await
        .expect("raw etcd client")
}

async fn raw_version(client: &mut etcd_client::Client, key: &[u8]) -> i64 {
    let response = client.get(key, None).await.expect("raw get");
    response.kvs().first().map(|kv| kv.version()).unwrap_or(0)
}

fn etcd_key(store: &EtcdBackend, key: &str) -> Vec<u8> {
    let mut k = store.etcd_prefix().to_vec();
    k.extend_from_slice(key.as_bytes());
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_survive_delete_and_recreate() {
    let Some(raw) = server_env(ENV) else { return };
    let ns = unique_namespace("versions");
    let store = connect(&raw, &ns).await.unwrap();
    let mut client = raw_client(&raw).await;

    assert!(applied(store.put_if("k", Version(0), b"one".to_vec())).await);
    assert!(applied(store.delete_if("k", Version(1))).await);
    assert_eq!(store.get("k").await.unwrap(), Entry::missing("k"));
    assert!(
        store.keys("").await.unwrap().is_empty(),
        "a tombstone is listed"
    );
    // The tombstone is etcd version 2: asserting it as a live version must fail.
    let out = store.put_if("k", Version(2), b"x".to_vec()).await.unwrap();
    assert!(!out.applied, "an assert at the tombstone's version passed");
    assert_eq!(out.current, vec![Entry::missing("k")]);
    assert!(!applied(store.put_if("k", Version(1), b"x".to_vec())).await);

    // A second client has never seen the tombstone: "missing" must still hold
    // (compare guessed wrong, re-sent), and the re-create gets version 3.
    let other = connect(&raw, &ns).await.unwrap();
    assert!(applied(other.put_if("k", Version(0), b"two".to_vec())).await);
    assert_eq!(
        store.get("k").await.unwrap(),
        Entry::present("k", Version(3), b"two".to_vec())
    );
    assert_eq!(raw_version(&mut client, &etcd_key(&store, "k")).await, 3);
    // Deleting a key that never existed still bumps its hidden counter.
    assert!(applied(store.txn(&[], &[Mutation::delete("never")])).await);
    assert!(applied(store.put_if("never", Version(0), b"now".to_vec())).await);
    assert_eq!(store.get("never").await.unwrap().version, Version(2));
    // A stale "missing" assert on a live key is refused with its entry.
    let out = other
        .put_if("never", Version(0), b"again".to_vec())
        .await
        .unwrap();
    assert!(!out.applied);
    assert_eq!(out.current[0].version, Version(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_disjoint_and_prefixes_literal() {
    let Some(raw) = server_env(ENV) else { return };
    let base = unique_namespace("ns");
    let names = [
        base.clone(),
        format!("{base}b"),
        format!("{base}:b"),
        format!("{base}/b"),
        format!("{base}%2Fb"),
    ];
    let mut stores = Vec::new();
    for name in &names {
        let store = connect(&raw, name).await.unwrap();
        store
            .txn(&[], &[Mutation::put(format!("b/{name}"), name.clone())])
            .await
            .unwrap();
        stores.push(store);
    }
    for (store, name) in stores.iter().zip(&names) {
        assert_eq!(store.keys("").await.unwrap(), vec![format!("b/{name}")]);
    }
    let store = &stores[0];
    let keys = ["a%b", "a_b", "a*", "a?", "a[x]", "a{x}", "a\\b", "aé", "ab"];
    let puts: Vec<Mutation> = keys
        .iter()
        .map(|k| Mutation::put(*k, b"1".to_vec()))
        .collect();
    assert!(applied(store.txn(&[], &puts)).await);
    for prefix in ["a%", "a_", "a*", "a?", "a[", "a{", "a\\", "aé"] {
        let found = store.keys(prefix).await.unwrap();
        let expected: Vec<String> = keys
            .iter()
            .filter(|k| k.starts_with(prefix))
            .map(|k| k.to_string())
            .collect();
        assert_eq!(found, expected, "prefix {prefix:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_malformed() {
    let Some(raw) = server_env(ENV) else { return };
    let store = connect(&raw, &unique_namespace("malformed")).await.unwrap();
    let mut client = raw_client(&raw).await;
    client
        .put(etcd_key(&store, "bad"), b"not coord".to_vec(), None)
        .await
        .unwrap();
    let err = store.get("bad").await.unwrap_err();
    assert!(matches!(err, Error::MalformedRecord { .. }), "{err:?}");
    let err = store
        .put_if("bad", Version(7), b"x".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MalformedRecord { .. }), "{err:?}");
}

/// The largest txn `limits()` allows (max keys, longest keys, longest
/// namespace, max values, every key asserted live) is accepted by a server
/// with etcd's default `--max-request-bytes` and `--max-txn-ops`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn largest_txn_within_limits_fits_etcd_defaults() {
    let Some(raw) = server_env(ENV) else { return };
    let mut ns = unique_namespace("limits");
    while ns.len() < 128 {
        ns.push('/'); // escaped to 3 bytes each: the longest etcd prefix
    }
    let store = connect(&raw, &ns).await.unwrap();
    let limits = store.limits();
    let keys: Vec<String> = (0..limits.max_keys_per_call)
        .map(|i| format!("{i:04}{}", "k".repeat(limits.max_key_bytes - 4)))
        .collect();
    let value = vec![b'z'; limits.max_value_bytes];
    let puts: Vec<Mutation> = keys
        .iter()
        .map(|k| Mutation::put(k, value.clone()))
        .collect();
    let missing: Vec<Assert> = keys.iter().map(Assert::missing).collect();
    assert!(applied(store.txn(&missing, &puts)).await);
    let live: Vec<Assert> = keys.iter().map(|k| Assert::at(k, Version(1))).collect();
    assert!(applied(store.txn(&live, &puts)).await);
    // Rejected: the Else branch returns every entry with its max value.
    let out = store.txn(&live, &puts).await.unwrap();
    assert!(!out.applied);
    assert_eq!(out.current.len(), keys.len());
    assert!(out
        .current
        .iter()
        .all(|e| e.version == Version(2) && e.value.as_ref() == Some(&value)));
    let snapshot = store.snapshot(&keys).await.unwrap();
    assert_eq!(snapshot.len(), keys.len());
    // One byte more is refused before anything is sent.
    let too_big = vec![b'z'; limits.max_value_bytes + 1];
    let err = store
        .txn(&[], &[Mutation::put("big", too_big)])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert_eq!(store.keys("big").await.unwrap(), Vec::<String>::new());
}

/// Child role of `cross_process_cas_race` (does nothing unless started by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_race_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (raw, ns) = spec.split_once('|').expect("endpoints|namespace");
    let store = connect(raw, ns).await.unwrap();
    let mut seen = store.get("counter").await.unwrap();
    let mut done = 0;
    let mut attempts = 0;
    while done < INCREMENTS {
        attempts += 1;
        assert!(attempts < 100_000, "no progress");
        let n: u64 = match &seen.value {
            Some(v) => std::str::from_utf8(v).unwrap().parse().unwrap(),
            None => 0,
        };
        let out = store
            .put_if("counter", seen.version, (n + 1).to_string().into_bytes())
            .await
            .expect("a txn failed with a store error");
        if out.applied {
            done += 1;
            seen = Entry::present(
                "counter",
                Version(seen.version.0 + 1),
                (n + 1).to_string().into_bytes(),
            );
        } else {
            // Decide again from the entry the rejection returned (no extra read).
            seen = out.current.into_iter().next().expect("current entry");
        }
    }
    println!("child done after {attempts} txns");
}

/// 4 processes x 50 CAS increments of one key: the total and the version are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_cas_race() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let Some(raw) = server_env(ENV) else { return };
    let ns = unique_namespace("xproc");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args([
                    "--exact",
                    "cross_process_race_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, format!("{raw}|{ns}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("child done"),
            "child failed: {}\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let store = connect(&raw, &ns).await.unwrap();
    let total = CHILDREN as u64 * INCREMENTS;
    assert_eq!(
        store.get("counter").await.unwrap(),
        Entry::present("counter", Version(total), total.to_string().into_bytes())
    );
}

/// The connection is cut after the txn request reached etcd: the answer is
/// lost, so the txn must be Indeterminate (never `applied = false`); a fresh
/// client then shows whether it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_txn_answer_is_indeterminate() {
    let Some(raw) = server_env(ENV) else { return };
    let proxy = FaultProxy::start(upstream(&raw)).await.unwrap();
    let ns = unique_namespace("fault");
    let store = through(&proxy, &ns, Duration::from_secs(3)).await;
    let key = "fault-target-7f3a";
    assert!(applied(store.put_if(key, Version(0), b"before".to_vec())).await);
    let seen = store.get(key).await.unwrap();

    // The key's bytes are in the txn request (and in no other frame from now on).
    proxy.cut_next_reply(key.as_bytes());
    let result = store.put_if(key, seen.version, b"after".to_vec()).await;
    assert_eq!(proxy.cuts(), 1, "the proxy never saw the txn");
    match result {
        Err(Error::Indeterminate { message, .. }) => {
            println!("indeterminate as expected: {message}")
        }
        other => panic!("a lost answer must be Indeterminate, got {other:?}"),
    }

    // A re-read cannot tell: etcd may still apply the lost txn after it (a
    // proposal outlives its connection). Settle it instead with a txn that
    // asserts the same version: exactly one of the two can apply, and once
    // this one has, the lost one never will.
    let fresh = connect(&raw, &ns).await.unwrap();
    let settled = fresh
        .put_if(key, seen.version, b"settled".to_vec())
        .await
        .unwrap();
    let after = fresh.get(key).await.unwrap();
    assert_eq!(
        after.version,
        Version(2),
        "exactly one of the two txns applies"
    );
    if settled.applied {
        assert_eq!(after.value.as_deref(), Some(&b"settled"[..]));
        println!("settled: the lost txn did not commit, and never will");
    } else {
        assert_eq!(after.value.as_deref(), Some(&b"after"[..]));
        println!("settled: the lost txn committed");
    }
    // The client recovers through the proxy once it reconnects.
    assert_eq!(store.get(key).await.unwrap(), after);
}

fn upstream(raw: &str) -> SocketAddr {
    endpoints(raw)[0]
        .trim_start_matches("http://")
        .parse()
        .expect("COORD_TEST_ETCD_ENDPOINTS starts with host:port")
}

/// A client of namespace `ns` through `proxy`, waiting at most `timeout` for
/// each request (in tombstone mode, like `connect`: the tests count versions).
async fn through(proxy: &FaultProxy, ns: &str, timeout: Duration) -> EtcdBackend {
    let options = EtcdOptions::default()
        .with_request_timeout(timeout)
        .with_new_namespaces_in_floor_mode(false);
    EtcdBackend::connect_endpoints(&[proxy.addr().to_string()], ns, options)
        .await
        .unwrap()
}

/// How long the proxy holds the late request back (and then gives etcd to run it).
const LATE: Duration = Duration::from_millis(600);

/// Poll `key` through `direct` until it is no longer `before`, within 30 s.
async fn await_change(direct: &EtcdBackend, key: &str, before: &Entry) -> Entry {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = direct.get(key).await.unwrap();
        if &now != before {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the delayed request never reached etcd"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// etcd with a commit that completes after the client's connection was cut:
/// the proxy holds the txn back, closes the client's connection, and hands
/// the txn to etcd later. The client must answer Indeterminate (not
/// Unavailable, not a rejection), a read made before the late delivery
/// still shows the old state, and afterwards the write IS in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commit_after_cut_connection_is_indeterminate() {
    let Some(raw) = server_env(ENV) else { return };
    let proxy = FaultProxy::start(upstream(&raw)).await.unwrap();
    let ns = unique_namespace("late");
    let store = through(&proxy, &ns, Duration::from_secs(5)).await;
    let direct = connect(&raw, &ns).await.unwrap();
    let key = "late-commit-target-5c1e";
    assert!(applied(store.put_if(key, Version(0), b"before".to_vec())).await);
    let seen = store.get(key).await.unwrap();

    // The key's bytes are in the txn request (and in no other frame from now on).
    proxy.delay_next_request(key.as_bytes(), LATE);
    let result = store.put_if(key, seen.version, b"after".to_vec()).await;
    assert_eq!(proxy.delays(), 1, "the proxy never saw the txn");
    match &result {
        Err(Error::Indeterminate { message, .. }) => println!("indeterminate: {message}"),
        other => panic!("a request that may still commit must be Indeterminate, got {other:?}"),
    }
    // Not applied yet: the client was told of a failure before etcd had it.
    let early = direct.get(key).await.unwrap();
    if proxy.forwarded_late() == 0 {
        assert_eq!(early, seen, "etcd had the write before the proxy sent it");
    } else {
        println!("too slow to read before the late delivery (loaded machine)");
    }
    let after = await_change(&direct, key, &seen).await;
    assert_eq!(
        after,
        Entry::present(key, Version(2), b"after".to_vec()),
        "the late txn did not commit as sent"
    );
    assert_eq!(proxy.forwarded_late(), 1);
    // The client recovers through the proxy once it reconnects.
    assert_eq!(store.get(key).await.unwrap(), after);
}

/// The same fault under `GenericLock::try_lock`: its grant txn is held back
/// and lands after the engine has re-read the (still free) record, and the
/// engine's retry reaches etcd only after it. Nobody else locks the key, so
/// the grant in the record is the caller's own: `try_lock` must answer that
/// truth (a handle with that token) or Indeterminate, never "held by someone
/// else".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_after_a_late_commit_is_the_callers_or_indeterminate() {
    use coord_adapters::lock::{GenericLock, Lock, LockError};

    let Some(raw) = server_env(ENV) else { return };
    let proxy = FaultProxy::start(upstream(&raw)).await.unwrap();
    let ns = unique_namespace("latelock");
    let proxied: Arc<dyn Backend> = Arc::new(through(&proxy, &ns, Duration::from_secs(5)).await);
    let direct = connect(&raw, &ns).await.unwrap();
    let mut failures = Vec::new();
    for round in 1..=3u64 {
        let lock = GenericLock::new(proxied.clone());
        let key = format!("late-lock-{round}");
        let record_key = format!("lock/{key}");
        // Only a grant's write carries a lock record; the engine's reads name
        // the key but no record, so they pass and see the record still free.
        proxy.delay_next_request(b"{\"fence\":", LATE);
        let answer = lock.try_lock(&key, Duration::from_secs(60)).await;
        assert_eq!(proxy.delays(), round, "the proxy never saw the grant");
        // Whichever grant txn lands first (the late one or a retry asserting
        // the same "missing"), the other is refused: the record, once
        // written, keeps that one grant.
        let record = await_change(&direct, &record_key, &Entry::missing(&*record_key)).await;
        let record: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().expect("a record")).unwrap();
        let holder = record["holder"]["token"]
            .as_str()
            .expect("the record holds a grant");
        assert_eq!(record["fence"], 1, "one grant only: {record}");
        match answer {
            Ok(Some(handle)) => assert_eq!(
                handle.token(),
                holder,
                "round {round}: try_lock returned a handle the record does not hold"
            ),
            Err(LockError::Store(e)) if e.is_indeterminate() => {
                println!("round {round}: indeterminate ({e})")
            }
            Ok(None) => failures.push(format!(
                "round {round}: try_lock answered \"held by someone else\" while the only grant \
                 in the record (fence 1) is the caller's own"
            )),
            Err(other) => panic!("round {round}: unexpected error {other:?}"),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Nothing listens: every call is Unavailable (a txn too: it was never
/// sent), within the configured timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_is_unavailable() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let url = StoreUrl::parse(&format!(
        "etcd://{closed}?namespace=down&connect_timeout_ms=500&request_timeout_ms=1500"
    ))
    .unwrap();
    let store = EtcdBackend::connect(&url).await.unwrap();
    let started = Instant::now();
    let err = store.get("k").await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. }),
        "snapshot: {err:?}"
    );
    let err = store
        .put_if("k", Version(0), b"v".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "txn: {err:?}");
    let err = store.keys("").await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "keys: {err:?}");
    println!(
        "three calls against a closed port failed in {:?}",
        started.elapsed()
    );
}

/// Credentials against a server without authentication: a configuration
/// error at connect time, not a silent success and not "unavailable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_refused_is_config() {
    let Some(raw) = server_env(ENV) else { return };
    let url = StoreUrl::parse(&format!("etcd://nobody:secret@{raw}?namespace=auth")).unwrap();
    let err = EtcdBackend::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(!format!("{err:?}").contains("secret"));
}

async fn etcd_keys_under(client: &mut etcd_client::Client, prefix: &[u8]) -> i64 {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    client
        .get(prefix, Some(options))
        .await
        .expect("raw count")
        .count()
}

/// The first reclaim creates the namespace's floor marker and deletes the
/// tombstones written before it for real; from then on a delete is a real
/// etcd delete (nothing is left behind), a key created at revision `c`
/// starts at version `c`, and a client that never saw the marker (a second
/// backend, mid-txn) learns it from the txn's own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_switches_to_real_deletes() {
    let Some(raw) = server_env(ENV) else { return };
    let ns = unique_namespace("floor");
    let store = connect(&raw, &ns).await.unwrap();
    let other = connect(&raw, &ns).await.unwrap();
    let mut client = raw_client(&raw).await;
    for i in 0..20 {
        let key = format!("t/{i:02}");
        assert!(applied(store.put_if(&key, Version(0), b"1".to_vec())).await);
        assert!(applied(store.delete_if(&key, Version(1))).await);
    }
    assert!(applied(store.put_if("live", Version(0), b"l".to_vec())).await);
    // `other` reads before the marker exists: it caches nothing.
    assert_eq!(other.get("live").await.unwrap().version, Version(1));
    let prefix = store.etcd_prefix().to_vec();
    assert_eq!(etcd_keys_under(&mut client, &prefix).await, 21);

    let options = coord_backend::ReclaimOptions::DEFAULT.with_max_tombstones(15);
    let first = store.reclaim(&options).await.unwrap();
    assert_eq!((first.removed, first.more), (15, true));
    let second = store.reclaim(&options).await.unwrap();
    assert_eq!((second.removed, second.more), (5, false));
    assert_eq!(etcd_keys_under(&mut client, &prefix).await, 1);
    let marker = format!("coord-meta/{ns}/floor");
    let got = client.get(marker.as_bytes(), None).await.unwrap();
    assert_eq!(
        got.kvs()[0].value(),
        b"c",
        "the marker says no tombstone is left"
    );

    // A live key from before the marker keeps its version; `other` still
    // believes there is no marker, so its txn is refused by the marker
    // compare and sent again under the floor.
    assert!(applied(other.put_if("live", Version(1), b"m".to_vec())).await);
    assert_eq!(store.get("live").await.unwrap().version, Version(2));
    // A re-created key starts at its create revision, above anything it had.
    assert!(applied(other.put_if("t/03", Version(0), b"again".to_vec())).await);
    let raw_kv = client.get(etcd_key(&store, "t/03"), None).await.unwrap();
    let create = raw_kv.kvs()[0].create_revision();
    assert_eq!(
        store.get("t/03").await.unwrap().version,
        Version(create as u64)
    );
    assert!(create > 2);
    assert!(applied(store.put_if("t/03", Version(create as u64), b"3".to_vec())).await);
    assert_eq!(
        other.get("t/03").await.unwrap().version,
        Version(create as u64 + 1)
    );
    // Deletes are real now: 100 create/delete cycles leave no etcd key.
    for i in 0..100 {
        let key = format!("c/{i}");
        assert!(applied(store.put_if(&key, Version(0), b"x".to_vec())).await);
        let version = store.get(&key).await.unwrap().version;
        assert!(applied(store.delete_if(&key, version)).await);
    }
    assert_eq!(
        etcd_keys_under(&mut client, &prefix).await,
        2,
        "live and t/03"
    );
    assert_eq!(store.keys("").await.unwrap(), vec!["live", "t/03"]);
    assert_eq!(store.reclaim(&options).await.unwrap().removed, 0);
}

/// After the marker a deleted key's next lifetime starts again at etcd
/// version 1: an assert from the previous lifetime must still fail (ABA),
/// although the etcd version it compares is the same. Before the marker the
/// same holds through the tombstone's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_assert_fails_on_the_next_lifetime() {
    let Some(raw) = server_env(ENV) else { return };
    for floor in [false, true] {
        let ns = unique_namespace("aba");
        let (stale, other) = (
            connect(&raw, &ns).await.unwrap(),
            connect(&raw, &ns).await.unwrap(),
        );
        if floor {
            stale
                .reclaim(&coord_backend::ReclaimOptions::DEFAULT)
                .await
                .unwrap();
        }
        assert!(applied(stale.put_if("k", Version(0), b"first".to_vec())).await);
        let first = stale.get("k").await.unwrap().version;
        let seen = other.get("k").await.unwrap();
        assert_eq!(seen.version, first);
        assert!(applied(other.delete_if("k", first)).await);
        assert!(applied(other.put_if("k", Version(0), b"second".to_vec())).await);
        let second = other.get("k").await.unwrap().version;
        assert!(second > first, "floor {floor}: {second:?} after {first:?}");

        // `stale` last saw `k` at `first`, in its first lifetime.
        let out = stale
            .txn(
                &[Assert::at("k", first)],
                &[Mutation::put("k", b"lost".to_vec())],
            )
            .await
            .unwrap();
        assert!(
            !out.applied,
            "floor {floor}: an assert at {first:?} passed on {second:?}"
        );
        assert_eq!(out.current[0].version, second, "floor {floor}");
        assert_eq!(
            other.get("k").await.unwrap().value.as_deref(),
            Some(&b"second"[..])
        );
    }
}

/// A namespace nobody has written starts in floor mode (with default
/// options): create+delete cycles leave no etcd key behind and a reclaim
/// has nothing to do, without any `gc`. Two clients starting one namespace
/// at once agree on it. A namespace holding keys written before (a
/// tombstone, written here with the raw client as an older coord-etcd
/// would) keeps tombstone mode until its first reclaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_namespaces_start_in_floor_mode() {
    let Some(raw) = server_env(ENV) else { return };
    let mut client = raw_client(&raw).await;

    let ns = unique_namespace("fresh");
    let (a, b) = (
        connect_default(&raw, &ns).await.unwrap(),
        connect_default(&raw, &ns).await.unwrap(),
    );
    // Both start the namespace at once.
    let (x, y) = tokio::join!(
        a.put_if("a", Version(0), b"a".to_vec()),
        b.put_if("b", Version(0), b"b".to_vec())
    );
    assert!(x.unwrap().applied && y.unwrap().applied);
    assert_eq!(a.get("b").await.unwrap(), b.get("b").await.unwrap());
    assert_eq!(a.get("a").await.unwrap(), b.get("a").await.unwrap());
    for i in 0..30 {
        let key = format!("c/{i}");
        assert!(applied(a.put_if(&key, Version(0), b"x".to_vec())).await);
        let version = b.get(&key).await.unwrap().version;
        assert!(applied(b.delete_if(&key, version)).await);
    }
    let prefix = a.etcd_prefix().to_vec();
    assert_eq!(
        etcd_keys_under(&mut client, &prefix).await,
        2,
        "30 create+delete cycles in a new namespace left tombstones"
    );
    let reclaimed = a
        .reclaim(&coord_backend::ReclaimOptions::DEFAULT)
        .await
        .unwrap();
    assert_eq!((reclaimed.removed, reclaimed.more), (0, false));

    // Written before: one tombstone, no marker.
    let old = unique_namespace("legacy");
    let store = connect_default(&raw, &old).await.unwrap();
    client
        .put(etcd_key(&store, "gone"), b"x".to_vec(), None)
        .await
        .unwrap();
    assert!(applied(store.put_if("k", Version(0), b"1".to_vec())).await);
    assert_eq!(store.get("k").await.unwrap().version, Version(1));
    assert!(applied(store.delete_if("k", Version(1))).await);
    let prefix = store.etcd_prefix().to_vec();
    assert_eq!(
        etcd_keys_under(&mut client, &prefix).await,
        2,
        "an existing namespace keeps tombstone mode"
    );
    let marker = format!("coord-meta/{old}/floor");
    assert!(client
        .get(marker.as_bytes(), None)
        .await
        .unwrap()
        .kvs()
        .is_empty());
    // A second client of the old namespace agrees (it finds keys, so it
    // does not start it either).
    let other = connect_default(&raw, &old).await.unwrap();
    assert!(applied(other.put_if("k", Version(0), b"2".to_vec())).await);
    assert_eq!(store.get("k").await.unwrap().version, Version(3));
    // Keys from before announcements: its first reclaim needs the
    // operator's word that older clients are stopped.
    let refused = store.reclaim(&coord_backend::ReclaimOptions::DEFAULT).await;
    assert!(
        matches!(refused, Err(Error::FormatMismatch { theirs: 0, .. })),
        "{refused:?}"
    );
    let reclaimed = store
        .reclaim(&coord_backend::ReclaimOptions::DEFAULT.with_older_clients_stopped(true))
        .await
        .unwrap();
    assert_eq!((reclaimed.removed, reclaimed.more), (1, false));
    assert_eq!(etcd_keys_under(&mut client, &prefix).await, 1);
}

/// A reclaim refuses while a client announcing an older storage format was
/// seen recently (an announcement written as such a client's reads): the
/// tombstone it keeps is what stops that client, which compares etcd's own
/// version, from creating the key again at an etcd version it had. Once
/// the announcement is older than the TTL the reclaim goes on. A client
/// older than what a namespace requires refuses to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_refuses_beside_an_older_client() {
    use coord_backend::reclaim::{now_ms, ReclaimOptions, ANNOUNCEMENT_TTL, STORAGE_FORMAT};
    let Some(raw) = server_env(ENV) else { return };
    let mut client = raw_client(&raw).await;
    let ns = unique_namespace("formats");
    let store = connect(&raw, &ns).await.unwrap();
    assert!(applied(store.put_if("k", Version(0), b"1".to_vec())).await);
    assert!(applied(store.delete_if("k", Version(1))).await);
    let older = STORAGE_FORMAT - 1;
    let announcement = format!("coord-meta/{ns}/clients/older");
    client
        .put(
            announcement.as_bytes(),
            format!("{older}:{}", now_ms() - 60_000),
            None,
        )
        .await
        .unwrap();
    let refused = store.reclaim(&ReclaimOptions::DEFAULT).await;
    let stopped = store
        .reclaim(&ReclaimOptions::DEFAULT.with_older_clients_stopped(true))
        .await;
    // The older client's create, as clients before the floor wrote it.
    client
        .put(etcd_key(&store, "k"), b"vo".to_vec(), None)
        .await
        .unwrap();
    let seen = raw_version(&mut client, &etcd_key(&store, "k")).await;
    assert!(
        seen > 2,
        "k had versions 1 and 2; the older client (etcd's version) sees its create at {seen}: \
         handed out twice"
    );
    assert!(
        matches!(&refused, Err(Error::FormatMismatch { theirs, .. }) if *theirs == older),
        "{refused:?}"
    );
    assert!(
        matches!(stopped, Err(Error::FormatMismatch { .. })),
        "{stopped:?}"
    );
    assert!(applied(store.delete_if("k", Version(seen as u64))).await);
    client
        .put(
            announcement.as_bytes(),
            format!(
                "{older}:{}",
                now_ms() - ANNOUNCEMENT_TTL.as_millis() as u64 - 1000
            ),
            None,
        )
        .await
        .unwrap();
    let done = store.reclaim(&ReclaimOptions::DEFAULT).await.unwrap();
    assert_eq!((done.removed, done.more), (1, false));

    // A namespace a newer coord requires: a new client refuses to write.
    client
        .put(
            format!("coord-meta/{ns}/required"),
            (STORAGE_FORMAT + 1).to_string(),
            None,
        )
        .await
        .unwrap();
    let newer = connect_default(&raw, &ns).await.unwrap();
    let refused = newer.put_if("n", Version(0), b"n".to_vec()).await;
    assert!(
        matches!(&refused, Err(Error::FormatMismatch { theirs, .. }) if *theirs == STORAGE_FORMAT + 1),
        "{refused:?}"
    );
    assert!(!newer.get("n").await.unwrap().exists());
}

/// The D12 probe (`cargo test -p coord-etcd --test etcd -- --ignored
/// churn_probe --nocapture`; `COORD_PROBE_CYCLES`, default 20,000): N
/// create+delete cycles under a prefix, then the time to list 10 live keys,
/// in a namespace in tombstone mode (as before: until a `gc`), in a new
/// namespace (floor mode, the default) and in a fresh namespace holding
/// only the 10 keys; then the tombstone namespace again after a reclaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, minutes long"]
async fn churn_probe() {
    let Some(raw) = server_env(ENV) else { return };
    let cycles: usize = std::env::var("COORD_PROBE_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    async fn list_time(store: &EtcdBackend) -> Duration {
        let mut best = Duration::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            let listed = store.keys("p/").await.unwrap();
            best = best.min(start.elapsed());
            assert_eq!(listed.len(), 10);
        }
        best
    }
    async fn fill(store: &EtcdBackend, cycles: usize) {
        for i in 0..10 {
            assert!(applied(store.put_if(&format!("p/live/{i}"), Version(0), b"l".to_vec())).await);
        }
        let store = Arc::new(store.clone());
        let mut tasks = Vec::new();
        for worker in 0..16 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in (worker..cycles).step_by(16) {
                    let key = format!("p/churn/{i}");
                    assert!(applied(store.put_if(&key, Version(0), b"x".to_vec())).await);
                    let version = store.get(&key).await.unwrap().version;
                    assert!(applied(store.delete_if(&key, version)).await);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }
    let tomb = connect(&raw, &unique_namespace("probe-tomb"))
        .await
        .unwrap();
    let floor = connect_default(&raw, &unique_namespace("probe-floor"))
        .await
        .unwrap();
    let fresh = connect_default(&raw, &unique_namespace("probe-fresh"))
        .await
        .unwrap();
    fill(&tomb, cycles).await;
    fill(&floor, cycles).await;
    fill(&fresh, 0).await;
    let base = list_time(&fresh).await;
    let t = list_time(&tomb).await;
    let f = list_time(&floor).await;
    let start = Instant::now();
    let mut removed = 0;
    loop {
        let done = tomb
            .reclaim(&coord_backend::ReclaimOptions::DEFAULT)
            .await
            .unwrap();
        removed += done.removed;
        if !done.more {
            break;
        }
    }
    let reclaim = start.elapsed();
    let after = list_time(&tomb).await;
    let ratio = |d: Duration| d.as_secs_f64() / base.as_secs_f64();
    println!("churn probe: {cycles} create+delete cycles, then list 10 live keys (best of 5)");
    println!("| namespace | list 10 live keys | vs fresh |");
    println!("| --- | --- | --- |");
    println!("| fresh (10 keys only) | {base:.2?} | 1.0x |");
    println!("| tombstone mode (before) | {t:.2?} | {:.1}x |", ratio(t));
    println!(
        "| new namespace, floor mode (after) | {f:.2?} | {:.1}x |",
        ratio(f)
    );
    println!(
        "| tombstone mode after reclaim ({removed} removed in {reclaim:.2?}) | {after:.2?} | {:.1}x |",
        ratio(after)
    );
}
