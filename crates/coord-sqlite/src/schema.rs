//! The file's schema, created or upgraded once per open.
//!
//! Revision 2 (`PRAGMA user_version = 2`) adds, for bounded storage:
//! - `coord_floor`: per namespace, the version a key without any row starts
//!   above (raised by a reclaim in the same transaction that deletes the
//!   tombstones, see `coord_backend::reclaim`);
//! - `coord_kv_live`, a partial index of the live rows, so `keys` reads no
//!   tombstone, and `coord_kv_dead`, one of the tombstones, so a reclaim
//!   reads no live row.
//!
//! Revision 3 adds `coord_clients`: per namespace, the storage format each
//! client announced and when, and (client `''`) the namespace's required
//! format (see `coord_backend::reclaim`, "Mixed versions").
//!
//! A revision-1 or -2 file is upgraded in place (the objects are added; no
//! row changes). A file of a revision this crate does not know is refused:
//! an older coord-sqlite would write new keys at version 1, below the floor.

use std::path::Path;

use coord_backend::Error;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AssertSqlSafe, Connection};

use crate::{is_busy, Attempt};

/// The `PRAGMA user_version` of files this crate creates (bumped when the schema changes).
const SCHEMA_VERSION: i64 = 3;

/// Revision 1: the table.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS coord_kv (
    ns TEXT NOT NULL COLLATE BINARY,
    key TEXT NOT NULL COLLATE BINARY,
    version INTEGER NOT NULL CHECK (version > 0),
    value BLOB,
    PRIMARY KEY (ns, key)
) STRICT, WITHOUT ROWID";

/// Revision 2: the floor and the two partial indexes.
const CREATE_REVISION_2: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS coord_floor (
        ns TEXT NOT NULL PRIMARY KEY COLLATE BINARY,
        floor INTEGER NOT NULL CHECK (floor >= 0)
    ) STRICT, WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS coord_kv_live ON coord_kv (ns, key) WHERE value IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS coord_kv_dead ON coord_kv (ns, key) WHERE value IS NULL",
];

/// Revision 3: the announcements of storage formats.
const CREATE_REVISION_3: &str = "CREATE TABLE IF NOT EXISTS coord_clients (
    ns TEXT NOT NULL COLLATE BINARY,
    client TEXT NOT NULL COLLATE BINARY,
    format INTEGER NOT NULL CHECK (format >= 0),
    seen_ms INTEGER NOT NULL,
    PRIMARY KEY (ns, client)
) STRICT, WITHOUT ROWID";

/// Switch the file to WAL, create or upgrade the schema and stamp its
/// revision. Done once per open on a dedicated connection, because changing
/// the journal mode needs a lock that SQLite's busy handler does not wait for.
pub(crate) async fn prepare_file(
    connect: SqliteConnectOptions,
    path: &Path,
) -> std::result::Result<(), Attempt> {
    let open_error = |what: &str, e: sqlx::Error| {
        if is_busy(&e) {
            Attempt::Busy(e)
        } else {
            Attempt::Failed(Error::unavailable(
                format!("sqlite: {what} {}", path.display()),
                e,
            ))
        }
    };
    let mut conn = SqliteConnection::connect_with(&connect)
        .await
        .map_err(|e| open_error("cannot open", e))?;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| open_error("cannot switch to WAL:", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Attempt::Failed(Error::Unavailable {
            message: format!(
                "sqlite: {} stayed in journal mode {mode:?} instead of WAL \
                 (in-memory or unsupported file system?)",
                path.display()
            ),
            source: None,
        }));
    }
    let found: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| open_error("cannot read the schema version of", e))?;
    if found == SCHEMA_VERSION {
        let _ = conn.close().await;
        return Ok(());
    }
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| open_error("cannot lock", e))?;
    // Read again under the write lock: another process may have upgraded it.
    let found: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| open_error("cannot read the schema version of", e))?;
    match found {
        0..=2 => {
            for statement in std::iter::once(CREATE_TABLE)
                .chain(CREATE_REVISION_2)
                .chain(std::iter::once(CREATE_REVISION_3))
            {
                sqlx::query(statement)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| open_error("cannot create the schema in", e))?;
            }
            sqlx::query(AssertSqlSafe(format!(
                "PRAGMA user_version = {SCHEMA_VERSION}"
            )))
            .execute(&mut *tx)
            .await
            .map_err(|e| open_error("cannot stamp the schema version of", e))?;
        }
        SCHEMA_VERSION => {}
        other => {
            return Err(Attempt::Failed(Error::Config(format!(
                "sqlite: {} has schema version {other}; this coord-sqlite knows {SCHEMA_VERSION}",
                path.display()
            ))))
        }
    }
    tx.commit()
        .await
        .map_err(|e| open_error("cannot commit the schema of", e))?;
    let _ = conn.close().await;
    Ok(())
}
