//! Mapping sqlx errors onto coord's outcome-named errors.

use coord_backend::Error;

/// An error while getting a connection (or opening one): nothing was sent.
pub(crate) fn before_sending(what: &str, error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::Configuration(e) => Error::Config(format!("{what}: {e}")),
        other => Error::unavailable(format!("{what}: PostgreSQL unreachable"), other),
    }
}

/// An error of a read-only statement (snapshot, keys): retrying is always safe.
pub(crate) fn read(what: &str, error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            Error::malformed(format!("<{what} row>"), error.to_string())
        }
        other => Error::unavailable(format!("{what} failed"), other),
    }
}

/// An error of `coord_reclaim`. Whatever happened, nothing a reader can see
/// changed (a reclaim only removes what reads as missing and raises the
/// floor with it), so an unknown outcome is just "try again later".
pub(crate) fn reclaim(error: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &error {
        if db.code().as_deref() == Some(ISOLATION_REFUSED) {
            return Error::Config(format!("reclaim refused: {db}"));
        }
    }
    Error::unavailable("reclaim failed", error)
}

/// The SQLSTATE `coord_txn` raises when called at another isolation level
/// than READ COMMITTED (see [`crate::schema`]).
pub(crate) const ISOLATION_REFUSED: &str = "CO001";

/// An error of the txn statement. `completed` = the server had already sent
/// CommandComplete, i.e. the function had run to its end.
///
/// With the extended protocol an autocommit statement commits when the server
/// processes the `Sync` that follows `Execute`, after CommandComplete. So:
/// - an error *response* before CommandComplete means the statement failed and
///   its transaction rolled back: nothing applied → `Unavailable` (retry is safe);
/// - an error response after CommandComplete arose in or after the implicit
///   COMMIT, and a lost connection (I/O error, closed socket, protocol garbage)
///   at any point leaves the commit unknown → `Indeterminate`.
/// - a transaction-rollback error (SQLSTATE class 40) is the server saying it
///   rolled back, before or at COMMIT: nothing applied → `Unavailable`;
/// - `CO001` is `coord_txn` refusing an isolation level other than READ
///   COMMITTED: a configuration error, nothing applied → `Config`.
pub(crate) fn txn(error: sqlx::Error, completed: bool) -> Error {
    match error {
        sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("40")) => {
            Error::unavailable(
                "txn rolled back by PostgreSQL (serialization failure or deadlock); \
                 nothing was applied, retrying is safe",
                db,
            )
        }
        sqlx::Error::Database(db) if db.code().as_deref() == Some(ISOLATION_REFUSED) => {
            Error::Config(format!(
                "coord_txn refused to run: {db} (it needs READ COMMITTED; nothing was applied)"
            ))
        }
        sqlx::Error::Database(db) if !completed => {
            Error::unavailable("txn rejected by PostgreSQL; nothing was applied", db)
        }
        sqlx::Error::Database(db) => Error::indeterminate(
            "txn failed at COMMIT; it may or may not have been applied",
            db,
        ),
        other => Error::indeterminate(
            "connection lost after the txn was sent; it may or may not have been applied",
            other,
        ),
    }
}
