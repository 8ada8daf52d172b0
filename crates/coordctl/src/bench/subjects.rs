//! What `coordctl bench` measures on one store, each next to its baseline:
//!
//! - the primitives (`txn` asserting one key's version and putting it;
//!   `snapshot` of one key) next to the raw client's one-round-trip
//!   conditional write and point read on a comparable record;
//! - a lock cycle (`try_lock` + `release`) of `GenericLock` next to the
//!   store's native lock (`RedisLock`, `PgAdvisoryLock`, etcd's Lock RPC).
//!
//! Raw baselines touch only records this module creates (a sibling SQLite
//! file, a PostgreSQL table, a Redis hash, an etcd key, all named after the
//! run) and [`Cleanup`] removes them. A store with no raw client or native
//! lock here has `None` as its baseline, with the reason.

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::{GenericLock, Lock};
use coord_backend::{Assert, Backend, Mutation, StoreUrl, Version};

use super::measure::{op, Failure, OpFn};

/// The primitives' records hold this value (as the store crates' benches do).
const VALUE: [u8; 64] = [7; 64];
/// Lease of each lock cycle.
const TTL: Duration = Duration::from_secs(30);

/// A baseline: what it is and how to run it, or why there is none.
pub(crate) struct Baseline {
    /// Human description (e.g. "raw EVALSHA compare-and-set").
    pub(crate) label: String,
    /// The operation, or `None` with the reason in `label`.
    pub(crate) op: Option<OpFn>,
}

impl Baseline {
    fn none(reason: impl Into<String>) -> Baseline {
        Baseline {
            label: reason.into(),
            op: None,
        }
    }

    fn some(label: impl Into<String>, op: OpFn) -> Baseline {
        Baseline {
            label: label.into(),
            op: Some(op),
        }
    }

    /// A store's native lock, one acquire + release cycle at a time (key
    /// `bench-native-lock`).
    #[cfg(any(feature = "redis", feature = "postgres"))]
    fn native_lock(label: &str, lock: Arc<dyn Lock>) -> Baseline {
        Baseline::some(label, lock_cycle(lock, "bench-native-lock"))
    }
}

/// A subject next to its baseline.
pub(crate) struct Pair {
    /// Stable identifier (`txn`, `snapshot`, `lock_cycle`).
    pub(crate) id: &'static str,
    /// Human description of the subject.
    pub(crate) label: String,
    /// The subject.
    pub(crate) op: OpFn,
    /// What it is compared with.
    pub(crate) baseline: Baseline,
    /// The generic lock whose CAS engine counts round trips (lock rows only).
    pub(crate) counted: Option<GenericLock>,
}

/// Work left to do once measuring is over (remove the raw records).
pub(crate) type Cleanup = Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>;

/// The raw clients of one store, built once for both comparisons.
pub(crate) struct Raw {
    /// Conditional write + point read, or why there is none.
    write_read: Option<(String, OpFn, String, OpFn)>,
    /// The native lock cycle, or why there is none.
    lock: Baseline,
    /// Why `write_read` is `None`.
    why_not: String,
}

#[cfg(any(
    feature = "sqlite",
    feature = "redis",
    feature = "postgres",
    feature = "etcd"
))]
impl Raw {
    /// A store's raw conditional write and point read, each with its label,
    /// beside the `lock` baseline.
    fn new(write: (&str, OpFn), read: (&str, OpFn), lock: Baseline) -> Raw {
        Raw {
            write_read: Some((write.0.into(), write.1, read.0.into(), read.1)),
            lock,
            why_not: String::new(),
        }
    }
}

/// Turn a client's error into a [`Failure`] that says what was being done.
fn fail<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> Failure + '_ {
    move |e| format!("{what}: {e}")
}

/// Set up the raw baselines of `url`'s store for a run named `run`.
pub(crate) async fn raw(url: &StoreUrl, run: &str, cleanup: &mut Cleanup) -> Result<Raw, Failure> {
    match url.scheme() {
        #[cfg(feature = "sqlite")]
        "sqlite" => sqlite::raw(url, run, cleanup).await,
        #[cfg(feature = "redis")]
        "redis" | "rediss" => redis_raw::raw(url, run, cleanup).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => postgres::raw(url, run, cleanup).await,
        // Options (auth, TLS, timeouts) are coord-etcd's to interpret: the raw
        // client here only knows plain endpoints.
        #[cfg(feature = "etcd")]
        "etcd" if !url.without_namespace().contains('?') => etcd::raw(url, run, cleanup).await,
        other => {
            let _ = (run, &cleanup);
            let why = match other {
                "memory" => "n/a: the memory store has no client".to_owned(),
                "redis+cluster" | "rediss+cluster" => {
                    "n/a: no raw baseline for Redis Cluster".to_owned()
                }
                "etcds" => "n/a: no raw baseline over TLS".to_owned(),
                "etcd" => "n/a: no raw baseline for etcd URLs with options".to_owned(),
                _ => format!("n/a: no raw baseline for {other}:// in this build"),
            };
            Ok(Raw {
                write_read: None,
                lock: Baseline::none(format!("{why}; no lock baseline")),
                why_not: why,
            })
        }
    }
}

/// The primitive comparisons: txn vs raw conditional write, snapshot vs raw read.
pub(crate) fn primitives(store: &Arc<dyn Backend>, raw: &mut Raw) -> Vec<Pair> {
    let version = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let txn = {
        let (store, version) = (store.clone(), version.clone());
        op(move || {
            let (store, version) = (store.clone(), version.clone());
            async move {
                use std::sync::atomic::Ordering;
                let v = version.load(Ordering::Relaxed);
                let assert = if v == 0 {
                    Assert::missing("bench/cas")
                } else {
                    Assert::at("bench/cas", Version(v))
                };
                let out = store
                    .txn(&[assert], &[Mutation::put("bench/cas", VALUE)])
                    .await
                    .map_err(fail("txn"))?;
                if !out.applied {
                    return Err("txn rejected: another writer uses the bench's namespace".into());
                }
                // +1 per write from the first version on, which a store
                // chooses (an etcd namespace in floor mode starts at the
                // key's create revision): read once, after the create.
                let next = if v == 0 {
                    let entries = store
                        .snapshot(&["bench/cas".to_owned()])
                        .await
                        .map_err(fail("snapshot"))?;
                    entries.first().map_or(1, |e| e.version.0)
                } else {
                    v + 1
                };
                version.store(next, Ordering::Relaxed);
                Ok(())
            }
        })
    };
    let snapshot = {
        let store = store.clone();
        op(move || {
            let store = store.clone();
            async move {
                let entries = store
                    .snapshot(&["bench/cas".to_owned()])
                    .await
                    .map_err(fail("snapshot"))?;
                std::hint::black_box(entries);
                Ok(())
            }
        })
    };
    let (write, read) = match raw.write_read.take() {
        Some((wl, w, rl, r)) => (Baseline::some(wl, w), Baseline::some(rl, r)),
        None => (
            Baseline::none(raw.why_not.clone()),
            Baseline::none(raw.why_not.clone()),
        ),
    };
    vec![
        Pair {
            id: "txn",
            label: "coord txn (assert version + put, 1 key)".into(),
            op: txn,
            baseline: write,
            counted: None,
        },
        Pair {
            id: "snapshot",
            label: "coord snapshot (1 key)".into(),
            op: snapshot,
            baseline: read,
            counted: None,
        },
    ]
}

/// The lock comparison: GenericLock's cycle vs the native lock's.
pub(crate) fn lock(store: &Arc<dyn Backend>, raw: &mut Raw) -> Pair {
    let generic = GenericLock::new(store.clone());
    Pair {
        id: "lock_cycle",
        label: "GenericLock try_lock + release".into(),
        op: lock_cycle(Arc::new(generic.clone()), "bench-lock"),
        baseline: std::mem::replace(&mut raw.lock, Baseline::none("")),
        counted: Some(generic),
    }
}

/// One uncontended try_lock + release of `key`.
fn lock_cycle(lock: Arc<dyn Lock>, key: &'static str) -> OpFn {
    op(move || {
        let lock = lock.clone();
        async move {
            let handle = lock
                .try_lock(key, TTL)
                .await
                .map_err(fail("try_lock"))?
                .ok_or_else(|| format!("{key} is held by someone else: the bench must be alone"))?;
            lock.release(handle).await.map_err(fail("release"))
        }
    })
}

/// The raw conditional write and point read of a sqlx pool (SQLite or
/// PostgreSQL): `update` binds (value, version) and must match one row,
/// `select` reads (version, value). The caller builds both from literals and
/// the run's hex token only.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! sql_write_read {
    ($pool:expr, $update:expr, $select:expr) => {{
        use sqlx::AssertSqlSafe;
        use std::sync::atomic::{AtomicI64, Ordering};
        let (pool, update, select): (_, String, String) = ($pool, $update, $select);
        let version = Arc::new(AtomicI64::new(0));
        let write = {
            let pool = pool.clone();
            op(move || {
                let (pool, update, version) = (pool.clone(), update.clone(), version.clone());
                async move {
                    let v = version.load(Ordering::Relaxed);
                    let done = sqlx::query(AssertSqlSafe(update))
                        .bind(&VALUE[..])
                        .bind(v)
                        .execute(&pool)
                        .await
                        .map_err(fail("raw UPDATE"))?;
                    if done.rows_affected() != 1 {
                        return Err("raw UPDATE matched no row".into());
                    }
                    version.store(v + 1, Ordering::Relaxed);
                    Ok(())
                }
            })
        };
        let read = op(move || {
            let (pool, select) = (pool.clone(), select.clone());
            async move {
                let row: (i64, Option<Vec<u8>>) = sqlx::query_as(AssertSqlSafe(select))
                    .fetch_one(&pool)
                    .await
                    .map_err(fail("raw SELECT"))?;
                std::hint::black_box(row);
                Ok(())
            }
        });
        (write, read)
    }};
}

#[cfg(feature = "sqlite")]
mod sqlite {
    //! Raw baseline: a table like coord-sqlite's in a sibling file opened the
    //! same way (WAL, the URL's durability, busy timeout).
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use coord_backend::StoreUrl;
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };

    use super::{fail, op, Baseline, Cleanup, Failure, Raw, VALUE};

    pub(super) async fn raw(
        url: &StoreUrl,
        run: &str,
        cleanup: &mut Cleanup,
    ) -> Result<Raw, Failure> {
        let path = PathBuf::from(format!("{}.bench-raw-{run}", url.body()));
        let normal = url.without_namespace().contains("durability=normal");
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5))
            .synchronous(if normal {
                SqliteSynchronous::Normal
            } else {
                SqliteSynchronous::Full
            });
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(fail("opening the raw SQLite file"))?;
        {
            let path = path.clone();
            let pool = pool.clone();
            cleanup.push(Box::pin(async move {
                pool.close().await;
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }));
        }
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS t (k TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL, \
             value BLOB) STRICT, WITHOUT ROWID; INSERT INTO t VALUES ('k', 0, NULL);",
        )
        .execute(&pool)
        .await
        .map_err(fail("creating the raw table"))?;
        let (write, read) = sql_write_read!(
            pool,
            "UPDATE t SET value = ?, version = version + 1 WHERE k = 'k' AND version = ?"
                .to_owned(),
            "SELECT version, value FROM t WHERE k = 'k'".to_owned()
        );
        Ok(Raw::new(
            ("raw UPDATE … WHERE version = ? (sqlx)", write),
            ("raw SELECT by primary key (sqlx)", read),
            Baseline::none("n/a: SQLite has no native lock"),
        ))
    }
}

#[cfg(feature = "redis")]
mod redis_raw {
    //! Raw baseline: a Lua compare-and-set on one hash (one EVALSHA) and an
    //! HMGET; native lock: `RedisLock`.
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use coord_backend::StoreUrl;
    use coord_locks_native::RedisLock;

    use super::{fail, op, Baseline, Cleanup, Failure, Raw, VALUE};

    const CAS: &str = "if redis.call('HGET', KEYS[1], 'v') == ARGV[1] then \
        redis.call('HSET', KEYS[1], 'v', ARGV[2], 'd', ARGV[3]) return 1 end return 0";

    pub(super) async fn raw(
        url: &StoreUrl,
        run: &str,
        cleanup: &mut Cleanup,
    ) -> Result<Raw, Failure> {
        let client = redis::Client::open(url.without_namespace()).map_err(fail("the Redis URL"))?;
        let conn = client
            .get_connection_manager()
            .await
            .map_err(fail("connecting the raw Redis client"))?;
        let key = format!("coordctl-bench-raw:{run}");
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg("v")
            .arg(0)
            .query_async(&mut conn.clone())
            .await
            .map_err(fail("raw HSET"))?;
        {
            let (mut conn, key) = (conn.clone(), key.clone());
            cleanup.push(Box::pin(async move {
                let _: Result<(), _> = redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
            }));
        }
        let script = Arc::new(redis::Script::new(CAS));
        let version = Arc::new(AtomicU64::new(0));
        let write = {
            let (conn, key) = (conn.clone(), key.clone());
            op(move || {
                let (mut conn, key, script, version) =
                    (conn.clone(), key.clone(), script.clone(), version.clone());
                async move {
                    let v = version.load(Ordering::Relaxed);
                    let set: i64 = script
                        .key(&key)
                        .arg(v)
                        .arg(v + 1)
                        .arg(&VALUE[..])
                        .invoke_async(&mut conn)
                        .await
                        .map_err(fail("raw EVALSHA"))?;
                    if set != 1 {
                        return Err("raw compare-and-set rejected".into());
                    }
                    version.store(v + 1, Ordering::Relaxed);
                    Ok(())
                }
            })
        };
        let read = op(move || {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move {
                let got: (Option<u64>, Option<Vec<u8>>) = redis::cmd("HMGET")
                    .arg(&key)
                    .arg("v")
                    .arg("d")
                    .query_async(&mut conn)
                    .await
                    .map_err(fail("raw HMGET"))?;
                std::hint::black_box(got);
                Ok(())
            }
        });
        let native = RedisLock::connect(url)
            .await
            .map_err(fail("connecting RedisLock"))?;
        Ok(Raw::new(
            ("raw Lua compare-and-set (1 EVALSHA)", write),
            ("raw HMGET", read),
            Baseline::native_lock("native RedisLock (SET NX PX + Lua)", Arc::new(native)),
        ))
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    //! Raw baseline: `UPDATE … WHERE version = $3` and a point `SELECT` on a
    //! table of the run (dropped afterwards), through a pool set up like the
    //! store's; native lock: `PgAdvisoryLock`.
    use std::sync::Arc;

    use coord_backend::StoreUrl;
    use coord_locks_native::PgAdvisoryLock;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use sqlx::AssertSqlSafe;

    use super::{fail, op, Baseline, Cleanup, Failure, Raw, VALUE};

    pub(super) async fn raw(
        url: &StoreUrl,
        run: &str,
        cleanup: &mut Cleanup,
    ) -> Result<Raw, Failure> {
        let options: PgConnectOptions = url
            .without_namespace()
            .parse()
            .map_err(fail("the PostgreSQL URL"))?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(options.options([("statement_timeout", "5000")]))
            .await
            .map_err(fail("connecting the raw PostgreSQL client"))?;
        // The name is built from the run's hex token only: nothing to escape.
        let table = format!("coordctl_bench_raw_{run}");
        debug_assert!(run.bytes().all(|b| b.is_ascii_alphanumeric()));
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"CREATE TABLE {table} (k text COLLATE "C" PRIMARY KEY, version bigint NOT NULL, value bytea);
               INSERT INTO {table} VALUES ('k', 0, NULL);"#
        )))
        .execute(&pool)
        .await
        .map_err(fail("creating the raw table"))?;
        {
            let (pool, table) = (pool.clone(), table.clone());
            cleanup.push(Box::pin(async move {
                let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
                    .execute(&pool)
                    .await;
                pool.close().await;
            }));
        }
        let update = format!(
            "UPDATE {table} SET value = $1, version = version + 1 WHERE k = 'k' AND version = $2"
        );
        let select = format!("SELECT version, value FROM {table} WHERE k = 'k'");
        let (write, read) = sql_write_read!(pool, update, select);
        let native = PgAdvisoryLock::connect(url)
            .await
            .map_err(fail("connecting PgAdvisoryLock"))?;
        Ok(Raw::new(
            ("raw UPDATE … WHERE version = $2 (sqlx)", write),
            ("raw SELECT by primary key (sqlx)", read),
            Baseline::native_lock("native PgAdvisoryLock (pooled sessions)", Arc::new(native)),
        ))
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    //! Raw baseline: one etcd `Txn If(version == v) Then(put)` and a range
    //! get; native lock: etcd's Lock + Unlock RPCs under one lease.
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    use coord_backend::StoreUrl;
    use etcd_client::{Compare, CompareOp, LockOptions, Txn, TxnOp};

    use super::{fail, op, Baseline, Cleanup, Failure, Raw, VALUE};

    pub(super) async fn raw(
        url: &StoreUrl,
        run: &str,
        cleanup: &mut Cleanup,
    ) -> Result<Raw, Failure> {
        let client = crate::bench::raw_etcd_client(url)
            .await
            .map_err(fail("connecting the raw etcd client"))?;
        let key = format!("coordctl-bench-raw/{run}/k").into_bytes();
        client
            .clone()
            .put(key.clone(), VALUE.to_vec(), None)
            .await
            .map_err(fail("raw put"))?;
        let lease = client
            .clone()
            .lease_grant(60, None)
            .await
            .map_err(fail("etcd lease grant"))?
            .id();
        {
            let (mut client, key) = (client.clone(), key.clone());
            cleanup.push(Box::pin(async move {
                let _ = client.delete(key, None).await;
                let _ = client.lease_revoke(lease).await;
            }));
        }
        let version = Arc::new(AtomicI64::new(1));
        let write = {
            let (client, key) = (client.clone(), key.clone());
            op(move || {
                let (mut client, key, version) = (client.clone(), key.clone(), version.clone());
                async move {
                    let v = version.load(Ordering::Relaxed);
                    let txn = Txn::new()
                        .when([Compare::version(key.clone(), CompareOp::Equal, v)])
                        .and_then([TxnOp::put(key, VALUE.to_vec(), None)]);
                    let out = client.txn(txn).await.map_err(fail("raw etcd Txn"))?;
                    if !out.succeeded() {
                        return Err("raw etcd Txn compare failed".into());
                    }
                    version.store(v + 1, Ordering::Relaxed);
                    Ok(())
                }
            })
        };
        let read = {
            let (client, key) = (client.clone(), key.clone());
            op(move || {
                let (mut client, key) = (client.clone(), key.clone());
                async move {
                    let got = client.get(key, None).await.map_err(fail("raw etcd get"))?;
                    std::hint::black_box(got);
                    Ok(())
                }
            })
        };
        let name = format!("coordctl-bench-raw/{run}/lock").into_bytes();
        let rpc_lock = op(move || {
            let (mut client, name) = (client.clone(), name.clone());
            async move {
                let held = client
                    .lock(name, Some(LockOptions::new().with_lease(lease)))
                    .await
                    .map_err(fail("etcd Lock"))?;
                client
                    .unlock(held.key().to_vec())
                    .await
                    .map_err(fail("etcd Unlock"))?;
                Ok(())
            }
        });
        Ok(Raw::new(
            ("raw etcd Txn If(version) Then(put)", write),
            ("raw etcd range get", read),
            Baseline::some("etcd Lock RPC + Unlock (one lease)", rpc_lock),
        ))
    }
}
