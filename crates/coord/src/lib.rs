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
//! | `redis://`, `rediss://`, `redis+cluster://` | `coord_redis` (feature `redis`) | one Redis primary (see docs/shapes.md) |
//! | `postgres://`, `postgresql://` | `coord_postgres` (feature `postgres`) | the database |
//! | `etcd://host:port[,host:port]` | `coord_etcd` (feature `etcd`) | the etcd cluster (raft) |
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

use coord_backend::{Backend, Error, Result, StoreUrl};

/// Open the store a URL names. See the table in the crate docs.
///
/// The store comes wrapped in [`coord_backend::Metered`] with `store` = the
/// URL's scheme family (`memory`, `sqlite`, `redis`, `redis+cluster`,
/// `postgres`, `etcd`), so every txn is counted in `coord_txn_total` and
/// timed in `coord_txn_seconds` once a `metrics` recorder is installed
/// (docs/operations.md). Without one this costs nothing measurable.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let parsed = StoreUrl::parse(url)?;
    let (label, store): (&'static str, Arc<dyn Backend>) = match parsed.scheme() {
        "memory" => {
            if !parsed.body().is_empty() {
                return Err(Error::Config(format!(
                    "memory:// takes no path (got {:?}); use memory://?namespace=NAME",
                    parsed.body()
                )));
            }
            (
                "memory",
                Arc::new(coord_memory::SingleProcessMemoryBackend::shared(
                    parsed.namespace(),
                )?),
            )
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => (
            "sqlite",
            Arc::new(coord_sqlite::SqliteBackend::connect(&parsed).await?),
        ),
        #[cfg(feature = "redis")]
        scheme @ ("redis" | "rediss" | "redis+cluster" | "rediss+cluster") => (
            if scheme.ends_with("+cluster") {
                "redis+cluster"
            } else {
                "redis"
            },
            Arc::new(coord_redis::RedisBackend::connect(&parsed).await?),
        ),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => (
            "postgres",
            Arc::new(coord_postgres::PostgresBackend::connect(&parsed).await?),
        ),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => (
            "etcd",
            Arc::new(coord_etcd::EtcdBackend::connect(&parsed).await?),
        ),
        #[cfg(not(feature = "etcd"))]
        "etcd" | "etcds" => {
            return Err(Error::Config(
                "this build has no etcd store: rebuild with the cargo feature `etcd` \
                 (e.g. `cargo run -p coordctl --features etcd`)"
                    .into(),
            ))
        }
        other => {
            return Err(Error::Config(format!(
                "unknown store scheme {other:?} (known: memory, sqlite, redis, rediss, redis+cluster, postgres, etcd; \
                 a store may also be compiled out by a cargo feature)"
            )))
        }
    };
    Ok(coord_backend::Metered::wrap(label, store))
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
        assert!(super::connect("memory://some/path").await.is_err());
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
