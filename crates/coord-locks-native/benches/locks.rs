//! Locks side by side, in ONE run: the generic lock on every store, the
//! native locks of this crate, and each store's raw floor.
//!
//! ```text
//! COORD_TEST_REDIS_URL=redis://127.0.0.1:6379 \
//! COORD_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! COORD_TEST_ETCD_ENDPOINTS=127.0.0.1:2379 \
//! cargo bench -p coord-locks-native --bench locks
//! ```
//!
//! 1. criterion: one uncontended cycle (`try_lock` + `release` of one key,
//!    one client, sequential) per subject;
//! 2. a cycle table, each store's subjects interleaved cycle by cycle in a
//!    random order, in 20 rounds (cycles/s, store round trips per
//!    cycle: counted from `GenericLock::stats()` for the generic lock, by
//!    construction for the others), with the ratios the design targets;
//! 3. a contention table: 32 tasks on one key, counted over
//!    `COORD_CONTENTION_SECS` (default 2) per subject after a warm-up of a
//!    quarter of that (all 32 start at once; the crowd settles in line
//!    first), with the waiting calls still open at the end served, not
//!    timed out (see `contend`), each waiting with `LockExt::lock_with`
//!    (backoff 1 ms doubling to 16 ms); etcd's lock RPC waits on the server;
//!    the fair lock (`FairLock`, FIFO tickets) waits in line with the
//!    default `WaitOptions` (the release hands it over and wakes the next
//!    waiter; the backoff only paces its fallback poll). Hand-over
//!    latency: from the start of a holder's release to the moment the next
//!    waiter holds the lock, p50 and p99.
//!
//! A store whose variable is unset prints SKIPPED. Environment:
//! `COORD_BENCH_SECS` (criterion measurement time and the cycle table's time
//! per subject, default 1); `COORD_CONTENTION_ONLY=1` runs part 3 alone.
//!
//! Subjects: memory and SQLite (generic only), Redis (generic, native
//! `RedisLock`, raw `SET NX PX` + `EVALSHA` compare-and-delete), etcd
//! (generic, etcd's lock RPC: `Lock` + `Unlock` under a lease granted once
//! per client, raw: two `Txn`s putting a key if its version is the last
//! one written), PostgreSQL (generic, native `PgAdvisoryLock` (sessions reused
//! across acquisitions), the same with `max_idle(0)` (a connection per
//! acquisition), raw `pg_try_advisory_lock` + `pg_advisory_unlock` on one
//! connection).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::lock::{
    async_trait, FairLock, GenericLock, Lock, LockError, LockExt, LockHandle, WaitOptions,
};
use coord_adapters::mint_token;
use coord_adapters::wake::Wake;
use coord_adapters::CasStats;
use coord_backend::{Backend, StoreUrl};
use coord_locks_native::{PgAdvisoryLock, RedisLock};
use criterion::Criterion;
use sqlx::Connection;
use tokio::sync::Mutex;

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
type CycleFn = Arc<dyn Fn() -> BoxFuture + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);

/// How a subject's store round trips are known.
enum RoundTrips {
    /// Counted by the generic lock's engine.
    Counted(GenericLock),
    /// Known from what the subject sends (printed as given).
    ByConstruction(&'static str),
}

struct Subject {
    store: &'static str,
    name: &'static str,
    cycle: CycleFn,
    round_trips: RoundTrips,
}

fn namespace(label: &str) -> String {
    format!("bench-{label}-{}", &mint_token()[..12])
}

/// One try_lock + release cycle of `lock` on `key`.
fn lock_cycle(lock: Arc<dyn Lock>, key: &'static str) -> CycleFn {
    Arc::new(move || {
        let lock = lock.clone();
        Box::pin(async move {
            let handle = lock.try_lock(key, TTL).await.unwrap().expect("uncontended");
            lock.release(handle).await.unwrap();
        })
    })
}

fn generic(store: &'static str, backend: Arc<dyn Backend>) -> Subject {
    let lock = GenericLock::new(backend);
    Subject {
        store,
        name: "generic GenericLock",
        cycle: lock_cycle(Arc::new(lock.clone()), "cycle"),
        round_trips: RoundTrips::Counted(lock),
    }
}

/// One contending client: its calls are counted, and a generic one also
/// reports its engine's store round trips.
struct Client {
    lock: Arc<Counting>,
    /// The engine's store calls so far (generic and fair locks).
    stats: Option<Arc<dyn Fn() -> CasStats + Send + Sync>>,
}

/// `now - before`, counter by counter.
fn since(now: CasStats, before: CasStats) -> CasStats {
    CasStats {
        snapshots: now.snapshots - before.snapshots,
        txns: now.txns - before.txns,
        rejections: now.rejections - before.rejections,
    }
}

/// `a + b`, counter by counter.
fn add(a: CasStats, b: CasStats) -> CasStats {
    CasStats {
        snapshots: a.snapshots + b.snapshots,
        txns: a.txns + b.txns,
        rejections: a.rejections + b.rejections,
    }
}

/// A factory of lock clients for the contention table.
type ClientFactory = Arc<dyn Fn() -> Client + Send + Sync>;

struct ContentionSubject {
    store: &'static str,
    name: &'static str,
    kind: ContentionKind,
    /// Wait with the default `WaitOptions` (the fair lock: its waiters are
    /// woken by hand-over, the backoff only paces the fallback poll) rather
    /// than the short 1..16 ms backoff the retrying locks need.
    default_wait: bool,
}

enum ContentionKind {
    /// Clients behind the `Lock` trait; `generic` ones report engine round trips.
    Lock(ClientFactory),
    /// etcd's lock RPC: the server queues waiters.
    EtcdRpc(Box<etcd_client::Client>),
}

#[derive(Default)]
struct Setup {
    subjects: Vec<Subject>,
    contention: Vec<ContentionSubject>,
    skipped: Vec<String>,
}

impl Setup {
    /// The generic lock and the fair lock over `backend`: a cycle subject
    /// and a contention subject each (the fair lock's contention only).
    fn add_generic(&mut self, store: &'static str, backend: Arc<dyn Backend>) {
        self.subjects.push(generic(store, backend.clone()));
        self.contention
            .push(generic_contention(store, backend.clone()));
        self.contention.push(fair_contention(store, backend));
    }
}

async fn setup() -> Setup {
    let mut setup = Setup::default();

    // memory (one process only: a floor, never production)
    let memory: Arc<dyn Backend> =
        Arc::new(coord_memory::SingleProcessMemoryBackend::new(&namespace("mem")).unwrap());
    setup.add_generic("memory", memory);

    // SQLite: a temporary file
    let path = std::env::temp_dir().join(format!("coord-lock-bench-{}.db", &mint_token()[..12]));
    let sqlite: Arc<dyn Backend> = Arc::new(
        coord_sqlite::SqliteBackend::open(&path, "bench")
            .await
            .unwrap(),
    );
    setup.add_generic("sqlite", sqlite);

    match env("COORD_TEST_REDIS_URL") {
        None => setup
            .skipped
            .push("redis: COORD_TEST_REDIS_URL is unset".into()),
        Some(base) => redis_subjects(&mut setup, &base).await,
    }
    match env("COORD_TEST_ETCD_ENDPOINTS") {
        None => setup
            .skipped
            .push("etcd: COORD_TEST_ETCD_ENDPOINTS is unset".into()),
        Some(endpoints) => etcd_subjects(&mut setup, &endpoints).await,
    }
    match env("COORD_TEST_POSTGRES_URL") {
        None => setup
            .skipped
            .push("postgres: COORD_TEST_POSTGRES_URL is unset".into()),
        Some(base) => postgres_subjects(&mut setup, &base).await,
    }
    setup
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

fn generic_contention(store: &'static str, backend: Arc<dyn Backend>) -> ContentionSubject {
    // Each task is its own client (its own engine and cache), as another
    // process would be; they share the store connection.
    let make: ClientFactory = Arc::new(move || {
        let lock = GenericLock::new(backend.clone());
        Client {
            lock: Arc::new(Counting::new(Arc::new(lock.clone()))),
            stats: Some(Arc::new(move || lock.stats())),
        }
    });
    ContentionSubject {
        store,
        name: "generic GenericLock",
        kind: ContentionKind::Lock(make),
        default_wait: false,
    }
}

/// The fair lock: each task its own client, waiting in line.
fn fair_contention(store: &'static str, backend: Arc<dyn Backend>) -> ContentionSubject {
    let make: ClientFactory = Arc::new(move || {
        let lock = FairLock::new(backend.clone());
        Client {
            lock: Arc::new(Counting::new(Arc::new(lock.clone())).waiting_inside()),
            stats: Some(Arc::new(move || lock.stats())),
        }
    });
    ContentionSubject {
        store,
        name: "fair FairLock (FIFO tickets)",
        kind: ContentionKind::Lock(make),
        default_wait: true,
    }
}

/// Contention over one shared native client (its connection is shared too).
fn native_contention(
    store: &'static str,
    name: &'static str,
    lock: Arc<dyn Lock>,
) -> ContentionSubject {
    ContentionSubject {
        store,
        name,
        kind: ContentionKind::Lock(Arc::new(move || Client {
            lock: Arc::new(Counting::new(lock.clone())),
            stats: None,
        })),
        default_wait: false,
    }
}

async fn redis_subjects(setup: &mut Setup, base: &str) {
    let ns = namespace("redis");
    let url = StoreUrl::parse(&format!("{base}?namespace={ns}")).unwrap();
    let store: Arc<dyn Backend> = Arc::new(
        coord_redis::RedisBackend::connect(&url)
            .await
            .expect("COORD_TEST_REDIS_URL is set but Redis does not answer"),
    );
    setup.add_generic("redis", store);
    let native = RedisLock::connect(&url).await.unwrap();
    setup.subjects.push(Subject {
        store: "redis",
        name: "native RedisLock",
        cycle: lock_cycle(Arc::new(native.clone()), "cycle-native"),
        round_trips: RoundTrips::ByConstruction("2 (EVALSHA, EVALSHA)"),
    });

    let raw = redis::Client::open(StoreUrl::parse(base).unwrap().without_namespace())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let delete = Arc::new(redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    ));
    let raw_key = format!("{ns}:raw-cycle");
    setup.subjects.push(Subject {
        store: "redis",
        name: "raw SET NX PX + EVALSHA del",
        cycle: Arc::new(move || {
            let (mut conn, delete, key) = (raw.clone(), delete.clone(), raw_key.clone());
            Box::pin(async move {
                let token = mint_token();
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(set.is_some(), "uncontended");
                let deleted: i64 = delete
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(deleted, 1);
            })
        }),
        round_trips: RoundTrips::ByConstruction("2 (SET, EVALSHA)"),
    });

    setup.contention.push(native_contention(
        "redis",
        "native RedisLock",
        Arc::new(native),
    ));
}

async fn etcd_subjects(setup: &mut Setup, endpoints: &str) {
    let ns = namespace("etcd");
    let url = StoreUrl::parse(&format!("etcd://{endpoints}?namespace={ns}")).unwrap();
    let store: Arc<dyn Backend> = Arc::new(
        coord_etcd::EtcdBackend::connect(&url)
            .await
            .expect("COORD_TEST_ETCD_ENDPOINTS is set but etcd does not answer"),
    );
    setup.add_generic("etcd", store);

    let list: Vec<String> = endpoints.split(',').map(|e| e.trim().to_owned()).collect();
    let client = etcd_client::Client::connect(&list, None).await.unwrap();
    // Outlives every part of the run (nothing keeps it alive; the run's
    // namespace is never used again).
    let lease = client.clone().lease_grant(3600, None).await.unwrap().id();
    let name = format!("{ns}/rpc-cycle");
    let rpc = client.clone();
    setup.subjects.push(Subject {
        store: "etcd",
        name: "etcd Lock RPC + Unlock (lease)",
        cycle: Arc::new(move || {
            let (mut rpc, name) = (rpc.clone(), name.clone());
            Box::pin(async move {
                let held = rpc
                    .lock(
                        name.as_bytes(),
                        Some(etcd_client::LockOptions::new().with_lease(lease)),
                    )
                    .await
                    .unwrap();
                rpc.unlock(held.key().to_vec()).await.unwrap();
            })
        }),
        round_trips: RoundTrips::ByConstruction("2 (Lock, Unlock)"),
    });
    // The floor of any lock over etcd's txn: take (put if the version is
    // the last one seen) and release (the same), one value like the
    // generic lock's. On a client (HTTP/2 connection) of its own, as the
    // generic lock and the Lock RPC have: a connection used by two subjects
    // is warm when the second one starts, and one left idle while the other
    // stores ran pays for it in its first calls.
    let raw_key = format!("{ns}/raw-cycle").into_bytes();
    let raw = etcd_client::Client::connect(&list, None).await.unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    setup.subjects.push(Subject {
        store: "etcd",
        name: "raw txn put-if-version x2",
        cycle: Arc::new(move || {
            let (mut raw, key, seen) = (raw.clone(), raw_key.clone(), seen.clone());
            Box::pin(async move {
                for _ in 0..2 {
                    let version = seen.load(Ordering::Relaxed) as i64;
                    let value = format!("{{\"fence\":{version},\"token\":\"{}\"}}", mint_token());
                    let txn = etcd_client::Txn::new()
                        .when([etcd_client::Compare::version(
                            key.clone(),
                            etcd_client::CompareOp::Equal,
                            version,
                        )])
                        .and_then([etcd_client::TxnOp::put(key.clone(), value, None)]);
                    let reply = raw.txn(txn).await.unwrap();
                    assert!(reply.succeeded(), "nobody else writes this key");
                    seen.store(version as u64 + 1, Ordering::Relaxed);
                }
            })
        }),
        round_trips: RoundTrips::ByConstruction("2 (Txn, Txn)"),
    });
    setup.contention.push(ContentionSubject {
        store: "etcd",
        name: "etcd Lock RPC + Unlock (lease)",
        kind: ContentionKind::EtcdRpc(Box::new(client)),
        default_wait: false,
    });
}

async fn postgres_subjects(setup: &mut Setup, base: &str) {
    let ns = namespace("pg");
    let url = StoreUrl::parse(&format!("{base}?namespace={ns}")).unwrap();
    let store: Arc<dyn Backend> = Arc::new(
        coord_postgres::PostgresBackend::connect(&url)
            .await
            .expect("COORD_TEST_POSTGRES_URL is set but PostgreSQL does not answer"),
    );
    setup.add_generic("postgres", store);

    let native = Arc::new(PgAdvisoryLock::connect(&url).await.unwrap());
    setup.subjects.push(Subject {
        store: "postgres",
        name: "native PgAdvisoryLock",
        cycle: lock_cycle(native.clone(), "cycle-native"),
        round_trips: RoundTrips::ByConstruction("2 statements on an idle session"),
    });

    // Without idle sessions: a connection per acquisition, as before the
    // pool (TLS set-up and the OS trust store load are part of every cycle).
    let unpooled = PgAdvisoryLock::connect_with(
        &url,
        coord_locks_native::PgAdvisoryOptions::default().with_max_idle(0),
    )
    .await
    .unwrap();
    setup.subjects.push(Subject {
        store: "postgres",
        name: "native PgAdvisoryLock max_idle=0",
        cycle: lock_cycle(Arc::new(unpooled), "cycle-native-unpooled"),
        round_trips: RoundTrips::ByConstruction("connect + 2 statements (+ prepares) + close"),
    });

    setup.subjects.push(Subject {
        store: "postgres",
        name: "raw pg_try_advisory_lock + unlock",
        cycle: raw_pg_cycle(
            base,
            format!("{ns}:raw-cycle"),
            "SELECT 1::bigint WHERE pg_try_advisory_lock(hashtext($1))",
        )
        .await,
        round_trips: RoundTrips::ByConstruction("2 (lock, unlock)"),
    });
    // A durable fence per grant (what PgAdvisoryLock did before its fences
    // moved to an unlogged table under a durable ceiling): lock + fence
    // upsert in one statement, then unlock, on one connection. The upsert's
    // commit pays a WAL flush.
    setup.subjects.push(Subject {
        store: "postgres",
        name: "raw lock + fence upsert, unlock",
        cycle: raw_pg_cycle(
            base,
            format!("{ns}:raw-fenced-cycle"),
            "WITH granted AS MATERIALIZED (SELECT pg_try_advisory_lock(hashtext($1)) AS ok) \
             INSERT INTO coord_lock_fences AS f (name, fence) \
             SELECT $1, 1 FROM granted WHERE granted.ok \
             ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 RETURNING f.fence",
        )
        .await,
        round_trips: RoundTrips::ByConstruction("2 (lock + fence, unlock)"),
    });

    setup.contention.push(native_contention(
        "postgres",
        "native PgAdvisoryLock",
        native,
    ));
}

/// A raw cycle on one connection of its own: `lock_sql` (a row back iff the
/// advisory lock on `hashtext($1)` was granted), then `pg_advisory_unlock`.
async fn raw_pg_cycle(base: &str, key: String, lock_sql: &'static str) -> CycleFn {
    let conn = Arc::new(Mutex::new(
        sqlx::PgConnection::connect(StoreUrl::parse(base).unwrap().without_namespace())
            .await
            .unwrap(),
    ));
    Arc::new(move || {
        let (conn, key) = (conn.clone(), key.clone());
        Box::pin(async move {
            let mut conn = conn.lock().await;
            let granted: Option<i64> = sqlx::query_scalar(lock_sql)
                .bind(&key)
                .fetch_optional(&mut *conn)
                .await
                .unwrap();
            assert!(granted.is_some(), "uncontended");
            let freed: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtext($1))")
                .bind(&key)
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert!(freed);
        })
    })
}

/// Counts the lock calls a client makes (try_lock, renew, release; a
/// waiting lock that queues inside counts as one call).
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Lock>,
    calls: AtomicU64,
    /// Hand waiting to the inner lock (it queues) instead of retrying here.
    waits_inside: bool,
}

impl Counting {
    fn new(inner: Arc<dyn Lock>) -> Self {
        Counting {
            inner,
            calls: AtomicU64::new(0),
            waits_inside: false,
        }
    }

    fn waiting_inside(mut self) -> Self {
        self.waits_inside = true;
        self
    }
}

#[async_trait]
impl Lock for Counting {
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.try_lock(key, ttl).await
    }
    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(handle).await
    }
    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(handle).await
    }
    async fn watch_key(&self, key: &str) -> Wake {
        self.inner.watch_key(key).await
    }
    async fn wait_lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<LockHandle, LockError> {
        if !self.waits_inside {
            // The default: retry through this wrapper's counted try_lock.
            return coord_adapters::lock::retry_until_free(self, key, ttl, wait).await;
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.wait_lock(key, ttl, wait).await
    }
}

fn secs_from_env(var: &str, default: f64) -> Duration {
    Duration::from_secs_f64(
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default),
    )
}

struct CycleRow {
    store: &'static str,
    name: &'static str,
    per_sec: f64,
    /// Cycles per second in each round of the interleaving.
    round_rates: Vec<f64>,
    round_trips: String,
}

/// The time ratio of `a` to `b` (b's rate over a's) round by round: the
/// median and the range. A burst of load that hits one round moves that
/// round, not the median.
fn round_ratios(a: &CycleRow, b: &CycleRow) -> (f64, f64, f64) {
    let mut ratios: Vec<f64> = a
        .round_rates
        .iter()
        .zip(&b.round_rates)
        .map(|(a, b)| b / a)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    let median = if n % 2 == 1 {
        ratios[n / 2]
    } else {
        (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
    };
    (median, ratios[0], ratios[n - 1])
}

/// Each store's subjects as `(first index, count)`: a store's subjects are
/// listed next to each other.
fn store_blocks(subjects: &[Subject]) -> Vec<(usize, usize)> {
    let mut blocks = Vec::new();
    let mut start = 0;
    while start < subjects.len() {
        let store = subjects[start].store;
        let len = subjects[start..]
            .iter()
            .take_while(|s| s.store == store)
            .count();
        blocks.push((start, len));
        start += len;
    }
    blocks
}

/// A fresh order of `0..len` from the xorshift state `seed` (no dependency
/// for a shuffle).
fn shuffled(len: usize, seed: &mut u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        order.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
    order
}

/// How long one cycle of `subject` takes.
async fn timed_cycle(subject: &Subject) -> Duration {
    let started = Instant::now();
    (subject.cycle)().await;
    started.elapsed()
}

/// Measure every subject for `time` in total, in 20 rounds. In a round each
/// store runs its subjects cycle by cycle: one cycle of each subject whose
/// share of the round is not spent yet, in a fresh random order, again and
/// again. Load from other processes and the server's drift (fsync timing,
/// compaction) then hit a store's subjects alike within milliseconds, where
/// slices of a subject each once drifted apart by several percent. A
/// subject slower than 20 ms a cycle runs after them, alone.
async fn measure_cycles(subjects: &[Subject], time: Duration) -> Vec<CycleRow> {
    const ROUNDS: u32 = 20;
    const ALONE_ABOVE: Duration = Duration::from_millis(20);
    let slice = time / ROUNDS;
    // A subject that takes a connection per cycle runs in a slice of its
    // own: the server's work after each disconnect (a PostgreSQL backend
    // process exiting) would land on its neighbours' next cycles.
    let mut alone = Vec::with_capacity(subjects.len());
    for subject in subjects {
        alone.push(timed_cycle(subject).await > ALONE_ABOVE);
    }
    // Counted after that probe cycle, which is not in the table.
    let before: Vec<u64> = subjects
        .iter()
        .map(|s| match &s.round_trips {
            RoundTrips::Counted(lock) => lock.stats().round_trips(),
            RoundTrips::ByConstruction(_) => 0,
        })
        .collect();
    let mut cycles = vec![0u64; subjects.len()];
    let mut spent = vec![Duration::ZERO; subjects.len()];
    let mut round_rates = vec![Vec::new(); subjects.len()];
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for _ in 0..ROUNDS {
        for (first, len) in store_blocks(subjects) {
            let mut done = vec![0u64; len];
            let mut took = vec![Duration::ZERO; len];
            let (together, apart): (Vec<usize>, Vec<usize>) =
                (0..len).partition(|&k| !alone[first + k]);
            loop {
                // A subject whose share is spent stops; the others go on.
                let pending: Vec<usize> = together
                    .iter()
                    .copied()
                    .filter(|&k| took[k] < slice)
                    .collect();
                if pending.is_empty() {
                    break;
                }
                for k in shuffled(pending.len(), &mut seed)
                    .into_iter()
                    .map(|j| pending[j])
                {
                    took[k] += timed_cycle(&subjects[first + k]).await;
                    done[k] += 1;
                }
            }
            for k in apart {
                while took[k] < slice {
                    took[k] += timed_cycle(&subjects[first + k]).await;
                    done[k] += 1;
                }
            }
            for k in 0..len {
                cycles[first + k] += done[k];
                spent[first + k] += took[k];
                round_rates[first + k].push(done[k] as f64 / took[k].as_secs_f64());
            }
        }
    }
    subjects
        .iter()
        .enumerate()
        .map(|(i, subject)| CycleRow {
            store: subject.store,
            name: subject.name,
            per_sec: cycles[i] as f64 / spent[i].as_secs_f64(),
            round_rates: std::mem::take(&mut round_rates[i]),
            round_trips: match &subject.round_trips {
                RoundTrips::Counted(lock) => format!(
                    "{:.2} (counted)",
                    (lock.stats().round_trips() - before[i]) as f64 / cycles[i] as f64
                ),
                RoundTrips::ByConstruction(text) => (*text).to_owned(),
            },
        })
        .collect()
}

struct ContentionRow {
    store: &'static str,
    name: &'static str,
    per_sec: f64,
    max: u64,
    min: u64,
    calls_per_acq: f64,
    round_trips_per_acq: Option<f64>,
    /// Per acquisition: snapshots, txns, rejected txns (engine-counted subjects).
    stats_per_acq: Option<(f64, f64, f64)>,
    /// Store round trips per acquisition over the whole run: the warm-up
    /// (every task joining at once) and the drain included.
    whole_run_round_trips_per_acq: Option<f64>,
    handover_p50: Option<Duration>,
    handover_p99: Option<Duration>,
}

/// Hand-over latencies of one contention run: a holder notes when its
/// release starts; the next task to hold the lock takes that note.
#[derive(Default)]
struct Handover {
    released_at: Option<Instant>,
    samples: Vec<Duration>,
}

impl Handover {
    fn releasing(cell: &std::sync::Mutex<Handover>) {
        cell.lock().unwrap().released_at = Some(Instant::now());
    }

    fn acquired(cell: &std::sync::Mutex<Handover>) {
        let mut handover = cell.lock().unwrap();
        if let Some(released) = handover.released_at.take() {
            handover.samples.push(released.elapsed());
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[at])
}

const TASKS: usize = 32;

/// Reads one contending client's counters from outside its task: lock
/// calls so far, and store round trips when they are counted.
struct Meter {
    calls: Arc<dyn Fn() -> u64 + Send + Sync>,
    stats: Option<Arc<dyn Fn() -> CasStats + Send + Sync>>,
}

/// Every client's counters at one instant.
type Reading = Vec<(u64, Option<CasStats>)>;

impl Meter {
    fn of(client: &Client) -> Meter {
        let counting = client.lock.clone();
        Meter {
            calls: Arc::new(move || counting.calls.load(Ordering::Relaxed)),
            stats: client.stats.clone(),
        }
    }
}

fn read_meters(meters: &[Meter]) -> Reading {
    meters
        .iter()
        .map(|m| ((m.calls)(), m.stats.as_ref().map(|f| f())))
        .collect()
}

/// Lock calls and round trips between two readings, summed over the clients
/// (`None` when the round trips of some client are not counted).
fn between(from: &Reading, to: &Reading) -> (u64, Option<CasStats>) {
    let calls = from.iter().zip(to).map(|(f, t)| t.0 - f.0).sum();
    let stats = from
        .iter()
        .zip(to)
        .try_fold(CasStats::default(), |sum, (f, t)| {
            Some(add(sum, since(t.1?, f.1?)))
        });
    (calls, stats)
}

/// One contention run of `subject`: 32 tasks on one key. Every task starts
/// at once; a warm-up of a quarter of `time` lets that first crowd settle
/// in line, then a window of `time` is measured: the acquisitions made in
/// it, and every client's lock calls and store round trips between its
/// edges (read from outside the tasks, so a task that never acquires still
/// counts its tries). When the window closes no task asks again, and a call
/// already waiting is served (the line drains) rather than timed out, as
/// etcd's Lock RPC is: 32 waiters giving up at the same instant would
/// measure the give-up path, not contention. Whole-run figures (warm-up
/// and drain included) are kept beside.
async fn contend(subject: &ContentionSubject, time: Duration) -> ContentionRow {
    const DRAIN: Duration = Duration::from_secs(60);
    let key = format!("contended-{}", &mint_token()[..12]);
    let started = Instant::now();
    let window_start = started + time / 4;
    let deadline = window_start + time;
    let in_window = move |now: Instant| now >= window_start && now < deadline;
    let mut tasks = Vec::new();
    let mut meters = Vec::new();
    let handover = Arc::new(std::sync::Mutex::new(Handover::default()));
    // Notes an acquisition: whether it falls in the window (then it is a
    // hand-over sample too).
    let acquired = move |handover: &std::sync::Mutex<Handover>| {
        let counted = in_window(Instant::now());
        if counted {
            Handover::acquired(handover);
            Handover::releasing(handover);
        }
        counted
    };
    match &subject.kind {
        ContentionKind::Lock(make) => {
            let default_wait = subject.default_wait;
            for _ in 0..TASKS {
                let client = make();
                meters.push(Meter::of(&client));
                let key = key.clone();
                let handover = handover.clone();
                tasks.push(tokio::spawn(async move {
                    let (mut counted, mut all) = (0u64, 0u64);
                    while Instant::now() < deadline {
                        let wait = waiting(default_wait, deadline + DRAIN - Instant::now());
                        let handle = client
                            .lock
                            .lock_with(&key, TTL, &wait)
                            .await
                            .unwrap_or_else(|e| panic!("{key}: {e}"));
                        all += 1;
                        counted += u64::from(acquired(&handover));
                        client.lock.release(handle).await.unwrap();
                    }
                    (counted, all)
                }));
            }
        }
        ContentionKind::EtcdRpc(client) => {
            for _ in 0..TASKS {
                let mut client = (**client).clone();
                let rpcs = Arc::new(AtomicU64::new(0));
                let (calls, txns) = (rpcs.clone(), rpcs.clone());
                // Lock and Unlock: one round trip each.
                meters.push(Meter {
                    calls: Arc::new(move || calls.load(Ordering::Relaxed)),
                    stats: Some(Arc::new(move || CasStats {
                        txns: txns.load(Ordering::Relaxed),
                        ..CasStats::default()
                    })),
                });
                let name = key.clone();
                let handover = handover.clone();
                tasks.push(tokio::spawn(async move {
                    // One lease per client: two lock calls under one lease
                    // would both "own" the same lock key.
                    let lease = client.lease_grant(3_600, None).await.unwrap().id();
                    let options = etcd_client::LockOptions::new().with_lease(lease);
                    let (mut counted, mut all) = (0u64, 0u64);
                    while Instant::now() < deadline {
                        let held = client
                            .lock(name.as_bytes(), Some(options.clone()))
                            .await
                            .unwrap();
                        rpcs.fetch_add(1, Ordering::Relaxed);
                        all += 1;
                        counted += u64::from(acquired(&handover));
                        client.unlock(held.key().to_vec()).await.unwrap();
                        rpcs.fetch_add(1, Ordering::Relaxed);
                    }
                    client.lease_revoke(lease).await.unwrap();
                    (counted, all)
                }));
            }
        }
    }
    let start_reading = read_meters(&meters);
    tokio::time::sleep_until(window_start.into()).await;
    let window_opened = read_meters(&meters);
    tokio::time::sleep_until(deadline.into()).await;
    let window_closed = read_meters(&meters);
    let mut tallies = Vec::new();
    for task in tasks {
        tallies.push(task.await.unwrap());
    }
    let end_reading = read_meters(&meters);
    let total: u64 = tallies.iter().map(|t| t.0).sum();
    let all_total: u64 = tallies.iter().map(|t| t.1).sum();
    let (calls, stats) = between(&window_opened, &window_closed);
    let (all_calls, all_stats) = between(&start_reading, &end_reading);
    let per = |n: u64| n as f64 / total.max(1) as f64;
    let mut samples = std::mem::take(&mut handover.lock().unwrap().samples);
    samples.sort_unstable();
    // For the native Redis lock every call is one EVALSHA.
    let native_redis = subject.name == "native RedisLock";
    ContentionRow {
        store: subject.store,
        name: subject.name,
        per_sec: total as f64 / time.as_secs_f64(),
        max: tallies.iter().map(|t| t.0).max().unwrap_or(0),
        min: tallies.iter().map(|t| t.0).min().unwrap_or(0),
        calls_per_acq: per(calls),
        stats_per_acq: stats.map(|s| (per(s.snapshots), per(s.txns), per(s.rejections))),
        round_trips_per_acq: stats
            .map(|s| per(s.round_trips()))
            .or(native_redis.then(|| per(calls))),
        whole_run_round_trips_per_acq: all_stats
            .map(|s| s.round_trips())
            .or(native_redis.then_some(all_calls))
            .map(|n| n as f64 / all_total.max(1) as f64),
        handover_p50: percentile(&samples, 0.5),
        handover_p99: percentile(&samples, 0.99),
    }
}

/// How a contending client waits, for at most `timeout`: with the default
/// `WaitOptions` (the fair lock: hand-over wakes it, the backoff only paces
/// its fallback poll), or retrying with a 1..16 ms backoff.
fn waiting(default_wait: bool, timeout: Duration) -> WaitOptions {
    let wait = WaitOptions::with_timeout(timeout);
    if default_wait {
        wait
    } else {
        wait.with_backoff(Duration::from_millis(1), Duration::from_millis(16))
    }
}

/// A crowd: 32 clients of `subject` ask for a fresh key at the same
/// instant, and each holds it once. Store round trips per acquisition, and
/// how long until the last one had held it (`None`: not engine-counted).
async fn crowd(subject: &ContentionSubject) -> Option<(f64, Duration)> {
    let ContentionKind::Lock(make) = &subject.kind else {
        return None;
    };
    let key = format!("crowd-{}", &mint_token()[..12]);
    let clients: Vec<Client> = (0..TASKS).map(|_| make()).collect();
    let meters: Vec<Meter> = clients.iter().map(Meter::of).collect();
    let before = read_meters(&meters);
    let gate = Arc::new(tokio::sync::Barrier::new(TASKS));
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let (key, gate, default_wait) = (key.clone(), gate.clone(), subject.default_wait);
            tokio::spawn(async move {
                gate.wait().await;
                let wait = waiting(default_wait, Duration::from_secs(60));
                let handle = client.lock.lock_with(&key, TTL, &wait).await.unwrap();
                client.lock.release(handle).await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let (_, stats) = between(&before, &read_meters(&meters));
    stats.map(|s| (s.round_trips() as f64 / TASKS as f64, elapsed))
}

fn main() {
    let time = secs_from_env("COORD_BENCH_SECS", 1.0);
    let contention_time = secs_from_env("COORD_CONTENTION_SECS", 2.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = rt.block_on(setup());
    for skipped in &setup.skipped {
        println!("SKIPPED: {skipped}");
    }
    // Warm: scripts loaded, statements prepared, records created.
    rt.block_on(async {
        for subject in &setup.subjects {
            for _ in 0..3 {
                (subject.cycle)().await;
            }
        }
    });

    if std::env::var_os("COORD_CONTENTION_ONLY").is_none() {
        uncontended(&rt, &setup, time);
    }
    contention_table(&rt, &setup, contention_time);
}

/// Parts 1 and 2: criterion, then the interleaved cycle table and its ratios.
fn uncontended(rt: &tokio::runtime::Runtime, setup: &Setup, time: Duration) {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(time)
        .sample_size(10)
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("lock_cycle");
        for subject in &setup.subjects {
            let cycle = subject.cycle.clone();
            group.bench_function(format!("{}/{}", subject.store, subject.name), |b| {
                b.to_async(rt).iter(|| cycle())
            });
        }
        group.finish();
    }
    criterion.final_summary();

    let rows = rt.block_on(measure_cycles(&setup.subjects, time));
    println!(
        "\nuncontended try_lock + release cycles (one client, sequential, {:.1} s each, \
         in 20 rounds, a store's subjects interleaved cycle by cycle in random order):",
        time.as_secs_f64()
    );
    println!(
        "| {:<9} | {:<34} | {:>10} | {:>9} | {:<44} |",
        "store", "implementation", "cycles/s", "µs/cycle", "store round trips per cycle"
    );
    println!(
        "|{:-<11}|{:-<36}|{:-<12}|{:-<11}|{:-<46}|",
        "", "", "", "", ""
    );
    for row in &rows {
        println!(
            "| {:<9} | {:<34} | {:>10.0} | {:>9.1} | {:<44} |",
            row.store,
            row.name,
            row.per_sec,
            1e6 / row.per_sec,
            row.round_trips
        );
    }
    let rate = |store: &str, name: &str| {
        rows.iter()
            .find(|r| r.store == store && r.name.starts_with(name))
    };
    let ratio = |label: &str, a: Option<&CycleRow>, b: Option<&CycleRow>, target: &str| match (a, b)
    {
        // Time ratio = inverse rate ratio: over the whole run, and the
        // median of the rounds with their range.
        (Some(a), Some(b)) => {
            let (median, low, high) = round_ratios(a, b);
            println!(
                "{label}: {:.2}x, median of rounds {median:.2}x (rounds {low:.2}-{high:.2})   ({target})",
                b.per_sec / a.per_sec
            )
        }
        _ => println!("{label}: SKIPPED (store not configured)"),
    };
    println!();
    ratio(
        "generic Redis cycle time / native RedisLock cycle time",
        rate("redis", "generic"),
        rate("redis", "native"),
        "target <= 1.25x",
    );
    ratio(
        "generic Redis cycle time / raw SET NX PX + EVALSHA",
        rate("redis", "generic"),
        rate("redis", "raw"),
        "floor",
    );
    ratio(
        "generic etcd cycle time / etcd Lock RPC + Unlock",
        rate("etcd", "generic"),
        rate("etcd", "etcd Lock"),
        "target < 1.00x",
    );
    ratio(
        "raw etcd txn put-if-version x2 / etcd Lock RPC + Unlock",
        rate("etcd", "raw txn"),
        rate("etcd", "etcd Lock"),
        "what any lock over two txns costs",
    );
    ratio(
        "generic etcd cycle time / raw etcd txn put-if-version x2",
        rate("etcd", "generic"),
        rate("etcd", "raw txn"),
        "floor",
    );
    ratio(
        "generic PostgreSQL cycle time / raw advisory lock + unlock",
        rate("postgres", "generic"),
        rate("postgres", "raw pg_try"),
        "floor",
    );
    ratio(
        "native PgAdvisoryLock cycle time / raw lock + fence upsert, unlock",
        rate("postgres", "native PgAdvisoryLock"),
        rate("postgres", "raw lock + fence"),
        "a WAL flush per grant",
    );
    ratio(
        "native PgAdvisoryLock cycle time / raw advisory lock + unlock",
        rate("postgres", "native PgAdvisoryLock"),
        rate("postgres", "raw pg_try"),
        "target <= 2.00x (>= 0.5x the raw rate)",
    );
}

/// Part 3: the contention table.
fn contention_table(rt: &tokio::runtime::Runtime, setup: &Setup, contention_time: Duration) {
    let rows: Vec<ContentionRow> = rt.block_on(async {
        let mut rows = Vec::new();
        for subject in &setup.contention {
            rows.push(contend(subject, contention_time).await);
        }
        rows
    });
    let crowds: Vec<_> = rt.block_on(async {
        let mut crowds = Vec::new();
        for subject in &setup.contention {
            if let Some(crowd) = crowd(subject).await {
                crowds.push((subject.store, subject.name, crowd));
            }
        }
        crowds
    });
    println!(
        "\ncontention: {TASKS} tasks on one key, counted over {:.1} s per subject after a warm-up of \
         {:.1} s (waiting calls at the end are served, not timed out), waiting with backoff 1..16 ms \
         (etcd Lock RPC: the server queues waiters):",
        contention_time.as_secs_f64(),
        contention_time.as_secs_f64() / 4.0
    );
    println!(
        "| {:<9} | {:<34} | {:>10} | {:>8} | {:>8} | {:>7} | {:>14} | {:>21} | {:>11} | {:>11} |",
        "store",
        "implementation",
        "acquires/s",
        "max/task",
        "min/task",
        "max/min",
        "lock calls/acq",
        "store round trips/acq",
        "handover p50",
        "handover p99"
    );
    println!(
        "|{:-<11}|{:-<36}|{:-<12}|{:-<10}|{:-<10}|{:-<9}|{:-<16}|{:-<23}|{:-<13}|{:-<13}|",
        "", "", "", "", "", "", "", "", "", ""
    );
    let ms = |d: Option<Duration>| {
        d.map_or("n/a".to_owned(), |d| {
            format!("{:.2} ms", d.as_secs_f64() * 1e3)
        })
    };
    for row in &rows {
        println!(
            "| {:<9} | {:<34} | {:>10.0} | {:>8} | {:>8} | {:>7} | {:>14.2} | {:>21} | {:>11} | {:>11} |",
            row.store,
            row.name,
            row.per_sec,
            row.max,
            row.min,
            if row.min == 0 { "inf".to_owned() } else { format!("{:.1}", row.max as f64 / row.min as f64) },
            row.calls_per_acq,
            row.round_trips_per_acq
                .map_or("n/a (not counted)".to_owned(), |r| format!("{r:.2}")),
            ms(row.handover_p50),
            ms(row.handover_p99),
        );
    }
    println!("\nstore round trips per acquisition, by kind (engine-counted subjects):");
    for row in &rows {
        if let (Some((snapshots, txns, rejected)), true) = (
            row.stats_per_acq,
            row.name.starts_with("fair") || row.name.starts_with("generic"),
        ) {
            let whole = row
                .whole_run_round_trips_per_acq
                .map_or("n/a".to_owned(), |r| format!("{r:.2}"));
            println!(
                "  {:<9} {:<34} snapshots {snapshots:.2}, txns {txns:.2} (rejected {rejected:.2}); \
                 whole run (warm-up and drain included) {whole}",
                row.store, row.name
            );
        }
    }
    println!(
        "\ncrowd: {TASKS} clients ask for a fresh key at the same instant, each holds it once \
         (engine-counted subjects):"
    );
    for (store, name, (round_trips, elapsed)) in &crowds {
        println!(
            "  {store:<9} {name:<34} store round trips per acquisition {round_trips:.2}, \
             all served in {:.1} ms",
            elapsed.as_secs_f64() * 1e3
        );
    }
}
