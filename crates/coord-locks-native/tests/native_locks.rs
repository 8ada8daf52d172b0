//! The lock suite against the native locks on real servers, plus the checks
//! only a native lock needs (key layout, connection loss), and a deliberately
//! broken Redis lock that the suite must reject.
//!
//! Servers come from `COORD_TEST_REDIS_URL` and `COORD_TEST_POSTGRES_URL`;
//! unset → every test of that store prints SKIPPED and passes (unless
//! `COORD_REQUIRE_SERVERS=1`).

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::{Lock, LockError, LockHandle, LostReason};
use coord_conformance::lock::{lock_factory, LockEnv, TimeControl};
use coord_conformance::server_env;
use metrics_util::debugging::DebuggingRecorder;

fn random_key(label: &str) -> String {
    format!("{label}-{}", &coord_adapters::mint_token()[..16])
}

/// `lock` takes the free `key` for 30 s.
async fn hold(lock: &dyn Lock, key: &str) -> LockHandle {
    lock.try_lock(key, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the key is free")
}

/// Checks the counters `recorder` saw against `expected` (name with labels, value).
fn assert_counters(recorder: &DebuggingRecorder, expected: &[(&str, u64)]) {
    let counts = coord_conformance::support::counters(recorder);
    for (name, value) in expected {
        assert_eq!(counts.get(*name), Some(value), "{name}: {counts:?}");
    }
}

/// A test needing the server binary `what` passes when it is not installed,
/// but fails under `COORD_REQUIRE_SERVERS=1`.
fn skip_not_installed(what: &str) {
    assert_ne!(
        std::env::var("COORD_REQUIRE_SERVERS").as_deref(),
        Ok("1"),
        "{what} is not installed but COORD_REQUIRE_SERVERS=1"
    );
    eprintln!("SKIPPED: {what} is not installed");
}

mod redis_lock {
    use super::*;
    use coord_adapters::lock::async_trait;
    use coord_locks_native::{RedisLock, RedisLockOptions};
    use redis::AsyncCommands;

    /// Short enough to keep the expiry checks fast, long enough for several
    /// round trips on a loaded 2-core CI machine.
    const TTL: Duration = Duration::from_millis(1_500);

    fn env() -> Option<LockEnv> {
        server_env("COORD_TEST_REDIS_URL").map(|url| {
            LockEnv::new(
                lock_factory(move || {
                    let url = url.clone();
                    async move {
                        Ok(Arc::new(RedisLock::connect(&store_url(&url)).await?) as Arc<dyn Lock>)
                    }
                }),
                TimeControl::Real { ttl: TTL },
            )
        })
    }

    coord_conformance::native_lock_tests!(env());

    async fn connect(url: &str) -> RedisLock {
        RedisLock::connect(&store_url(url)).await.unwrap()
    }

    async fn raw(url: &str) -> redis::aio::ConnectionManager {
        let url = coord_backend::StoreUrl::parse(url).unwrap();
        redis::Client::open(url.without_namespace())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap()
    }

    /// The bug class the token check prevents: a release that does not compare the token
    /// frees whatever lock is there, including a newer holder's.
    #[derive(Debug)]
    struct UncheckedRelease {
        inner: RedisLock,
        conn: redis::aio::ConnectionManager,
    }

    #[async_trait]
    impl Lock for UncheckedRelease {
        async fn try_lock(
            &self,
            key: &str,
            ttl: Duration,
        ) -> Result<Option<LockHandle>, LockError> {
            self.inner.try_lock(key, ttl).await
        }
        async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
            self.inner.renew(handle).await
        }
        async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
            let _: i64 = self
                .conn
                .clone()
                .del(self.inner.lock_key(handle.key()))
                .await
                .unwrap();
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn suite_rejects_a_release_that_does_not_compare_the_token() {
        let Some(url) = server_env("COORD_TEST_REDIS_URL") else {
            return;
        };
        let env = LockEnv::new(
            lock_factory(move || {
                let url = url.clone();
                async move {
                    Ok(Arc::new(UncheckedRelease {
                        inner: RedisLock::connect(&store_url(&url)).await?,
                        conn: raw(&url).await,
                    }) as Arc<dyn Lock>)
                }
            }),
            TimeControl::Real { ttl: TTL },
        );
        let failure = coord_conformance::lock::stale_handle_refused(env.clone())
            .await
            .expect_err("stale_handle_refused passed on a lock whose release ignores the token");
        assert!(
            failure.message.contains("release with a released handle"),
            "{failure}"
        );
        let failure = coord_conformance::lock::release_then_relock(env)
            .await
            .expect_err("release_then_relock passed on a lock whose release ignores the token");
        assert!(failure.message.contains("second release"), "{failure}");
    }

    /// Redis keeps the expiry in milliseconds: a TTL of `Duration::MAX` is
    /// refused as input before anything is sent; waiting forever works.
    #[tokio::test]
    async fn a_ttl_of_duration_max_is_invalid_and_a_timeout_of_it_waits() {
        use coord_adapters::lock::LockExt;
        let Some(url) = server_env("COORD_TEST_REDIS_URL") else {
            return;
        };
        let lock = connect(&url).await;
        let key = random_key("forever");
        let refused = lock.try_lock(&key, Duration::MAX).await;
        assert!(matches!(refused, Err(LockError::Invalid(_))), "{refused:?}");
        let held = lock.lock(&key, TTL, Duration::MAX).await.unwrap();
        lock.release(held).await.unwrap();
    }

    #[tokio::test]
    async fn fence_counter_outlives_the_lock_and_never_expires() {
        let Some(url) = server_env("COORD_TEST_REDIS_URL") else {
            return;
        };
        let lock = connect(&url).await;
        let mut conn = raw(&url).await;
        let key = random_key("layout");
        let h = hold(&lock, &key).await;
        let token: String = conn.get(lock.lock_key(&key)).await.unwrap();
        assert_eq!(token, h.token());
        let pttl: i64 = conn.pttl(lock.lock_key(&key)).await.unwrap();
        assert!(pttl > 25_000 && pttl <= 30_000, "lock PTTL {pttl}");
        let fence = h.fence();
        lock.release(h).await.unwrap();
        let exists: bool = conn.exists(lock.lock_key(&key)).await.unwrap();
        assert!(!exists, "the lock key survived its release");
        let counter: u64 = conn.get(lock.fence_key(&key)).await.unwrap();
        assert_eq!(counter, fence);
        let fence_ttl: i64 = conn.pttl(lock.fence_key(&key)).await.unwrap();
        assert_eq!(fence_ttl, -1, "the fence counter must not expire");
        // Both keys must map to one cluster slot: they share the `{key}` hash tag.
        assert!(lock.fence_key(&key).starts_with(&lock.lock_key(&key)));
    }

    #[tokio::test]
    async fn a_renew_by_a_stale_holder_reports_the_takeover() {
        let Some(url) = server_env("COORD_TEST_REDIS_URL") else {
            return;
        };
        // This test's metrics only: a current-thread runtime on this thread.
        let recorder = DebuggingRecorder::new();
        let _local = metrics::set_default_local_recorder(&recorder);
        let (a, b) = (connect(&url).await, connect(&url).await);
        let key = random_key("takeover");
        let old = a
            .try_lock(&key, Duration::from_millis(50))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;
        let new = hold(&b, &key).await;
        match a.renew(&old).await {
            Err(LockError::Lost {
                reason: LostReason::TakenOver,
                ..
            }) => {}
            other => panic!("expected Lost(TakenOver), got {other:?}"),
        }
        b.release(new).await.unwrap();
        // Released by the newer holder: the stale one is still told it was taken over.
        assert!(matches!(
            a.release(old).await,
            Err(LockError::Lost {
                reason: LostReason::TakenOver,
                ..
            })
        ));
        assert_counters(
            &recorder,
            &[
                ("coord_lock_acquired_total", 2),
                ("coord_lock_lost_total{reason=taken_over}", 1),
            ],
        );
    }

    #[tokio::test]
    async fn bad_configuration_is_a_typed_error() {
        let err = RedisLock::connect_with(
            &store_url("redis://127.0.0.1:6379"),
            RedisLockOptions::default().with_key_prefix("app:{x}:"),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, coord_backend::Error::Config(_)), "{err:?}");
        let err = RedisLock::connect(&store_url("postgres://127.0.0.1/x"))
            .await
            .unwrap_err();
        assert!(matches!(err, coord_backend::Error::Config(_)), "{err:?}");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_an_error_not_a_refusal() {
        // Nothing listens on port 1 of the loopback.
        let err = RedisLock::connect_with(
            &store_url("redis://127.0.0.1:1"),
            RedisLockOptions::default().with_connect_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, coord_backend::Error::Unavailable { .. }),
            "{err:?}"
        );
    }

    /// A fence counter this lock could not have written (not an integer,
    /// beyond what `INCR` can reach) is MalformedRecord, and the acquire
    /// writes nothing: no lock key is left behind without a fence.
    #[tokio::test]
    async fn a_damaged_fence_is_malformed_and_takes_nothing() {
        let Some(url) = server_env("COORD_TEST_REDIS_URL") else {
            return;
        };
        let lock = connect(&url).await;
        let mut conn = raw(&url).await;
        for damaged in [
            "x",
            "18446744073709551615",
            "9223372036854775807",
            "-1",
            "007",
        ] {
            let key = random_key("damaged");
            let _: () = conn.set(lock.fence_key(&key), damaged).await.unwrap();
            let got = lock.try_lock(&key, Duration::from_secs(30)).await;
            assert!(
                matches!(
                    &got,
                    Err(LockError::Store(
                        coord_backend::Error::MalformedRecord { .. }
                    ))
                ),
                "fence {damaged:?}: {got:?}"
            );
            let exists: bool = conn.exists(lock.lock_key(&key)).await.unwrap();
            assert!(!exists, "fence {damaged:?}: the lock key was set anyway");
            let fence: String = conn.get(lock.fence_key(&key)).await.unwrap();
            assert_eq!(fence, damaged);
        }
    }

    /// A `redis-server` child on a free loopback port, killed on drop.
    struct PrivateRedis {
        port: u16,
        child: std::process::Child,
    }

    impl PrivateRedis {
        fn start(extra: &[&str]) -> Option<PrivateRedis> {
            use std::process::{Command, Stdio};
            if Command::new("redis-server")
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_err()
            {
                skip_not_installed("redis-server");
                return None;
            }
            for _ in 0..20 {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                let mut child = Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
                    .args(extra)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn redis-server");
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while std::time::Instant::now() < deadline {
                    if child.try_wait().unwrap().is_some() {
                        break; // port taken meanwhile: try another
                    }
                    let up = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                        .is_ok();
                    if up {
                        return Some(PrivateRedis { port, child });
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            panic!("could not start a private redis-server");
        }
    }

    impl Drop for PrivateRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Eviction can drop a fence counter and hand a fence out twice: a
    /// server whose `maxmemory-policy` is not `noeviction` is refused unless
    /// the caller opts out. Private servers: the shared one is never reconfigured.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_evicting_server_is_refused() {
        if server_env("COORD_TEST_REDIS_URL").is_none() {
            return;
        }
        let Some(evicting) = PrivateRedis::start(&["--maxmemory-policy", "allkeys-lru"]) else {
            return;
        };
        let url = format!("redis://127.0.0.1:{}", evicting.port);
        let err = RedisLock::connect(&store_url(&url)).await.unwrap_err();
        assert!(
            matches!(&err, coord_backend::Error::Config(m) if m.contains("allkeys-lru") && m.contains("noeviction")),
            "{err:?}"
        );
        let lock = RedisLock::connect_with(
            &store_url(&url),
            RedisLockOptions::default().with_allow_eviction(true),
        )
        .await
        .unwrap();
        let handle = lock
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        lock.release(handle).await.unwrap();

        let Some(fine) = PrivateRedis::start(&[]) else {
            return;
        };
        let lock = RedisLock::connect(&store_url(&format!("redis://127.0.0.1:{}", fine.port)))
            .await
            .unwrap();
        assert!(lock
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .is_some());
    }
}

mod pg_advisory {
    use super::*;
    use coord_locks_native::{PgAdvisoryLock, PgAdvisoryOptions};
    use sqlx::Connection;

    fn env() -> Option<LockEnv> {
        server_env("COORD_TEST_POSTGRES_URL").map(|url| {
            LockEnv::new(
                lock_factory(move || {
                    let url = url.clone();
                    async move {
                        Ok(Arc::new(PgAdvisoryLock::connect(&store_url(&url)).await?)
                            as Arc<dyn Lock>)
                    }
                }),
                TimeControl::NeverExpires,
            )
        })
    }

    coord_conformance::native_lock_tests!(env());

    async fn connect(url: &str) -> PgAdvisoryLock {
        PgAdvisoryLock::connect(&store_url(url)).await.unwrap()
    }

    async fn connect_with_max_idle(url: &str, max_idle: usize) -> PgAdvisoryLock {
        let options = PgAdvisoryOptions::default().with_max_idle(max_idle);
        PgAdvisoryLock::connect_with(&store_url(url), options)
            .await
            .unwrap()
    }

    /// Ends the backend `pid` as an operator would.
    async fn terminate(admin: &mut sqlx::PgConnection, pid: i32) {
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(admin)
            .await
            .unwrap();
        assert!(killed, "pg_terminate_backend({pid})");
    }

    async fn admin(url: &str) -> sqlx::PgConnection {
        let url = coord_backend::StoreUrl::parse(url).unwrap();
        sqlx::PgConnection::connect(url.without_namespace())
            .await
            .unwrap()
    }

    /// The backend pid of the session holding the advisory lock of `key`
    /// (on `hashtext` of its lock name).
    async fn holder_pid(
        admin: &mut sqlx::PgConnection,
        lock: &PgAdvisoryLock,
        key: &str,
    ) -> Option<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
             AND ((classid::bigint << 32) | objid::bigint) = hashtext($1)::bigint",
        )
        .bind(lock.lock_name(key))
        .fetch_optional(admin)
        .await
        .unwrap()
    }

    /// No TTL is enforced, so a TTL of `Duration::MAX` ("until released")
    /// is taken as given, and waiting forever works.
    #[tokio::test]
    async fn a_ttl_and_a_timeout_of_duration_max_work() {
        use coord_adapters::lock::LockExt;
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let (a, b) = (connect(&url).await, connect(&url).await);
        let key = random_key("forever");
        let held = a.try_lock(&key, Duration::MAX).await.unwrap().unwrap();
        assert!(b.try_lock(&key, Duration::MAX).await.unwrap().is_none());
        a.renew(&held).await.unwrap();
        a.release(held).await.unwrap();
        let held = b.lock(&key, Duration::MAX, Duration::MAX).await.unwrap();
        b.release(held).await.unwrap();
    }

    #[tokio::test]
    async fn a_killed_session_is_a_lost_lock_and_frees_the_key() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        // This test's metrics only: a current-thread runtime on this thread.
        let recorder = DebuggingRecorder::new();
        let _local = metrics::set_default_local_recorder(&recorder);
        let (a, b) = (connect(&url).await, connect(&url).await);
        let mut admin = admin(&url).await;
        let key = random_key("killed");
        let ttl = Duration::from_secs(30);
        let h = hold(&a, &key).await;
        assert_eq!(a.held_count(), 1);
        a.renew(&h).await.unwrap();
        let pid = holder_pid(&mut admin, &a, &key)
            .await
            .expect("the advisory lock is visible in pg_locks");
        terminate(&mut admin, pid).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let hb = loop {
            if let Some(hb) = b.try_lock(&key, ttl).await.unwrap() {
                break hb;
            }
            assert!(tokio::time::Instant::now() < deadline, "key not freed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(hb.fence() > h.fence());
        assert!(a.renew(&h).await.unwrap_err().is_lost());
        assert_eq!(a.held_count(), 0, "a lost lock's connection is dropped");
        assert!(a.release(h).await.unwrap_err().is_lost());
        b.release(hb).await.unwrap();
        assert_counters(
            &recorder,
            &[
                ("coord_lock_acquired_total", 2),
                ("coord_lock_lost_total{reason=not_held}", 1),
            ],
        );
    }

    /// Waits until the backend `pid` has exited.
    async fn wait_gone(admin: &mut sqlx::PgConnection, pid: i32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let alive: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(&mut *admin)
                    .await
                    .unwrap();
            if alive == 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session {pid} stayed open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many advisory locks the backend `pid` holds.
    async fn locks_of(admin: &mut sqlx::PgConnection, pid: i32) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1")
            .bind(pid)
            .fetch_one(admin)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn release_unlocks_and_the_next_lock_reuses_the_session() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let a = connect(&url).await;
        let mut admin = admin(&url).await;
        let key = random_key("reuses");
        let h = hold(&a, &key).await;
        assert_eq!((a.held_count(), a.idle_count()), (1, 0));
        let name = a.lock_name(&key);
        let pid = holder_pid(&mut admin, &a, &key).await.expect("held");
        let (fence, ceiling) = fence_rows(&mut admin, "coord_lock_fences", &name).await;
        assert_eq!(fence, Some(h.fence()), "the last grant is recorded");
        assert!(ceiling >= h.fence());
        a.release(h).await.unwrap();
        assert_eq!((a.held_count(), a.idle_count()), (0, 1));
        assert_eq!(holder_pid(&mut admin, &a, &key).await, None);
        assert_eq!(
            locks_of(&mut admin, pid).await,
            0,
            "an idle session holds nothing"
        );
        // The same key again, then another key: both on the parked session,
        // with the fence still increasing.
        let again = hold(&a, &key).await;
        assert!(again.fence() > h_fence(fence));
        assert_eq!(holder_pid(&mut admin, &a, &key).await, Some(pid));
        a.release(again).await.unwrap();
        let other = random_key("reuses-other");
        let h = hold(&a, &other).await;
        assert_eq!(holder_pid(&mut admin, &a, &other).await, Some(pid));
        a.release(h).await.unwrap();
        assert_eq!(locks_of(&mut admin, pid).await, 0);
        // Dropping the client closes its idle sessions.
        drop(a);
        wait_gone(&mut admin, pid).await;
    }

    #[tokio::test]
    async fn without_idle_sessions_release_closes_the_session() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let a = connect_with_max_idle(&url, 0).await;
        let mut admin = admin(&url).await;
        let key = random_key("closes");
        let h = hold(&a, &key).await;
        let pid = holder_pid(&mut admin, &a, &key).await.expect("held");
        a.release(h).await.unwrap();
        assert_eq!((a.held_count(), a.idle_count()), (0, 0));
        assert_eq!(holder_pid(&mut admin, &a, &key).await, None);
        wait_gone(&mut admin, pid).await;
    }

    #[tokio::test]
    async fn the_idle_pool_is_bounded() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let a = connect_with_max_idle(&url, 2).await;
        let mut handles = Vec::new();
        for i in 0..4 {
            handles.push(hold(&a, &random_key(&format!("bounded-{i}"))).await);
        }
        // Each held lock pins its own session.
        assert_eq!((a.held_count(), a.idle_count()), (4, 0));
        for h in handles {
            a.release(h).await.unwrap();
        }
        assert_eq!((a.held_count(), a.idle_count()), (0, 2));
    }

    /// An idle session the server ended (here `pg_terminate_backend`; also a
    /// restart or `idle_session_timeout`) is replaced by the next `try_lock`,
    /// which succeeds on a new session.
    #[tokio::test]
    async fn a_dead_idle_session_is_replaced() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let a = connect_with_max_idle(&url, 1).await;
        let mut admin = admin(&url).await;
        let ttl = Duration::from_secs(30);
        let key = random_key("dead-idle");
        let h = hold(&a, &key).await;
        let pid = holder_pid(&mut admin, &a, &key).await.expect("held");
        a.release(h).await.unwrap();
        assert_eq!(a.idle_count(), 1);
        terminate(&mut admin, pid).await;
        wait_gone(&mut admin, pid).await;
        let h = a
            .try_lock(&key, ttl)
            .await
            .unwrap()
            .expect("a new session takes the free key");
        let new_pid = holder_pid(&mut admin, &a, &key).await.expect("held");
        assert_ne!(new_pid, pid);
        a.release(h).await.unwrap();
        assert_eq!((a.held_count(), a.idle_count()), (0, 1));
    }

    #[tokio::test]
    async fn a_refused_try_lock_pins_no_session() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let (a, b) = (connect(&url).await, connect(&url).await);
        let key = random_key("refused");
        let ttl = Duration::from_secs(30);
        let h = hold(&a, &key).await;
        assert!(b.try_lock(&key, ttl).await.unwrap().is_none());
        // The refused session holds nothing: it is parked, not pinned.
        assert_eq!((b.held_count(), b.idle_count()), (0, 1));
        // b cannot release or renew a's handle: the session is a's.
        assert!(b.renew(&h).await.unwrap_err().is_lost());
        assert!(b.release(h.clone()).await.unwrap_err().is_lost());
        a.renew(&h).await.unwrap();
        a.release(h).await.unwrap();
    }

    /// Namespace `N` with key `b:lock:c` and namespace `N:lock:b` with key
    /// `c` are different locks: neither their advisory locks nor their
    /// fence rows may be shared.
    #[tokio::test]
    async fn namespaces_never_share_a_lock_name() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let in_namespace = |namespace: &str| {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}namespace={namespace}")
        };
        let short = random_key("ns").replace('-', "_");
        let long = format!("{short}:lock:b");
        let a = PgAdvisoryLock::connect(&store_url(&in_namespace(&short)))
            .await
            .unwrap();
        let b = PgAdvisoryLock::connect(&store_url(&in_namespace(&long)))
            .await
            .unwrap();
        let ttl = Duration::from_secs(30);
        let ha = hold(&a, "b:lock:c").await;
        let hb = b.try_lock("c", ttl).await.unwrap();
        let hb = hb.expect("namespace N:lock:b, key c was refused: it shares N's lock on b:lock:c");
        assert_ne!(a.lock_name("b:lock:c"), b.lock_name("c"));
        // Fresh names: each has a fence row of its own, starting at 1.
        assert_eq!((ha.fence(), hb.fence()), (1, 1));
        a.release(ha).await.unwrap();
        b.release(hb).await.unwrap();
    }

    /// The default name of a namespace without `:` is `<namespace>:lock:<key>`,
    /// as before namespaces were escaped: existing fence rows stay in use.
    #[tokio::test]
    async fn plain_namespaces_keep_their_lock_names() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let lock = PgAdvisoryLock::connect(&store_url(&format!("{url}{sep}namespace=billing.v2")))
            .await
            .unwrap();
        assert_eq!(lock.lock_name("k:1"), "billing.v2:lock:k:1");
    }

    #[tokio::test]
    async fn bad_configuration_is_a_typed_error() {
        let err = PgAdvisoryLock::connect_with(
            &store_url("postgres://postgres@127.0.0.1:5432/postgres"),
            PgAdvisoryOptions::default().with_fence_table("x; drop table y"),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, coord_backend::Error::Config(_)), "{err:?}");
        let err = PgAdvisoryLock::connect_with(
            &store_url("postgres://postgres@127.0.0.1:1/postgres"),
            PgAdvisoryOptions::default().with_connect_timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, coord_backend::Error::Unavailable { .. }),
            "{err:?}"
        );
    }

    fn h_fence(fence: Option<u64>) -> u64 {
        fence.expect("a last grant")
    }

    /// `(last fence granted, durable ceiling)` of `name` in `table` and its
    /// unlogged `<table>_last`.
    async fn fence_rows(
        admin: &mut sqlx::PgConnection,
        table: &str,
        name: &str,
    ) -> (Option<u64>, u64) {
        let last: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT fence FROM {table}_last WHERE name = $1"
        )))
        .bind(name)
        .fetch_optional(&mut *admin)
        .await
        .unwrap();
        let ceiling: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT fence FROM {table} WHERE name = $1"
        )))
        .bind(name)
        .fetch_one(&mut *admin)
        .await
        .unwrap();
        (last.map(|f| f as u64), ceiling as u64)
    }

    /// Runs `sql` with `$1` bound to the lock name of `key`, then takes and
    /// releases `key`: `(the fence granted, the durable ceiling after it)`,
    /// checking that the unlogged table recorded that fence.
    async fn grant_after(
        lock: &PgAdvisoryLock,
        admin: &mut sqlx::PgConnection,
        key: &str,
        sql: &'static str,
    ) -> (u64, u64) {
        let name = lock.lock_name(key);
        sqlx::query(sql)
            .bind(&name)
            .execute(&mut *admin)
            .await
            .unwrap();
        let fence = cycle(lock, key).await;
        let (last, ceiling) = fence_rows(admin, "coord_lock_fences", &name).await;
        assert_eq!(last, Some(fence), "the unlogged table records the grant");
        (fence, ceiling)
    }

    /// Takes and releases `key` on `lock`, returning the fence.
    async fn cycle(lock: &PgAdvisoryLock, key: &str) -> u64 {
        let h = lock
            .try_lock(key, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("uncontended");
        let fence = h.fence();
        lock.release(h).await.unwrap();
        fence
    }

    /// The fast fences: grants inside a block touch only the unlogged table;
    /// a used-up block, a missing unlogged row (what crash recovery leaves)
    /// and a fence row from before the unlogged table each start a new
    /// block above the durable ceiling, so fences never repeat.
    #[tokio::test]
    async fn fences_stay_below_a_durable_ceiling_and_jump_it_when_the_last_grant_is_gone() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let a = connect(&url).await;
        let mut admin = admin(&url).await;
        let key = random_key("ceiling");
        let name = a.lock_name(&key);
        let table = "coord_lock_fences";

        let first = cycle(&a, &key).await;
        assert_eq!(first, 1);
        let (_, ceiling) = fence_rows(&mut admin, table, &name).await;
        assert_eq!(ceiling, 1024, "a new name reserves one block");
        for expected in 2..=5 {
            assert_eq!(cycle(&a, &key).await, expected);
        }
        assert_eq!(fence_rows(&mut admin, table, &name).await, (Some(5), 1024));

        // The unlogged row gone (crash recovery empties the table): the next
        // grant starts the block above the ceiling.
        let gone = "DELETE FROM coord_lock_fences_last WHERE name = $1";
        assert_eq!(grant_after(&a, &mut admin, &key, gone).await, (1025, 2048));
        // A used-up block: the grant at the ceiling's edge reserves the next.
        let used_up = "UPDATE coord_lock_fences_last SET fence = 2048 WHERE name = $1";
        assert_eq!(
            grant_after(&a, &mut admin, &key, used_up).await,
            (2049, 3072)
        );

        // A fence row written by an earlier version (durable +1 per grant, no
        // unlogged row): its fence is the ceiling, the next grant is above it.
        let old = random_key("ceiling-old");
        assert_eq!(
            grant_after(
                &a,
                &mut admin,
                &old,
                "INSERT INTO coord_lock_fences (name, fence) VALUES ($1, 500)",
            )
            .await,
            (501, 1524)
        );
    }

    /// A fence table made by hand without its unlogged companion (and
    /// `create_table` off): every grant is a durable +1, as before.
    #[tokio::test]
    async fn without_the_unlogged_table_every_grant_is_durable() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let mut admin = admin(&url).await;
        let table = format!("fences_by_hand_{}", std::process::id());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY, fence bigint NOT NULL)"
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        let a = PgAdvisoryLock::connect_with(
            &store_url(&url),
            PgAdvisoryOptions::default()
                .with_fence_table(table.clone())
                .with_create_table(false),
        )
        .await
        .unwrap();
        let key = random_key("by-hand");
        for expected in 1..=3 {
            assert_eq!(cycle(&a, &key).await, expected);
        }
        let fence: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT fence FROM {table} WHERE name = $1"
        )))
        .bind(a.lock_name(&key))
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!(fence, 3);
        drop(a);
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&mut admin)
            .await
            .unwrap();
    }

    /// Holders racing on one key from several clients: every grant's fence
    /// is above the previous holder's, across block boundaries (the
    /// block is used up under the race to force them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_holders_get_increasing_fences_across_blocks() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let key = random_key("race-fences");
        let order = Arc::new(tokio::sync::Mutex::new(Vec::<u64>::new()));
        let mut tasks = Vec::new();
        for worker in 0..4 {
            let (url, key, order) = (url.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lock = connect(&url).await;
                let mut admin = admin(&url).await;
                let mut got = 0;
                while got < 25 {
                    let Some(h) = lock.try_lock(&key, Duration::from_secs(30)).await.unwrap()
                    else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    got += 1;
                    // Recorded while held: holders are serialized, so the
                    // list is in grant order.
                    order.lock().await.push(h.fence());
                    if got % 5 == worker % 5 {
                        // Use the block up, as grants do: the last fence
                        // reaches the ceiling, so the next grant must raise
                        // it. (Lowering the ceiling instead is no state the
                        // lock can reach: a racing statement whose snapshot
                        // predates the lowering may still bump below the
                        // old ceiling, and the next block then starts at a
                        // fence already granted.)
                        sqlx::query(
                            "UPDATE coord_lock_fences_last SET fence = \
                             (SELECT fence FROM coord_lock_fences WHERE name = $1) \
                             WHERE name = $1",
                        )
                        .bind(lock.lock_name(&key))
                        .execute(&mut admin)
                        .await
                        .unwrap();
                    }
                    lock.release(h).await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().await;
        assert_eq!(order.len(), 100);
        for pair in order.windows(2) {
            assert!(
                pair[0] < pair[1],
                "fence {} granted after {}",
                pair[1],
                pair[0]
            );
        }
    }

    /// A URL naming two hosts, the first `first`, the second the test
    /// server: libpq's multi-host form, which the lock reads like the store.
    fn two_hosts(url: &str, first: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (userinfo, hostpart) = match rest.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), rest),
        };
        let end = hostpart.find(['/', '?']).unwrap_or(hostpart.len());
        let tail = &hostpart[end..];
        let sep = if tail.contains('?') { '&' } else { '?' };
        format!(
            "{scheme}://{userinfo}{first},{}{tail}{sep}sslmode=disable",
            &hostpart[..end]
        )
    }

    /// The first host of a multi-host URL is down: sessions go to the next
    /// one; when it dies after the first grant, the next grant follows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_multi_host_url_skips_and_follows_a_dead_host() {
        let Some(url) = server_env("COORD_TEST_POSTGRES_URL") else {
            return;
        };
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let lock = connect(&two_hosts(&url, &closed.to_string())).await;
        let key = random_key("multi");
        let h = lock
            .try_lock(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        lock.release(h).await.unwrap();

        let parsed = coord_backend::StoreUrl::parse(&url).unwrap();
        let upstream = tokio::net::lookup_host(
            <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(
                parsed.without_namespace(),
            )
            .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
            .unwrap(),
        )
        .await
        .unwrap()
        .next()
        .unwrap();
        let proxy = coord_conformance::fault::FaultProxy::start(upstream)
            .await
            .unwrap();
        let lock = PgAdvisoryLock::connect_with(
            &store_url(&two_hosts(&url, &proxy.addr().to_string())),
            PgAdvisoryOptions::default().with_max_idle(0),
        )
        .await
        .unwrap();
        let first = lock
            .try_lock(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        let first_fence = first.fence();
        lock.release(first).await.unwrap();
        drop(proxy);
        let second = lock
            .try_lock(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert!(second.fence() > first_fence);
        lock.release(second).await.unwrap();
    }

    /// Through PgBouncer (`scripts/ha`): transaction pooling would hand the
    /// session holding a lock to another client, so it is refused at
    /// connect, naming the setting; session pooling locks as directly.
    #[tokio::test]
    async fn pgbouncer_transaction_pooling_is_refused_and_session_pooling_works() {
        if let Some(url) = server_env("COORD_HA_PGBOUNCER_TX_URL") {
            let result = PgAdvisoryLock::connect(&store_url(&url)).await;
            let Err(coord_backend::Error::Config(message)) = &result else {
                panic!("{result:?}");
            };
            assert!(message.contains("pool_mode = session"), "{message}");
        }
        if let Some(url) = server_env("COORD_HA_PGBOUNCER_SESSION_URL") {
            let lock = connect(&url).await;
            let key = random_key("bouncer");
            let h = lock
                .try_lock(&key, Duration::from_secs(30))
                .await
                .unwrap()
                .unwrap();
            assert!(lock
                .try_lock(&key, Duration::from_secs(30))
                .await
                .unwrap()
                .is_none());
            lock.release(h).await.unwrap();
        }
    }

    /// A private PostgreSQL server (initdb in a temporary directory, a free
    /// loopback port), stopped on drop. The shared server is never crashed.
    struct PrivatePostgres {
        bin: std::path::PathBuf,
        dir: std::path::PathBuf,
        port: u16,
    }

    impl PrivatePostgres {
        fn start() -> Option<PrivatePostgres> {
            let bin = std::fs::read_dir("/usr/lib/postgresql")
                .ok()
                .and_then(|versions| {
                    versions
                        .filter_map(|v| v.ok().map(|v| v.path().join("bin")))
                        .filter(|bin| bin.join("initdb").exists())
                        .max()
                });
            let Some(bin) = bin else {
                skip_not_installed("initdb (/usr/lib/postgresql/*/bin/initdb)");
                return None;
            };
            let dir = std::env::temp_dir().join(format!(
                "coord-pg-crash-{}-{}",
                std::process::id(),
                random_key("d")
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let server = PrivatePostgres { bin, dir, port };
            // PostgreSQL refuses to run as root: run it as `postgres` then.
            let _ = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&server.dir)
                .status();
            server.run(
                "initdb",
                &["-A", "trust", "-U", "postgres", "--no-sync", "-D"],
            );
            server.ctl_start();
            Some(server)
        }

        /// `tool args… <data dir>`, as `postgres` when this process is root.
        fn command(&self, tool: &str, args: &[&str]) -> std::process::Command {
            let program = self.bin.join(tool);
            let mut command = if is_root() {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&program);
                c
            } else {
                std::process::Command::new(&program)
            };
            command.args(args).arg(self.dir.join("data"));
            command
        }

        fn run(&self, tool: &str, args: &[&str]) {
            let output = self.command(tool, args).output().unwrap();
            assert!(
                output.status.success(),
                "{tool} {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }

        fn ctl_start(&self) {
            let options = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                self.port,
                self.dir.display()
            );
            let log = self.dir.join("log");
            self.run(
                "pg_ctl",
                &[
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    log.to_str().unwrap(),
                    "-o",
                    &options,
                    "start",
                    "-D",
                ],
            );
        }

        /// SIGQUIT to the server: no checkpoint, crash recovery at the next start.
        fn crash(&self) {
            self.run("pg_ctl", &["-m", "immediate", "-w", "stop", "-D"]);
        }

        fn url(&self) -> String {
            format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
        }
    }

    impl Drop for PrivatePostgres {
        fn drop(&mut self) {
            let _ = self
                .command("pg_ctl", &["-m", "immediate", "-w", "stop", "-D"])
                .output();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn is_root() -> bool {
        std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
    }

    /// A real crash of the server (immediate stop: no checkpoint, crash
    /// recovery at restart, which empties the unlogged table of last
    /// grants): the fences granted after it are above every fence before it.
    #[tokio::test]
    async fn fences_keep_increasing_across_a_server_crash() {
        if server_env("COORD_TEST_POSTGRES_URL").is_none() {
            return;
        }
        let Some(server) = PrivatePostgres::start() else {
            return;
        };
        let key = "crash-fences";
        let before = {
            let a = PgAdvisoryLock::connect(&store_url(&server.url()))
                .await
                .unwrap();
            let mut last = 0;
            for _ in 0..3 {
                last = cycle(&a, key).await;
            }
            last
        };
        assert_eq!(before, 3);
        server.crash();
        server.ctl_start();
        let a = PgAdvisoryLock::connect(&store_url(&server.url()))
            .await
            .unwrap();
        let mut admin = admin(&server.url()).await;
        let emptied: i64 = sqlx::query_scalar("SELECT count(*) FROM coord_lock_fences_last")
            .fetch_one(&mut admin)
            .await
            .unwrap();
        assert_eq!(emptied, 0, "crash recovery empties the unlogged table");
        let after = cycle(&a, key).await;
        assert!(
            after > before,
            "fence {after} after the crash, {before} before it"
        );
        assert_eq!(after, 1025, "the block above the durable ceiling");
    }
}

/// `url`, parsed (the native locks connect to a parsed [`StoreUrl`]).
fn store_url(url: &str) -> coord_backend::StoreUrl {
    coord_backend::StoreUrl::parse(url).expect("a store URL")
}

#[path = "../../coord-redis/tests/support/sentinel.rs"]
mod sentinel_support;

/// `RedisLock` on the Sentinel topology of `scripts/ha`
/// (`COORD_HA_REDIS_SENTINEL_URL`) and `?replicas=N` (`WAIT` behind each
/// grant, renewal and release).
mod redis_sentinel {
    use super::sentinel_support::{failover, sentinels_of, topology, with_params};
    use super::*;
    use coord_backend::Error;
    use coord_locks_native::{RedisLock, RedisLockOptions};

    const SENTINEL: &str = "COORD_HA_REDIS_SENTINEL_URL";

    fn indeterminate<T: std::fmt::Debug>(result: Result<T, LockError>) {
        match result {
            Err(LockError::Store(Error::Indeterminate { message, .. })) => {
                assert!(message.contains("replicas"), "{message}");
            }
            other => panic!("expected Indeterminate, got {other:?}"),
        }
    }

    /// A lock granted with `replicas=1` survives a failover; the lock
    /// follows the new primary within a bounded number of attempts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_lock_follows_a_failover() {
        let Some(base) = server_env(SENTINEL) else {
            return;
        };
        let _alone = topology(true).await;
        let ns = coord_conformance::unique_namespace("failover");
        let url = store_url(&with_params(&base, &format!("replicas=1&namespace={ns}")));
        let lock = RedisLock::connect(&url).await.unwrap();
        let held = lock
            .try_lock("a", Duration::from_secs(120))
            .await
            .unwrap()
            .expect("a free key");

        let (_old, new) = failover(&base).await;

        let mut attempts = 0;
        let other = loop {
            attempts += 1;
            match lock.try_lock("b", Duration::from_secs(120)).await {
                Ok(Some(handle)) => break handle,
                Ok(None) => panic!("b was never taken"),
                Err(LockError::Store(e)) => {
                    assert!(
                        matches!(e, Error::Unavailable { .. } | Error::Indeterminate { .. }),
                        "{e}"
                    );
                    assert!(attempts < 50, "not following the failover: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{e}"),
            }
        };
        // The grant acknowledged by a replica before the failover is still there.
        lock.renew(&held).await.unwrap();
        assert!(lock
            .try_lock("a", Duration::from_secs(1))
            .await
            .unwrap()
            .is_none());
        // On the new primary.
        let mut get = redis::cmd("GET");
        get.arg(lock.lock_key("b"));
        let token: Option<String> = super::sentinel_support::cmd(&new, &get).await.unwrap();
        assert_eq!(token.as_deref(), Some(other.token()));
        lock.release(held).await.unwrap();
        lock.release(other).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_sentinel_wrong_urls() {
        let options = RedisLockOptions::default().with_connect_timeout(Duration::from_secs(1));
        let nobody = RedisLock::connect_with(
            &store_url("redis+sentinel://u:hunter2@127.0.0.1:1,127.0.0.1:2/coord"),
            options.clone(),
        )
        .await
        .unwrap_err();
        let shown = nobody.to_string();
        assert!(matches!(nobody, Error::Unavailable { .. }), "{shown}");
        assert!(
            shown.contains("127.0.0.1:1") && shown.contains("coord"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        for bad in [
            "redis+sentinel://127.0.0.1:26380",
            "redis+sentinel://127.0.0.1:26380/coord?bogus=1",
            "redis+sentinel://127.0.0.1:26380/coord?replicas=x",
            "redis://127.0.0.1:6379?replica_timeout_ms=5",
        ] {
            let error = RedisLock::connect_with(&store_url(bad), options.clone())
                .await
                .unwrap_err();
            assert!(matches!(error, Error::Config(_)), "{bad}: {error}");
        }
        let Some(base) = server_env(SENTINEL) else {
            return;
        };
        let (sentinels, _) = sentinels_of(&base);
        let url = format!("redis+sentinel://{}/no-such-master", sentinels.join(","));
        let unknown = RedisLock::connect_with(&store_url(&url), options)
            .await
            .unwrap_err();
        let shown = unknown.to_string();
        assert!(matches!(unknown, Error::Unavailable { .. }), "{shown}");
        assert!(
            shown.contains("no-such-master") && shown.contains(&sentinels[0]),
            "{shown}"
        );
    }

    /// `replicas=2` on a server without replicas: each applied write
    /// (grant, renewal, release) is `Indeterminate` and stays applied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_replicas_short_is_indeterminate() {
        let Some(base) = server_env("COORD_TEST_REDIS_URL") else {
            return;
        };
        let ns = coord_conformance::unique_namespace("wait");
        let plain = RedisLock::connect(&store_url(&with_params(&base, &format!("namespace={ns}"))))
            .await
            .unwrap();
        let waiting = RedisLock::connect(&store_url(&with_params(
            &base,
            &format!("replicas=2&replica_timeout_ms=50&namespace={ns}"),
        )))
        .await
        .unwrap();
        let mut raw = redis::Client::open(base.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        // A grant: Indeterminate (then undone by the lock itself); its fence was spent.
        indeterminate(waiting.try_lock("k", Duration::from_secs(60)).await);
        let fence: Option<u64> = redis::cmd("GET")
            .arg(waiting.fence_key("k"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(fence, Some(1));
        // A renewal and a release of a lock granted without WAIT.
        let handle = plain
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free after the undo");
        let _: bool = redis::cmd("PEXPIRE")
            .arg(waiting.lock_key("k"))
            .arg(2_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        indeterminate(waiting.renew(&handle).await);
        let ttl: i64 = redis::cmd("PTTL")
            .arg(waiting.lock_key("k"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(ttl > 2_000, "the renewal was applied: {ttl}");
        indeterminate(waiting.release(handle).await);
        let exists: bool = redis::cmd("EXISTS")
            .arg(waiting.lock_key("k"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(!exists, "the release was applied");
        // A refusal sends WAIT too, but is judged on its own: not held.
        let taken = plain
            .try_lock("k", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        assert!(waiting
            .try_lock("k", Duration::from_secs(1))
            .await
            .unwrap()
            .is_none());
        plain.release(taken).await.unwrap();
    }
}
