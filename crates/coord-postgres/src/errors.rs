//! Mapping sqlx errors onto coord's outcome-named errors.

use coord_backend::Error;

/// An error while getting a connection (or opening one): nothing was sent.
pub(crate) fn before_sending(what: &str, error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::Configuration(e) => Error::Config(format!("{what}: {e}")),
        other => Error::unavailable(format!("{what}: PostgreSQL unreachable"), other),
    }
}

/// SQLSTATEs `invalid_sql_statement_name` (26000) and
/// `duplicate_prepared_statement` (42P05): a statement this client prepared
/// on its session is missing there, or a name it never used is taken. A
/// server session of its own never does that; one a transaction pooler
/// shares with other clients does.
const SHARED_SESSION_CODES: [&str; 2] = ["26000", "42P05"];

/// Whether `error` shows a server session shared with other clients.
pub(crate) fn shows_shared_session(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|c| SHARED_SESSION_CODES.contains(&c.as_ref())))
}

/// The error for a session-mode client that found its server session
/// shared (see [`shows_shared_session`]); the statement never ran.
pub(crate) fn shared_session(what: &str, cause: &dyn std::fmt::Display) -> Error {
    Error::Config(format!(
        "{what}: {cause}: a pooler shares server sessions between clients \
         (PgBouncer pool_mode = transaction) and this client prepared statements on them: \
         add pooler=transaction to the URL (connect's probe for such a pooler can miss it \
         under load) or use pool_mode = session; nothing was applied"
    ))
}

/// An error of a read-only statement (snapshot, keys): retrying is always safe.
pub(crate) fn read(what: &str, error: sqlx::Error) -> Error {
    if shows_shared_session(&error) {
        return shared_session(what, &error);
    }
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
    if shows_shared_session(&error) {
        return shared_session("reclaim", &error);
    }
    if let sqlx::Error::Database(db) = &error {
        if db.code().as_deref() == Some(ISOLATION_REFUSED) {
            return Error::Config(format!("reclaim refused: {db}"));
        }
    }
    Error::unavailable("reclaim failed", error)
}

/// SQLSTATE `read_only_sql_transaction`: a write sent to a standby (or a
/// session with `default_transaction_read_only`); nothing was applied.
pub(crate) const READ_ONLY_TRANSACTION: &str = "25006";

/// The SQLSTATE `coord_txn` raises when called at another isolation level
/// than READ COMMITTED (see [`crate::schema`]).
pub(crate) const ISOLATION_REFUSED: &str = "CO001";

/// Whether an error response says the server session went away rather than
/// that the statement failed: a connection exception (class 08: PgBouncer
/// reports a server that died mid-transaction as `08P01` "server conn
/// crashed?" on the client connection it keeps open) or a shutdown
/// terminating the session (57P01, 57P02). PostgreSQL holds a statement's
/// results (CommandComplete included) until the end of the message, so
/// none having arrived proves nothing: the COMMIT may have run, and with a
/// synchronous standby reached it, before the session died.
fn connection_gone(code: Option<&str>) -> bool {
    code.is_some_and(|c| c.starts_with("08") || c == "57P01" || c == "57P02")
}

/// An error of the txn statement. `completed` = the server had already sent
/// CommandComplete, i.e. the function had run to its end.
///
/// With the extended protocol an autocommit statement commits when the server
/// processes the `Sync` that follows `Execute`, after CommandComplete. So:
/// - an error *response* before CommandComplete means the statement failed and
///   its transaction rolled back: nothing applied → `Unavailable` (retry is safe),
///   unless it says the session went away ([`connection_gone`]): `Indeterminate`;
/// - an error response after CommandComplete arose in or after the implicit
///   COMMIT, and a lost connection (I/O error, closed socket, protocol garbage)
///   at any point leaves the commit unknown → `Indeterminate`.
/// - a transaction-rollback error (SQLSTATE class 40) is the server saying it
///   rolled back, before or at COMMIT: nothing applied → `Unavailable`;
/// - `CO001` is `coord_txn` refusing an isolation level other than READ
///   COMMITTED: a configuration error, nothing applied → `Config`; so are
///   a missing or duplicate prepared statement (26000, 42P05, at Parse or
///   Bind: nothing ran), a server session shared by a transaction pooler.
pub(crate) fn txn(error: sqlx::Error, completed: bool) -> Error {
    if shows_shared_session(&error) && !completed {
        return shared_session("txn", &error);
    }
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
        sqlx::Error::Database(db) if !completed && !connection_gone(db.code().as_deref()) => {
            Error::unavailable("txn rejected by PostgreSQL; nothing was applied", db)
        }
        sqlx::Error::Database(db) if !completed => Error::indeterminate(
            "the server connection went away while the txn ran (reported by a pooler or a \
             shutting-down server); it may have committed before",
            db,
        ),
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

/// SQLSTATEs `undefined_function` (42883) and `undefined_table` (42P01):
/// the coord schema is not in this database (or not on the session's
/// `search_path`).
const SCHEMA_MISSING_CODES: [&str; 2] = ["42883", "42P01"];

/// SQLSTATE `in_failed_sql_transaction`: an earlier statement of the
/// transaction failed, so the server refuses every statement until ROLLBACK.
pub(crate) const TRANSACTION_ABORTED: &str = "25P02";

/// An error of a statement run inside the caller's transaction
/// ([`crate::InTransaction`]). Never `Indeterminate`: whatever happened,
/// nothing is committed before the caller's COMMIT, and a statement that
/// failed aborted the transaction (the server refuses every later statement
/// with 25P02 and turns its COMMIT into a ROLLBACK); a broken connection
/// rolls it back. So the caller retries the whole transaction:
/// - SQLSTATE class 40 (serialization failure, deadlock between two
///   transactions taking coord keys in different orders):
///   [`Error::Unavailable`];
/// - `CO001` (`coord_txn` refuses an isolation level other than READ
///   COMMITTED) and a missing schema (42883, 42P01): [`Error::Config`]
///   naming the fix;
/// - a prepared statement the session lacks or holds under another client's
///   name (a transaction pooler): [`Error::Config`] (see [`shared_session`]);
/// - anything else, a lost connection included: [`Error::Unavailable`].
pub(crate) fn in_transaction(what: &str, error: sqlx::Error) -> Error {
    if shows_shared_session(&error) {
        return Error::Config(format!(
            "{what} in the caller's transaction: {error}: a pooler shares server sessions \
             between clients and this statement was prepared on another one: behind PgBouncer \
             in pool_mode = transaction, set max_prepared_statements (PgBouncer 1.21+) or use \
             pool_mode = session; the transaction is aborted"
        ));
    }
    let code = match &error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    match code.as_deref() {
        Some(c) if c.starts_with("40") => Error::unavailable(
            format!(
                "{what} in the caller's transaction: PostgreSQL rolled the transaction back \
                 (serialization failure or deadlock); retry the whole transaction"
            ),
            error,
        ),
        Some(ISOLATION_REFUSED) => Error::Config(format!(
            "{what} in the caller's transaction: {error}: coord_txn runs at READ COMMITTED only; \
             begin the transaction with BEGIN ISOLATION LEVEL READ COMMITTED \
             (InTransaction::begin does); the transaction is aborted"
        )),
        Some(c) if SCHEMA_MISSING_CODES.contains(&c) => Error::Config(format!(
            "{what} in the caller's transaction: {error}: the coord schema is missing in this \
             database (or not on the search_path): connect a PostgresBackend once to create \
             the schema; the transaction is aborted"
        )),
        Some(TRANSACTION_ABORTED) => Error::unavailable(
            format!(
                "{what} in the caller's transaction: an earlier statement of the transaction \
                 failed, so PostgreSQL refuses every statement until ROLLBACK; roll back and \
                 retry the whole transaction"
            ),
            error,
        ),
        Some(_) => Error::unavailable(
            format!(
                "{what} in the caller's transaction failed; the transaction is aborted, \
                 roll back and retry it"
            ),
            error,
        ),
        None => Error::unavailable(
            format!(
                "{what} in the caller's transaction: the connection failed, which rolls the \
                 transaction back; retry the whole transaction"
            ),
            error,
        ),
    }
}

/// An error of the caller's COMMIT ([`crate::InTransaction::commit`]):
/// an error response is the server refusing it (it rolled back:
/// [`Error::Unavailable`]) unless it says the session went away
/// ([`connection_gone`]); a lost connection after sending leaves the commit
/// unknown: [`Error::Indeterminate`].
pub(crate) fn commit(error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::Database(db) if !connection_gone(db.code().as_deref()) => Error::unavailable(
            "COMMIT refused by PostgreSQL: the transaction rolled back; nothing of it \
                 was applied, retry the whole transaction",
            db,
        ),
        other => Error::indeterminate(
            "the connection failed after COMMIT was sent: the transaction may or may not \
             have committed; re-read to learn which",
            other,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::connection_gone;

    #[test]
    fn a_session_gone_is_not_a_statement_failure() {
        // PgBouncer's "server conn crashed?", a connection failure, shutdowns.
        for code in ["08P01", "08006", "08003", "57P01", "57P02"] {
            assert!(connection_gone(Some(code)), "{code}");
        }
        // The statement itself failed: nothing applied.
        for code in ["40001", "40P01", "23505", "22P02", "25006", "57014"] {
            assert!(!connection_gone(Some(code)), "{code}");
        }
        assert!(!connection_gone(None));
    }
}
