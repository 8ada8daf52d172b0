//! Fenced writes of the caller's own rows, in SQL, in the caller's
//! transaction.
//!
//! A fence is the `u64` a coord lock or claim hands its holder (strictly
//! increasing per resource). A row that stores the highest fence that wrote
//! it refuses a holder whose fence is lower: a holder that lost its lease
//! (paused, partitioned) and still writes is stopped by the row itself,
//! whatever the clocks say. A table opts in with an `INTEGER` fence
//! column; [`FencedTable::update`] then runs, with every value bound:
//!
//! ```text
//! UPDATE <table> SET <your assignments>, <fence> = $fence
//!  WHERE <key> = $key AND (<fence> IS NULL OR <fence> <= $fence)
//! ```
//!
//! - an **equal** fence writes (one holder may write several times), a
//!   **higher** one writes and raises the row's fence, a **lower** one is
//!   refused and writes nothing ([`FencedWrite::Stale`], with the row's
//!   fence);
//! - no row with that key is [`FencedWrite::Missing`] (nothing is inserted:
//!   rows are created by your own `INSERT`, which knows every column the
//!   table requires; a fenced write then updates it);
//! - a `NULL` fence column counts as "no fence seen yet": any fence writes.
//!
//! It runs on any `&mut SqliteConnection`: [`InTransaction::conn`](crate::InTransaction::conn),
//! your own `sqlx::Transaction` (`&mut *tx`) or a plain connection. The
//! update and, when it wrote nothing, the read of the row's fence run in
//! one savepoint (a transaction of their own on a connection outside any),
//! so the fence reported is the one the refusal was decided on, and a
//! failed write leaves the caller's transaction as it was. Two holders
//! racing end with the higher fence's row whatever their order: SQLite has
//! one writer at a time, and a write always works on the newest committed
//! row (a transaction whose snapshot is older fails with `SQLITE_BUSY`,
//! [`Error::Unavailable`], instead of writing).
//!
//! Table and column names are checked (ASCII letters, digits, `_` and `$`,
//! not starting with a digit, at most 63 bytes; a table may be
//! `schema.table`) and quoted, so they are taken literally: an invalid one
//! is [`InvalidInput::Argument`], never part of any SQL.
//!
//! ```no_run
//! use coord_sqlite::fenced::{FencedTable, FencedWrite};
//! use coord_sqlite::InTransaction;
//!
//! # async fn demo(tx: std::sync::Arc<InTransaction>, fence: u64) -> coord_backend::Result<()> {
//! // CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, fence INTEGER)
//! let accounts = FencedTable::new("accounts", "id", "fence")?;
//! let outcome = accounts
//!     .update("acct-7", fence)?
//!     .set("balance", 120_i64)?
//!     .execute(&mut *tx.conn().await?)
//!     .await?;
//! match outcome {
//!     FencedWrite::Written => tx.commit().await?,
//!     FencedWrite::Stale { highest } => {
//!         println!("a newer holder ({highest}) wrote it: this one lost its lock");
//!         tx.rollback().await?;
//!     }
//!     FencedWrite::Missing => tx.rollback().await?,
//! }
//! # Ok(()) }
//! ```

use coord_backend::{Error, InvalidInput, Result};
use sqlx::sqlite::{SqliteArguments, SqliteConnection};
use sqlx::{Arguments, Connection, Encode, QueryBuilder, Sqlite, Type};

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

fn argument(message: String) -> Error {
    Error::InvalidInput(InvalidInput::Argument(format!("fenced write: {message}")))
}

/// `name` as a quoted identifier, or why it cannot be one.
fn identifier(what: &str, name: &str) -> Result<String> {
    let bad = |reason: &str| argument(format!("{what} {name:?} {reason}"));
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
    // Nothing in it needs escaping: quoting only lets it be a keyword.
    Ok(format!("\"{name}\""))
}

/// The error of a fenced write's statement (nothing was written).
fn failed(error: sqlx::Error) -> Error {
    match &error {
        // A table or column that is not there: fix the call.
        sqlx::Error::Database(db) if db.message().starts_with("no such") => {
            Error::Config(format!("fenced write: {db}"))
        }
        _ => Error::unavailable("fenced write refused by SQLite; nothing was written", error),
    }
}

impl FencedTable {
    /// `table` (or `schema.table`), whose rows are found by `key_column` and
    /// fenced by `fence_column` (an `INTEGER`). An invalid name is
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
            return Err(argument(format!(
                "the key column and the fence column are both {key_column:?}"
            )));
        }
        Ok(FencedTable { table, key, fence })
    }

    /// Start a fenced write of the row whose key column equals `key`, under
    /// `fence`; add assignments with [`FencedUpdate::set`]. A fence above
    /// `i64::MAX` (which an SQLite `INTEGER` cannot hold) is
    /// [`Error::InvalidInput`].
    pub fn update<'k, K>(&self, key: K, fence: u64) -> Result<FencedUpdate>
    where
        K: Encode<'k, Sqlite> + Type<Sqlite>,
    {
        let fence = i64::try_from(fence)
            .map_err(|_| argument(format!("fence {fence} is above the largest INTEGER")))?;
        // ?1 = the key, ?2 = the fence; the assignments' values follow.
        let mut values = SqliteArguments::default();
        values
            .add(key)
            .map_err(|e| argument(format!("the key cannot be encoded: {e}")))?;
        let key_only = values.clone();
        values
            .add(fence)
            .map_err(|e| argument(format!("the fence cannot be encoded: {e}")))?;
        Ok(FencedUpdate {
            table: self.clone(),
            values,
            key_only,
            columns: Vec::new(),
        })
    }
}

/// One fenced write being built: [`FencedTable::update`], then
/// [`set`](Self::set) per column, then [`execute`](Self::execute).
pub struct FencedUpdate {
    table: FencedTable,
    /// The key, the fence, then each assigned value.
    values: SqliteArguments,
    /// The key alone, for reading the fence of a row not written.
    key_only: SqliteArguments,
    /// The quoted columns assigned so far.
    columns: Vec<String>,
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
        T: Encode<'v, Sqlite> + Type<Sqlite>,
    {
        let quoted = identifier("column", column)?;
        if quoted == self.table.key || quoted == self.table.fence {
            return Err(argument(format!(
                "column {column:?} is the key or the fence column, \
                 which a fenced write sets itself"
            )));
        }
        if self.columns.contains(&quoted) {
            return Err(argument(format!("column {column:?} is assigned twice")));
        }
        self.values
            .add(value)
            .map_err(|e| argument(format!("the value of {column:?} cannot be encoded: {e}")))?;
        self.columns.push(quoted);
        Ok(self)
    }

    /// Run the write on `conn`: the `UPDATE`, and when it wrote nothing the
    /// read of the row's fence, in one savepoint (see the [module
    /// docs](self) for why the outcome is exact).
    ///
    /// Errors: a statement SQLite refused (`SQLITE_BUSY`, a constraint, a
    /// wrong type, …) is [`Error::Unavailable`] and wrote nothing (a missing
    /// table or column is [`Error::Config`]); on a connection outside any
    /// transaction, a `COMMIT` of a written row that failed otherwise than
    /// busy is [`Error::Indeterminate`].
    pub async fn execute(self, conn: &mut SqliteConnection) -> Result<FencedWrite> {
        let FencedTable { table, key, fence } = &self.table;
        let assignments: String = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, column)| format!("{column} = ?{}, ", i + 3))
            .collect();
        let update = format!(
            "UPDATE {table} SET {assignments}{fence} = ?2 \
             WHERE {key} = ?1 AND ({fence} IS NULL OR {fence} <= ?2) RETURNING 1"
        );
        // A savepoint inside the caller's transaction, a transaction of its
        // own on a connection outside any: the write and the read of the
        // fence that refused it see the same row, and a failure undoes
        // exactly this write.
        let mut tx = conn.begin().await.map_err(failed)?;
        let written = QueryBuilder::<Sqlite>::with_arguments(update, self.values)
            .build()
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?
            .is_some();
        let outcome = if written {
            FencedWrite::Written
        } else {
            let read = format!("SELECT {fence} FROM {table} WHERE {key} = ?1");
            let highest: Option<Option<i64>> =
                QueryBuilder::<Sqlite>::with_arguments(read, self.key_only)
                    .build_query_scalar()
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(failed)?;
            match highest {
                None => FencedWrite::Missing,
                Some(highest) => {
                    let highest = highest.unwrap_or(0);
                    FencedWrite::Stale {
                        highest: u64::try_from(highest).map_err(|_| {
                            Error::malformed(
                                format!("<fenced row of {table}>"),
                                format!("fence {highest} is negative"),
                            )
                        })?,
                    }
                }
            }
        };
        match tx.commit().await {
            Ok(()) => Ok(outcome),
            // Only on a connection outside any transaction is this a
            // COMMIT of the write (inside one it is a RELEASE of the
            // savepoint, which keeps it in the caller's transaction).
            Err(e) if written && !crate::is_busy(&e) => Err(Error::indeterminate(
                format!("fenced write: COMMIT of the write of {table} failed"),
                e,
            )),
            Err(e) => Err(failed(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        let t = FencedTable::new("main.Orders", "id", "fence").unwrap();
        assert_eq!(t.table, "\"main\".\"Orders\"");
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
