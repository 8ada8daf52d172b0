//! What a store holds for one namespace: `(records, bytes)`, looked at with
//! the store's own client, never through coord.
//!
//! - SQLite: the namespace's rows of `coord_kv`: key + value bytes + 8 (the
//!   version), plus its `coord_floor` row;
//! - PostgreSQL: `pg_column_size` of the namespace's rows of `coord_kv` and
//!   `coord_floor` (what a row takes in a page; free space left by deleted
//!   rows is the engine's to reuse, after VACUUM);
//! - Redis (standalone): `MEMORY USAGE` of every Redis key of the namespace
//!   (records, index, tombstone set, floor);
//! - etcd: key + value bytes of the namespace's range and its floor marker
//!   (etcd also keeps old revisions until it compacts, which is etcd's own
//!   setting);
//! - memory and Redis Cluster: not measured (`None`).

use coord_backend::{Error, StoreUrl};

fn failed(what: &str) -> impl Fn(String) -> Error + '_ {
    move |e| Error::Unavailable {
        message: format!("measuring the store's size ({what}): {e}"),
        source: None,
    }
}

/// `(records, bytes)` of `namespace`, when the store can be looked into.
pub(super) async fn of(url: &str, namespace: &str) -> Result<Option<(u64, u64)>, Error> {
    let url = StoreUrl::parse(url)?;
    let _ = (&failed, namespace);
    match coord::Scheme::of(&url)?.store {
        #[cfg(feature = "sqlite")]
        "sqlite" => sqlite(&url, namespace).await.map(Some),
        #[cfg(feature = "postgres")]
        "postgres" => postgres(&url, namespace).await.map(Some),
        #[cfg(feature = "redis")]
        "redis" => redis_size(&url, namespace).await.map(Some),
        #[cfg(feature = "etcd")]
        "etcd" => etcd(&url, namespace).await.map(Some),
        _ => Ok(None),
    }
}

/// `(records, bytes)` from one row of two integers that `$sql` answers on a
/// fresh `$conn` (sqlx's SQLite or PostgreSQL connection) connected with
/// `$options`, binding the namespace once; errors through `$fail`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! sql_size {
    ($conn:ty, $options:expr, $sql:expr, $namespace:expr, $fail:expr) => {{
        use sqlx::Connection;
        let fail = $fail;
        let mut conn = <$conn>::connect_with($options)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (records, bytes): (i64, i64) = sqlx::query_as($sql)
            .bind($namespace)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let _ = conn.close().await;
        Ok((records as u64, bytes as u64))
    }};
}

/// SQLite: the namespace's `coord_kv` rows (key + value bytes + 8 for the
/// version) and its `coord_floor` row.
#[cfg(feature = "sqlite")]
const SQLITE_SIZE: &str = "SELECT count(*) + (SELECT count(*) FROM coord_floor WHERE ns = ?1), \
                coalesce(sum(length(CAST(key AS BLOB)) + coalesce(length(value), 0) + 8), 0) \
                + (SELECT count(*) * 8 FROM coord_floor WHERE ns = ?1) \
           FROM coord_kv WHERE ns = ?1";

/// PostgreSQL: `pg_column_size` of the namespace's `coord_kv` and
/// `coord_floor` rows.
#[cfg(feature = "postgres")]
const POSTGRES_SIZE: &str = "SELECT (SELECT count(*) FROM coord_kv WHERE ns = $1) \
              + (SELECT count(*) FROM coord_floor WHERE ns = $1), \
                (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM coord_kv c WHERE ns = $1)::bigint \
              + (SELECT coalesce(sum(pg_column_size(f.*)), 0) FROM coord_floor f WHERE ns = $1)::bigint";

#[cfg(feature = "sqlite")]
async fn sqlite(url: &StoreUrl, namespace: &str) -> Result<(u64, u64), Error> {
    let path = url.body().split('?').next().unwrap_or_default().to_owned();
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&path);
    sql_size!(
        sqlx::SqliteConnection,
        &options,
        SQLITE_SIZE,
        namespace,
        failed("sqlite")
    )
}

#[cfg(feature = "postgres")]
async fn postgres(url: &StoreUrl, namespace: &str) -> Result<(u64, u64), Error> {
    let options: sqlx::postgres::PgConnectOptions = url
        .without_namespace()
        .parse()
        .map_err(|e: sqlx::Error| failed("postgres")(e.to_string()))?;
    sql_size!(
        sqlx::PgConnection,
        &options,
        POSTGRES_SIZE,
        namespace,
        failed("postgres")
    )
}

#[cfg(feature = "redis")]
async fn redis_size(url: &StoreUrl, namespace: &str) -> Result<(u64, u64), Error> {
    let fail = failed("redis");
    let client = redis::Client::open(url.without_namespace()).map_err(|e| fail(e.to_string()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let pattern = format!("coord:{{{namespace}}}:*");
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| fail(e.to_string()))?;
        for key in keys {
            let used: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .map_err(|e| fail(e.to_string()))?;
            records += 1;
            bytes += used.unwrap_or(0);
        }
        cursor = next;
        if cursor == 0 {
            return Ok((records, bytes));
        }
    }
}

#[cfg(feature = "etcd")]
use crate::bench::raw_etcd_client as etcd_client;

#[cfg(feature = "etcd")]
async fn etcd(url: &StoreUrl, namespace: &str) -> Result<(u64, u64), Error> {
    let fail = failed("etcd");
    let mut client = etcd_client(url).await.map_err(|e| fail(e.to_string()))?;
    let escaped = namespace.replace('%', "%25").replace('/', "%2F");
    let (mut records, mut bytes) = (0u64, 0u64);
    for (key, prefix) in [
        (format!("coord/{escaped}/"), true),
        (format!("coord-meta/{escaped}/floor"), false),
    ] {
        let mut from = key.clone().into_bytes();
        let end = {
            let mut end = key.clone().into_bytes();
            if let Some(last) = end.last_mut() {
                *last += 1;
            }
            end
        };
        loop {
            let mut options = etcd_client::GetOptions::new().with_limit(1000);
            if prefix {
                options = options.with_range(end.clone());
            }
            let response = client
                .get(from.clone(), Some(options))
                .await
                .map_err(|e| fail(e.to_string()))?;
            for kv in response.kvs() {
                records += 1;
                bytes += (kv.key().len() + kv.value().len()) as u64;
            }
            match response.kvs().last() {
                Some(last) if prefix && response.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
    }
    Ok((records, bytes))
}

/// Compact etcd's history up to its current revision (`--etcd-compact`):
/// what an etcd with `--auto-compaction-retention` does on its own. It
/// compacts the whole cluster, every user's history: test clusters only.
/// `Ok(false)` on any other store.
pub(super) async fn compact_etcd(url: &str) -> Result<bool, Error> {
    let url = StoreUrl::parse(url)?;
    match coord::Scheme::of(&url)?.store {
        #[cfg(feature = "etcd")]
        "etcd" => {
            let fail = failed("etcd compaction");
            let mut client = etcd_client(&url).await.map_err(|e| fail(e.to_string()))?;
            let revision = client
                .get("coord-meta/", None)
                .await
                .map_err(|e| fail(e.to_string()))?
                .header()
                .map(|h| h.revision())
                .unwrap_or(0);
            client
                .compact(
                    revision,
                    Some(etcd_client::CompactionOptions::new().with_physical()),
                )
                .await
                .map_err(|e| fail(e.to_string()))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}
