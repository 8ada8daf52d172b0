//! The statements of the three primitives and the decoding of their rows,
//! written once and run by every way this crate reaches the server: the
//! store's own sessions ([`crate::PostgresBackend`], prepared statements),
//! a transaction pooler (`pooled.rs`, the same statements with their
//! parameters inlined) and the caller's transaction
//! ([`crate::InTransaction`]). Each of them is a [`Session`]: it runs a
//! [`Statement`] and maps its own errors; the flow around the statements
//! (the single-key fast path, then `coord_txn`) and the reading of their
//! rows live here only.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use coord_backend::{Assert, Entry, Error, Mutation, Result, TxnOutcome, Version};
use futures_util::StreamExt;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Either, Executor, PgConnection, Postgres, Row};

use crate::fast::{self, SingleKey};
use crate::pooled::{self, Param};

pub(crate) const SNAPSHOT_SQL: &str =
    "SELECT key, version, value FROM coord_kv WHERE ns = $1 AND key = ANY($2) AND value IS NOT NULL";
pub(crate) const TXN_SQL: &str =
    "SELECT applied, k, ver, val FROM coord_txn($1, $2, $3, $4, $5, $6)";
// `LIMIT NULL` is no limit.
const KEYS_RANGE_SQL: &str = "SELECT key FROM coord_kv \
     WHERE ns = $1 AND key >= $2 AND key < $3 AND value IS NOT NULL ORDER BY key LIMIT $4";
const KEYS_FROM_SQL: &str = "SELECT key FROM coord_kv \
     WHERE ns = $1 AND key >= $2 AND value IS NOT NULL ORDER BY key LIMIT $3";

/// The arguments of one `coord_txn` call.
pub(crate) struct TxnArgs<'a> {
    /// Distinct asserted keys, in assert order.
    pub(crate) assert_keys: Vec<&'a str>,
    assert_versions: Vec<i64>,
    put_keys: Vec<&'a str>,
    put_values: Vec<&'a [u8]>,
    delete_keys: Vec<&'a str>,
}

impl<'a> TxnArgs<'a> {
    fn new(asserts: &'a [Assert], mutations: &'a [Mutation]) -> Self {
        let mut seen = HashSet::new();
        let mut assert_keys: Vec<&str> = Vec::with_capacity(asserts.len());
        let mut assert_versions: Vec<i64> = Vec::with_capacity(asserts.len());
        for assert in asserts {
            if seen.insert(assert.key.as_str()) {
                assert_keys.push(&assert.key);
                assert_versions.push(version_param(assert.version));
            }
        }
        let mut args = TxnArgs {
            assert_keys,
            assert_versions,
            put_keys: Vec::new(),
            put_values: Vec::new(),
            delete_keys: Vec::new(),
        };
        for mutation in mutations {
            match mutation {
                Mutation::Put { key, value } => {
                    args.put_keys.push(key);
                    args.put_values.push(value);
                }
                Mutation::Delete { key } => args.delete_keys.push(key),
            }
        }
        args
    }
}

/// One statement of a primitive with its parameters (the namespace is the
/// session's).
pub(crate) enum Statement<'a> {
    /// [`SNAPSHOT_SQL`] of these keys.
    Snapshot(&'a [&'a str]),
    /// A key listing: `successor` bounds the prefix (`None`: no string does),
    /// `limit` `None` lists everything.
    Keys {
        prefix: &'a str,
        successor: Option<String>,
        limit: Option<i64>,
    },
    /// A single-key fast-path write (`fast.rs`).
    Single(SingleKey<'a>),
    /// A `coord_txn` call.
    Txn(&'a TxnArgs<'a>),
}

impl Statement<'_> {
    /// What it is, for error messages.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            Statement::Snapshot(_) => "snapshot",
            Statement::Keys { .. } => "keys",
            Statement::Single(_) | Statement::Txn(_) => "txn",
        }
    }

    /// Whether it may write (a txn): its failures may leave an outcome unknown.
    pub(crate) fn writes(&self) -> bool {
        matches!(self, Statement::Single(_) | Statement::Txn(_))
    }

    /// The statement with its parameters bound (a prepared statement).
    pub(crate) fn query(
        &self,
        namespace: &str,
    ) -> sqlx::query::Query<'static, Postgres, PgArguments> {
        match self {
            Statement::Snapshot(keys) => sqlx::query(SNAPSHOT_SQL).bind(namespace).bind(*keys),
            Statement::Keys {
                prefix,
                successor: Some(successor),
                limit,
            } => sqlx::query(KEYS_RANGE_SQL)
                .bind(namespace)
                .bind(*prefix)
                .bind(successor.as_str())
                .bind(*limit),
            Statement::Keys {
                prefix,
                successor: None,
                limit,
            } => sqlx::query(KEYS_FROM_SQL)
                .bind(namespace)
                .bind(*prefix)
                .bind(*limit),
            Statement::Single(single) => {
                let query = sqlx::query(single.sql())
                    .bind(namespace)
                    .bind(single.key)
                    .bind(single.value);
                match single.version {
                    0 => query,
                    version => query.bind(version),
                }
            }
            Statement::Txn(args) => sqlx::query(TXN_SQL)
                .bind(namespace)
                .bind(&args.assert_keys)
                .bind(&args.assert_versions)
                .bind(&args.put_keys)
                .bind(&args.put_values)
                .bind(&args.delete_keys),
        }
    }

    /// The statement with its parameters written as literals (behind a
    /// transaction pooler, see `pooled.rs`); `None` when a text holds a NUL.
    pub(crate) fn inline(&self, namespace: &str) -> Option<String> {
        let ns = Param::Text(namespace);
        match self {
            Statement::Snapshot(keys) => {
                pooled::inline(SNAPSHOT_SQL, &[ns, Param::TextArray(keys)])
            }
            Statement::Keys {
                prefix,
                successor,
                limit,
            } => {
                let limit = Param::Int(limit.unwrap_or(i64::MAX));
                match successor {
                    Some(successor) => pooled::inline(
                        KEYS_RANGE_SQL,
                        &[ns, Param::Text(prefix), Param::Text(successor), limit],
                    ),
                    None => pooled::inline(KEYS_FROM_SQL, &[ns, Param::Text(prefix), limit]),
                }
            }
            Statement::Single(single) => {
                let mut params = vec![ns, Param::Text(single.key), Param::Bytea(single.value)];
                if single.version != 0 {
                    params.push(Param::Int(single.version));
                }
                pooled::inline(single.sql(), &params)
            }
            Statement::Txn(args) => pooled::inline(
                TXN_SQL,
                &[
                    ns,
                    Param::TextArray(&args.assert_keys),
                    Param::IntArray(&args.assert_versions),
                    Param::TextArray(&args.put_keys),
                    Param::ByteaArray(&args.put_values),
                    Param::TextArray(&args.delete_keys),
                ],
            ),
        }
    }
}

/// Somewhere the statements run: it binds its namespace, runs the
/// statement and maps a failure onto its own errors.
#[async_trait]
pub(crate) trait Session: Send + Sync {
    /// The rows of `statement`, once it completed.
    async fn rows(&self, statement: &Statement<'_>) -> Result<Vec<PgRow>>;
}

/// Run `query` on `conn`: its rows, or the error and whether the statement
/// had completed (its CommandComplete arrived: for an autocommit statement
/// the error then arose at the implicit COMMIT, see `errors::txn`).
pub(crate) async fn fetch<'q>(
    conn: &mut PgConnection,
    query: impl sqlx::Execute<'q, Postgres> + 'q,
) -> std::result::Result<Vec<PgRow>, (sqlx::Error, bool)> {
    let mut rows = Vec::new();
    let mut completed = false;
    let mut stream = conn.fetch_many(query);
    while let Some(step) = stream.next().await {
        match step {
            Ok(Either::Left(_)) => completed = true,
            Ok(Either::Right(row)) => rows.push(row),
            Err(error) => return Err((error, completed)),
        }
    }
    Ok(rows)
}

/// `Backend::raw_snapshot` through `session`.
pub(crate) async fn snapshot(
    session: &(impl Session + ?Sized),
    keys: &[&str],
) -> Result<Vec<Entry>> {
    let rows = session.rows(&Statement::Snapshot(keys)).await?;
    rows.into_iter()
        .map(|row| {
            let key: String = row
                .try_get(0)
                .map_err(|e| crate::errors::read("snapshot", e))?;
            let version: i64 = row
                .try_get(1)
                .map_err(|e| crate::errors::read("snapshot", e))?;
            let value: Option<Vec<u8>> = row
                .try_get(2)
                .map_err(|e| crate::errors::read("snapshot", e))?;
            entry_from(key, Some(version), value)
        })
        .collect()
}

/// `Backend::raw_txn` through `session`: the single-key fast path when the
/// txn has its shape, else (or when its condition failed) `coord_txn`.
pub(crate) async fn txn(
    session: &(impl Session + ?Sized),
    asserts: &[Assert],
    mutations: &[Mutation],
) -> Result<TxnOutcome> {
    if let Some(single) = fast::single_key(asserts, mutations, version_param) {
        let (key, value) = (single.key, single.value);
        let rows = session.rows(&Statement::Single(single)).await?;
        if let Some(row) = rows.first() {
            // The version the statement stored; reported for a put.
            let stored: Option<i64> = row.try_get(0).ok();
            let written = match (value, stored) {
                (Some(_), Some(version)) if version > 0 => {
                    vec![(key.to_owned(), Version(version.unsigned_abs()))]
                }
                _ => Vec::new(),
            };
            return Ok(TxnOutcome::applied_at(written));
        }
        // The condition failed (or the session is not at READ
        // COMMITTED): nothing was written. `coord_txn` decides again
        // under the lock and answers the current entry.
    }
    let args = TxnArgs::new(asserts, mutations);
    let rows = session.rows(&Statement::Txn(&args)).await?;
    decode_txn_rows(rows, &args.assert_keys)
}

/// `Backend::raw_keys` / `raw_first_keys` through `session`: the keys
/// under `prefix`, the first `limit` of them (`None`: all).
pub(crate) async fn keys(
    session: &(impl Session + ?Sized),
    prefix: &str,
    limit: Option<usize>,
) -> Result<Vec<String>> {
    let statement = Statement::Keys {
        prefix,
        successor: prefix_successor(prefix),
        limit: limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
    };
    let rows = session.rows(&statement).await?;
    rows.iter()
        .map(|row| row.try_get(0).map_err(|e| crate::errors::read("keys", e)))
        .collect()
}

/// Turn the rows of `coord_txn` into an outcome. The statement has completed
/// here (and, in autocommit, committed), so rows we cannot read leave the
/// outcome unknown.
fn decode_txn_rows(rows: Vec<PgRow>, assert_keys: &[&str]) -> Result<TxnOutcome> {
    let unreadable = |reason: String| Error::Indeterminate {
        message: format!("coord_txn answered rows that cannot be read: {reason}"),
        source: None,
    };
    let first = rows
        .first()
        .ok_or_else(|| unreadable("no row".to_owned()))?;
    let applied: bool = first.try_get(0).map_err(|e| unreadable(e.to_string()))?;
    if applied {
        // Schema r10: a row per key put, at the version it stored (r9 and
        // before: one row without a key, nothing to report). The txn
        // applied: a row that cannot be read is left unreported.
        let written = rows
            .iter()
            .filter_map(|row| {
                let key: String = row.try_get(1).ok()?;
                let version: i64 = row.try_get(2).ok().filter(|v| *v > 0)?;
                Some((key, Version(version.unsigned_abs())))
            })
            .collect();
        return Ok(TxnOutcome::applied_at(written));
    }
    let mut current = HashMap::with_capacity(rows.len());
    for row in rows {
        let key: String = row.try_get(1).map_err(|e| unreadable(e.to_string()))?;
        let version: Option<i64> = row.try_get(2).map_err(|e| unreadable(e.to_string()))?;
        let value: Option<Vec<u8>> = row.try_get(3).map_err(|e| unreadable(e.to_string()))?;
        let entry = entry_from(key.clone(), version, value)?;
        current.insert(key, entry);
    }
    assert_keys
        .iter()
        .map(|k| {
            current
                .remove(*k)
                .ok_or_else(|| unreadable(format!("no current entry for asserted key {k:?}")))
        })
        .collect::<Result<Vec<_>>>()
        .map(TxnOutcome::rejected)
}

/// Decode one `(key, version, value)` row; a value with a version below 1 is malformed.
fn entry_from(key: String, version: Option<i64>, value: Option<Vec<u8>>) -> Result<Entry> {
    match (value, version) {
        (None, _) => Ok(Entry::missing(key)),
        (Some(value), Some(v)) if v >= 1 => Ok(Entry::present(key, Version(v as u64), value)),
        (Some(_), v) => Err(Error::malformed(
            key,
            format!("stored value with version {v:?}; live values have version >= 1"),
        )),
    }
}

/// The smallest string above every string that starts with `prefix` (by
/// bytes, i.e. by code points), or `None` when there is none.
fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last as u32 + 1 {
            0xD800 => 0xE000, // skip the surrogate range: not chars
            n => n,
        };
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Versions above `i64::MAX` can never be stored, so asserting one must fail:
/// `-1` matches no row (stored versions are >= 0, missing keys are 0).
fn version_param(version: Version) -> i64 {
    i64::try_from(version.0).unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_bounds_exactly_the_prefix() {
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("a/").as_deref(), Some("a0"));
        assert_eq!(prefix_successor("a%").as_deref(), Some("a&"));
        assert_eq!(prefix_successor("\u{D7FF}").as_deref(), Some("\u{E000}"));
        assert_eq!(prefix_successor("x\u{10FFFF}").as_deref(), Some("y"));
        assert_eq!(prefix_successor("\u{10FFFF}"), None);
        for (prefix, inside, outside) in [
            ("é", "éa", "ê"),
            ("a_", "a_\u{10FFFF}", "a`"),
            ("k\u{FFFF}", "k\u{FFFF}\u{FFFF}", "k\u{10000}"),
        ] {
            let succ = prefix_successor(prefix).unwrap();
            assert!(inside.as_bytes() < succ.as_bytes() && inside.starts_with(prefix));
            assert!(outside.as_bytes() >= succ.as_bytes());
        }
    }

    #[test]
    fn versions_beyond_i64_never_match() {
        assert_eq!(version_param(Version(7)), 7);
        assert_eq!(version_param(Version(u64::MAX)), -1);
    }

    #[test]
    fn entries_are_checked() {
        assert!(!entry_from("k".into(), Some(3), None).unwrap().exists());
        assert_eq!(
            entry_from("k".into(), Some(3), Some(b"v".to_vec())).unwrap(),
            Entry::present("k", Version(3), b"v".to_vec())
        );
        assert!(matches!(
            entry_from("k".into(), Some(0), Some(b"v".to_vec())),
            Err(Error::MalformedRecord { .. })
        ));
    }
}
