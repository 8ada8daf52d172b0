//! coord: distributed coordination decided once, run on any atomic store.
//!
//! This facade picks a store from a URL and re-exports the layers:
//! [`backend`] (the three primitives), [`adapters`] (locks, task board, side
//! effects, all decided by one CAS engine).
//!
//! | URL | store | atomic across |
//! | --- | --- | --- |
//! | `memory://?namespace=NS` | [`coord_memory::SingleProcessMemoryBackend`] | ONE process only (tests, demos) |
//! | `sqlite://PATH` | `coord_sqlite` (feature `sqlite`) | the processes of one host |
//! | `redis://`, `rediss://` (TLS), `redis+cluster://`, `rediss+cluster://`, `redis+sentinel://h:p,h:p/MASTER` | `coord_redis` (feature `redis`) | one Redis primary (see docs/shapes.md) |
//! | `postgres://h1,h2/db` (libpq's multi-host form) | `coord_postgres` | the database on the writable host |
//! | `postgres://`, `postgresql://` | `coord_postgres` (feature `postgres`) | the database |
//! | `etcd://host:port[,host:port]`, `etcds://` (TLS: feature `etcd-tls`) | `coord_etcd` (feature `etcd`) | the etcd cluster (raft) |
//!
//! [`SCHEMES`] is the same table in code.
//!
//! # Features
//!
//! | feature | default | what it brings |
//! | --- | --- | --- |
//! | `sqlite`, `redis`, `postgres` | on | the store of that name in [`connect`] |
//! | `scheduler` | on | [`scheduler`]: cron and interval jobs run once per slot across instances |
//! | `etcd` | off | the etcd store; its gRPC client runs `protoc` at build time: install it (`apt-get install protobuf-compiler`, `brew install protobuf`) or point `PROTOC` at one |
//! | `etcd-tls` | off | `etcds://` |
//! | `http` | off | `coord::http`: an `Idempotency-Key` tower layer (axum `Router::layer`): a retried request runs its handler at most once |
//! | `native-locks` | off | `coord::native_locks`: `RedisLock` (with `redis`) and `PgAdvisoryLock` (with `postgres`), the stores' own lock primitives behind the same `Lock` trait, for comparison and migration |
//!
//! `default-features = false` keeps the memory store (one process) and the
//! adapters only.
//!
//! Every URL takes `?namespace=NAME` (default `coord`): applications sharing
//! one store never see each other's keys.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), coord::backend::Error> {
//! use coord::backend::{Assert, Mutation};
//!
//! let store = coord::connect("memory://?namespace=example").await?;
//! let out = store
//!     .txn(&[Assert::missing("greeting")], &[Mutation::put("greeting", b"hello".to_vec())])
//!     .await?;
//! assert!(out.applied);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

pub use coord_adapters as adapters;
pub use coord_backend as backend;
/// The `Idempotency-Key` layer for HTTP services (feature `http`).
#[cfg(feature = "http")]
pub use coord_http as http;
/// The stores' own locks (feature `native-locks`): Redis single-node Redlock
/// and PostgreSQL advisory locks, with fencing tokens.
#[cfg(feature = "native-locks")]
pub use coord_locks_native as native_locks;
/// The PostgreSQL store (feature `postgres`, on by default), for what
/// `connect` does not cover: `coord::postgres::InTransaction`, a coord
/// store bound to your own sqlx transaction (an outbox intent or a board
/// task that commits with your rows; docs/outbox.md).
#[cfg(feature = "postgres")]
pub use coord_postgres as postgres;
/// Cron and interval jobs run once per `(job, slot)` across instances
/// (feature `scheduler`, on by default).
#[cfg(feature = "scheduler")]
pub use coord_scheduler as scheduler;
/// The SQLite store (feature `sqlite`, on by default), for what `connect`
/// does not cover: `coord::sqlite::InTransaction` (as `coord::postgres`'s),
/// `SqliteBackend::open`, `pool_options` for your own pool on the same file.
#[cfg(feature = "sqlite")]
pub use coord_sqlite as sqlite;

use coord_backend::{Backend, Error, Result, StoreUrl};

/// One URL scheme [`connect`] knows: the one table behind `connect`, its
/// error messages and the crate docs' table (a test keeps them together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scheme {
    /// The URL scheme, as written before `://`.
    pub name: &'static str,
    /// The store family: the `store` label of the metrics, and what
    /// [`coord_backend::Backend::store_name`] reports.
    pub store: &'static str,
    /// Whether the scheme asks for TLS.
    pub tls: bool,
    /// Whether the scheme names a Redis Cluster.
    pub cluster: bool,
    /// The cargo feature of this crate that compiles the store in (`None`:
    /// always there).
    pub feature: Option<&'static str>,
    /// Whether this build has the store.
    pub built: bool,
}

const fn scheme(
    name: &'static str,
    store: &'static str,
    tls: bool,
    cluster: bool,
    feature: Option<&'static str>,
    built: bool,
) -> Scheme {
    Scheme {
        name,
        store,
        tls,
        cluster,
        feature,
        built,
    }
}

/// Every scheme [`connect`] knows, whether this build has its store or not.
#[rustfmt::skip]
pub const SCHEMES: &[Scheme] = &[
    //     name              store            tls    cluster feature           built
    scheme("memory",         "memory",        false, false,  None,             true),
    scheme("sqlite",         "sqlite",        false, false,  Some("sqlite"),   cfg!(feature = "sqlite")),
    scheme("redis",          "redis",         false, false,  Some("redis"),    cfg!(feature = "redis")),
    scheme("rediss",         "redis",         true,  false,  Some("redis"),    cfg!(feature = "redis")),
    scheme("redis+cluster",  "redis+cluster", false, true,   Some("redis"),    cfg!(feature = "redis")),
    scheme("rediss+cluster", "redis+cluster", true,  true,   Some("redis"),    cfg!(feature = "redis")),
    scheme("redis+sentinel", "redis+sentinel", false, false, Some("redis"),    cfg!(feature = "redis")),
    scheme("postgres",       "postgres",      false, false,  Some("postgres"), cfg!(feature = "postgres")),
    scheme("postgresql",     "postgres",      false, false,  Some("postgres"), cfg!(feature = "postgres")),
    scheme("etcd",           "etcd",          false, false,  Some("etcd"),     cfg!(feature = "etcd")),
    scheme("etcds",          "etcd",          true,  false,  Some("etcd"),     cfg!(feature = "etcd")),
];

impl Scheme {
    /// The scheme of `url`, or a [`Error::Config`] naming every known one.
    pub fn of(url: &StoreUrl) -> Result<Scheme> {
        SCHEMES
            .iter()
            .find(|s| s.name == url.scheme())
            .copied()
            .ok_or_else(|| {
                let known: Vec<&str> = SCHEMES.iter().map(|s| s.name).collect();
                Error::Config(format!(
                    "unknown store scheme {:?} (known: {})",
                    url.scheme(),
                    known.join(", ")
                ))
            })
    }

    /// This scheme, or a [`Error::Config`] saying which feature builds it in.
    fn built(self) -> Result<Scheme> {
        match (self.built, self.feature) {
            (true, _) | (false, None) => Ok(self),
            (false, Some(feature)) => Err(Error::Config(format!(
                "this build has no {}:// store: rebuild with the cargo feature `{feature}` \
                 (e.g. `cargo run -p coordctl --features {feature}`)",
                self.name
            ))),
        }
    }
}

/// Warnings about how the store `url` names is deployed, for an operator
/// (`coordctl` prints them when it connects): each names what a failover
/// can break and the setting that closes it. Today: a Redis primary with
/// replicas and no `?replicas=N` (acknowledged writes lost at failover), a
/// PostgreSQL primary streaming to standbys that are not synchronous (the
/// same at promotion). Best effort: a store that cannot be asked, or has
/// nothing to report, gives none; this never fails.
pub async fn deployment_warnings(url: &str) -> Vec<String> {
    let Ok(parsed) = StoreUrl::parse(url) else {
        return Vec::new();
    };
    let Ok(scheme) = Scheme::of(&parsed).and_then(Scheme::built) else {
        return Vec::new();
    };
    let warning: Option<String> = match scheme.store {
        #[cfg(feature = "redis")]
        "redis" | "redis+sentinel" => {
            coord_redis::server::unacknowledged_replicas_advice(&parsed).await
        }
        #[cfg(feature = "postgres")]
        "postgres" => coord_postgres::servers::asynchronous_standbys_advice(&parsed).await,
        _ => None,
    };
    warning.into_iter().collect()
}

/// Open the store a URL names. See the table in the crate docs.
///
/// The store comes wrapped in [`coord_backend::Metered`] with `store` = the
/// URL's store family ([`Scheme::store`]: `memory`, `sqlite`, `redis`,
/// `redis+cluster`, `redis+sentinel`, `postgres`, `etcd`), so every txn is counted in
/// `coord_txn_total` and timed in `coord_txn_seconds` once a `metrics`
/// recorder is installed (docs/operations.md). Without one this costs
/// nothing measurable.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let parsed = StoreUrl::parse(url)?;
    let scheme = Scheme::of(&parsed)?.built()?;
    let store: Arc<dyn Backend> = match scheme.store {
        "memory" => {
            if !parsed.body().is_empty() {
                return Err(Error::Config(format!(
                    "memory:// takes no path (got {:?}); use memory://?namespace=NAME",
                    parsed.body()
                )));
            }
            Arc::new(coord_memory::SingleProcessMemoryBackend::shared(
                parsed.namespace(),
            )?)
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => Arc::new(coord_sqlite::SqliteBackend::connect(&parsed).await?),
        #[cfg(feature = "redis")]
        "redis" | "redis+cluster" | "redis+sentinel" => {
            Arc::new(coord_redis::RedisBackend::connect(&parsed).await?)
        }
        #[cfg(feature = "postgres")]
        "postgres" => Arc::new(coord_postgres::PostgresBackend::connect(&parsed).await?),
        #[cfg(feature = "etcd")]
        "etcd" => Arc::new(coord_etcd::EtcdBackend::connect(&parsed).await?),
        // `built()` refused every store compiled out.
        other => unreachable!("scheme table names a store {other:?} this build has"),
    };
    Ok(coord_backend::Metered::wrap(scheme.store, store))
}

/// The README's example, compiled as a doc test so it stays true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The example of docs/at-most-once.md, compiled as a doc test.
#[doc = include_str!("../../../docs/at-most-once.md")]
#[cfg(doctest)]
pub struct AtMostOnceDoctests;

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn unknown_scheme_is_a_config_error() {
        let err = super::connect("nope://x").await.unwrap_err();
        assert!(matches!(err, coord_backend::Error::Config(_)), "{err}");
        for scheme in super::SCHEMES {
            assert!(err.to_string().contains(scheme.name), "{err}");
        }
        assert!(super::connect("memory://some/path").await.is_err());
    }

    /// The crate docs' table names every scheme of the table `connect` uses.
    #[test]
    fn crate_docs_list_every_scheme() {
        let docs: String = include_str!("lib.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect();
        for scheme in super::SCHEMES {
            assert!(
                docs.contains(&format!("`{}://", scheme.name)),
                "the crate docs do not list {}://",
                scheme.name
            );
        }
    }

    /// On the replicated topologies of `scripts/ha` (skipped without their
    /// URLs): a Redis primary with replicas warns unless the URL asks for
    /// acknowledgements; a PostgreSQL primary with an asynchronous standby
    /// warns; a store without replicas, or memory, never does.
    #[tokio::test]
    async fn deployment_warnings_name_unacknowledged_replicas() {
        assert!(super::deployment_warnings("memory://").await.is_empty());
        assert!(super::deployment_warnings("nope://x").await.is_empty());
        let env = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
        if let Some(single) = env("COORD_TEST_REDIS_URL") {
            assert!(super::deployment_warnings(&single).await.is_empty());
        }
        if let Some(sentinel) = env("COORD_HA_REDIS_SENTINEL_URL") {
            // Another test binary may be switching the primary over: ask
            // again until the Sentinels name one that answers.
            let mut warnings = Vec::new();
            for _ in 0..40 {
                warnings = super::deployment_warnings(&sentinel).await;
                if !warnings.is_empty() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            // The topology's two replicas, all of which writes must wait for.
            assert!(warnings[0].contains("?replicas=2 "), "{warnings:?}");
            let acked = format!("{sentinel}?replicas=1");
            assert!(super::deployment_warnings(&acked).await.is_empty());
        }
        if let Some(pg) = env("COORD_HA_POSTGRES_URL") {
            // Synchronous or not depends on what ran before (the failover
            // rounds switch it): the warning appears exactly when an
            // asynchronous standby streams.
            let warnings = super::deployment_warnings(&pg).await;
            assert!(warnings.len() <= 1, "{warnings:?}");
            if let Some(w) = warnings.first() {
                assert!(w.contains("synchronous_standby_names"), "{w}");
            }
        }
    }

    #[tokio::test]
    async fn connected_stores_are_metered_and_show_no_password() {
        let store = super::connect("memory://?namespace=facade-metered")
            .await
            .unwrap();
        assert_eq!(store.store_name(), "memory");
        // PostgreSQL with `trust` authentication ignores the password; any
        // other server needs COORD_TEST_POSTGRES_URL to carry a real one.
        let Ok(url) = std::env::var("COORD_TEST_POSTGRES_URL") else {
            eprintln!("SKIPPED: COORD_TEST_POSTGRES_URL is not set");
            return;
        };
        if !cfg!(feature = "postgres") {
            eprintln!("SKIPPED: this build has no postgres store");
            return;
        }
        let parsed = coord_backend::StoreUrl::parse(&url).unwrap();
        let with_password = if parsed.body().contains('@') {
            url.clone()
        } else {
            url.replacen("://", "://postgres:hunter2-secret@", 1)
        };
        let secret = coord_backend::StoreUrl::parse(&with_password)
            .unwrap()
            .body()
            .split_once('@')
            .and_then(|(userinfo, _)| userinfo.split_once(':'))
            .map(|(_, password)| password.to_owned());
        let store = super::connect(&with_password).await.unwrap();
        assert_eq!(store.store_name(), "postgres");
        let shown = format!("{store:?} {store:#?}");
        if let Some(secret) = secret.filter(|s| !s.is_empty()) {
            assert!(!shown.contains(&secret), "{shown}");
        }
    }
}
