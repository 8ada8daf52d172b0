//! Fenced writes of your own rows: write a row only while your fencing
//! token (the `u64` of a coord lock, lease or claim) is at least the
//! highest one the row has seen, in the same transaction as whatever else
//! you write.
//!
//! A table opts in with a `bigint` fence column; [`FencedTable::update`]
//! then runs, semantically,
//!
//! ```text
//! UPDATE <table> SET <your assignments>, <fence> = $fence
//!  WHERE <key> = $key AND (<fence> IS NULL OR <fence> <= $fence)
//! ```
//!
//! - an equal fence writes (one holder may write several times);
//! - a lower one writes nothing: [`FencedWrite::Stale`] with the row's fence;
//! - no row with that key: [`FencedWrite::Missing`] (nothing is inserted:
//!   rows are created by your own `INSERT`, which knows every column the
//!   table requires; a fenced write then updates it);
//! - a NULL fence column counts as "no fence seen yet": any fence writes.
//!
//! Values are bound parameters ([`sqlx::QueryBuilder`]); table and column
//! names are checked (ASCII letters, digits, `_` and `$`, not starting with a
//! digit, at most 63 bytes; a table may be `schema.table`) and quoted, so
//! they are taken literally, case included: an invalid one is
//! [`Error::InvalidInput`], never part of any SQL.
//!
//! It runs on any `&mut PgConnection`: [`crate::InTransaction::conn`], your
//! own transaction, or an autocommit connection. At READ COMMITTED the
//! check is exact: see [`FencedUpdate::execute`]. At REPEATABLE READ or
//! SERIALIZABLE a row changed by a concurrent transaction after yours began
//! fails with a serialization failure ([`Error::Unavailable`]: retry the
//! transaction).
//!
//! ```no_run
//! use coord_postgres::fenced::{FencedTable, FencedWrite};
//! use coord_postgres::InTransaction;
//!
//! # async fn demo(tx: &InTransaction, fence: u64) -> coord_backend::Result<()> {
//! // CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL, fence bigint)
//! let orders = FencedTable::new("orders", "id", "fence")?;
//! let outcome = orders
//!     .update("order-17", fence)?
//!     .set("status", "shipped")?
//!     .execute(&mut *tx.conn().await?)
//!     .await?;
//! match outcome {
//!     FencedWrite::Written => {}
//!     FencedWrite::Stale { highest } => println!("a newer holder ({highest}) wrote it"),
//!     FencedWrite::Missing => println!("no such order"),
//! }
//! # Ok(())
//! # }
//! ```

use coord_backend::{Error, InvalidInput, Result};
use sqlx::{Encode, PgConnection, Postgres, QueryBuilder, Row, Type};

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FencedWrite {
    /// The row was written and its fence set to the caller's.
    Written,
    /// The row has seen a higher fence; nothing was written.
    Stale {
        /// The row's fence.
        highest: u64,
    },
    /// No row has that key; nothing was written.
    Missing,
}

/// A table whose rows are written fenced: its (quoted) name, key column and
/// fence column.
#[derive(Clone, Debug)]
pub struct FencedTable {
    table: String,
    key: String,
    fence: String,
}

/// `name` as a quoted identifier, or why it cannot be one.
fn identifier(what: &str, name: &str) -> Result<String> {
    let bad = |reason: &str| {
        Error::InvalidInput(InvalidInput::Argument(format!(
            "fenced write: {what} {name:?} {reason}"
        )))
    };
    if name.is_empty() || name.len() > 63 {
        return Err(bad("must be 1 to 63 bytes long"));
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad("must not start with a digit"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    {
        return Err(bad("may hold only ASCII letters, digits, '_' and '$'"));
    }
    // Nothing in it needs escaping: quoting only keeps its case and lets
    // it be a reserved word.
    Ok(format!("\"{name}\""))
}

impl FencedTable {
    /// `table` (or `schema.table`), whose rows are found by `key_column` and
    /// fenced by `fence_column` (a `bigint`). Names are taken literally
    /// (quoted), so `Orders` and `orders` differ; an invalid one is
    /// [`Error::InvalidInput`].
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self> {
        let table = match table.split_once('.') {
            Some((schema, name)) => format!(
                "{}.{}",
                identifier("schema", schema)?,
                identifier("table", name)?
            ),
            None => identifier("table", table)?,
        };
        let key = identifier("key column", key_column)?;
        let fence = identifier("fence column", fence_column)?;
        if key == fence {
            return Err(Error::InvalidInput(InvalidInput::Argument(format!(
                "fenced write: the key column and the fence column are both {key_column:?}"
            ))));
        }
        Ok(FencedTable { table, key, fence })
    }

    /// Start a fenced write of the row whose key column equals `key`, under
    /// `fence`; add assignments with [`FencedUpdate::set`]. A fence above
    /// `i64::MAX` (which a `bigint` cannot hold) is [`Error::InvalidInput`].
    pub fn update<'k, K>(&self, key: K, fence: u64) -> Result<FencedUpdate>
    where
        K: Encode<'k, Postgres> + Type<Postgres> + 'k,
    {
        let fence = i64::try_from(fence).map_err(|_| {
            Error::InvalidInput(InvalidInput::Argument(format!(
                "fenced write: fence {fence} is above the largest bigint"
            )))
        })?;
        // $1 = the key, $2 = the fence; the assignments' values follow.
        let mut sql = QueryBuilder::new(format!(
            "WITH cur AS MATERIALIZED (SELECT {fence} AS fence FROM {table} WHERE {key} = ",
            fence = self.fence,
            table = self.table,
            key = self.key,
        ));
        sql.push_bind(key);
        sql.push(" AND ");
        sql.push_bind(fence);
        sql.push(format!(
            "::bigint IS NOT NULL FOR NO KEY UPDATE), u AS (UPDATE {table} SET ",
            table = self.table
        ));
        Ok(FencedUpdate {
            table: self.clone(),
            sql,
            columns: Vec::new(),
            unprepared: false,
        })
    }
}

/// One fenced write being built: [`FencedTable::update`], then
/// [`set`](Self::set) per column, then [`execute`](Self::execute).
pub struct FencedUpdate {
    table: FencedTable,
    sql: QueryBuilder<Postgres>,
    /// The quoted columns assigned so far.
    columns: Vec<String>,
    /// Sent as an unnamed statement (see [`FencedUpdate::unprepared`]).
    unprepared: bool,
}

impl std::fmt::Debug for FencedUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values (they may be secrets).
        f.debug_struct("FencedUpdate")
            .field("table", &self.table)
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl FencedUpdate {
    /// Assign `value` (a bound parameter) to `column`. The key column, the
    /// fence column, a column assigned twice or an invalid name is
    /// [`Error::InvalidInput`].
    pub fn set<'v, T>(mut self, column: &str, value: T) -> Result<Self>
    where
        T: Encode<'v, Postgres> + Type<Postgres> + 'v,
    {
        let quoted = identifier("column", column)?;
        if quoted == self.table.key || quoted == self.table.fence {
            return Err(Error::InvalidInput(InvalidInput::Argument(format!(
                "fenced write: column {column:?} is the key or the fence column, \
                 which a fenced write sets itself"
            ))));
        }
        if self.columns.contains(&quoted) {
            return Err(Error::InvalidInput(InvalidInput::Argument(format!(
                "fenced write: column {column:?} is assigned twice"
            ))));
        }
        self.sql.push(format!("{quoted} = "));
        self.sql.push_bind(value);
        self.sql.push(", ");
        self.columns.push(quoted);
        Ok(self)
    }

    /// Send the statement unnamed instead of prepared and cached on the
    /// connection (sqlx's `.persistent(false)`: one more round trip). For a
    /// transaction behind a pooler that lends a server session per
    /// transaction and keeps no prepared statements per client (PgBouncer
    /// `pool_mode = transaction` before 1.21): the transaction keeps its
    /// session, but a cached statement would be looked for on another
    /// session in a later one. Outside a transaction such a pooler may
    /// switch sessions within the statement: use it inside one.
    pub fn unprepared(mut self) -> Self {
        self.unprepared = true;
        self
    }

    /// Run the write on `conn`, in one statement.
    ///
    /// The statement first locks the row (`SELECT … FOR NO KEY UPDATE`),
    /// then updates it when its fence is at most the caller's. Why that is
    /// exact at READ COMMITTED: a row lock waits for a concurrent writer of
    /// the row to end and then returns the row's *latest committed* version
    /// (not the one of the statement's snapshot), and the `UPDATE` that
    /// follows finds the row changed since its snapshot and re-checks its
    /// `WHERE` on that same latest version (EvalPlanQual), which nobody can
    /// change any more: this transaction holds the lock. So two writers with
    /// different fences take turns, and whichever order they commit in, the
    /// row ends with the higher one's values; the fence read is the one the
    /// decision was made on.
    ///
    /// Errors: a statement the server refused (SQLSTATE class 40, a wrong
    /// type, …) is [`Error::Unavailable`] (inside a transaction the server
    /// aborted it); undefined tables and columns, and a prepared statement
    /// a transaction pooler lost (see [`FencedUpdate::unprepared`]), are
    /// [`Error::Config`]; a connection lost after sending is
    /// [`Error::Indeterminate`] on an autocommit connection (the write may
    /// have committed; inside a transaction it rolled back).
    pub async fn execute(mut self, conn: &mut PgConnection) -> Result<FencedWrite> {
        self.sql.push(format!(
            "{fence} = $2 WHERE {key} = $1 AND ({fence} IS NULL OR {fence} <= $2) \
             AND EXISTS (SELECT 1 FROM cur) RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM cur), (SELECT fence FROM cur)::bigint, \
             EXISTS (SELECT 1 FROM u)",
            fence = self.table.fence,
            key = self.table.key,
        ));
        let row = self
            .sql
            .build()
            .persistent(!self.unprepared)
            .fetch_one(conn)
            .await
            .map_err(failed)?;
        let read = |e: sqlx::Error| Error::malformed("<fenced write row>", e.to_string());
        let found: bool = row.try_get(0).map_err(read)?;
        let highest: Option<i64> = row.try_get(1).map_err(read)?;
        let written: bool = row.try_get(2).map_err(read)?;
        Ok(match (found, written) {
            (false, _) => FencedWrite::Missing,
            (true, true) => FencedWrite::Written,
            (true, false) => FencedWrite::Stale {
                highest: highest.map_or(0, i64::unsigned_abs),
            },
        })
    }
}

/// The error of a fenced write's statement.
fn failed(error: sqlx::Error) -> Error {
    match &error {
        sqlx::Error::Database(db)
            if matches!(db.code().as_deref(), Some("42P01" | "42703" | "3F000")) =>
        {
            Error::Config(format!("fenced write: {db}"))
        }
        // A prepared statement's name met on a server session shared with
        // other clients: nothing ran.
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("26000" | "42P05")) => {
            Error::Config(format!(
                "fenced write: {db}: a pooler shares server sessions between clients; behind \
                 PgBouncer in pool_mode = transaction before 1.21, send it `unprepared()` inside \
                 a transaction"
            ))
        }
        sqlx::Error::Database(_) => Error::unavailable(
            "fenced write refused by PostgreSQL; nothing was written",
            error,
        ),
        _ => Error::indeterminate(
            "fenced write: the connection failed after the statement was sent; on an autocommit \
             connection it may have been applied (inside a transaction, it rolled back)",
            error,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        let t = FencedTable::new("app.Orders", "id", "fence").unwrap();
        assert_eq!(t.table, "\"app\".\"Orders\"");
        for bad in [
            "",
            "1x",
            "a b",
            "x\"y",
            "a;b",
            "a.b.c",
            "é",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(
                    FencedTable::new(bad, "id", "fence"),
                    Err(Error::InvalidInput(InvalidInput::Argument(_)))
                ),
                "{bad:?}"
            );
        }
        assert!(FencedTable::new("t", "id", "id").is_err());
        let update = t.update("k", 1).unwrap();
        assert!(update.set("fence", 1_i64).is_err());
        let update = t.update("k", 1).unwrap().set("status", "x").unwrap();
        assert!(update.set("status", "y").is_err());
        assert!(t.update("k", u64::MAX).is_err());
    }
}
