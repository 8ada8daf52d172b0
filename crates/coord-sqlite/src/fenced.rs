//! Fenced writes of the caller's own rows, in SQL, in the caller's
//! transaction.
//!
//! A fence is the `u64` a coord lock or claim hands its holder (strictly
//! increasing per resource). A row that stores the highest fence that wrote
//! it refuses a holder whose fence is lower: a holder that lost its lease
//! (paused, partitioned) and still writes is stopped by the row itself,
//! whatever the clocks say. [`FencedRow::update`] is, with every value bound:
//!
//! ```sql
//! UPDATE "table" SET "col" = ?, …, "fence" = :fence
//!  WHERE "key" = :key AND ifnull("fence", 0) <= :fence
//! ```
//!
//! - an **equal** fence writes (one holder may write several times), a
//!   **higher** one writes and raises the row's fence, a **lower** one is
//!   refused and writes nothing ([`FencedWrite::Stale`], with the row's
//!   fence);
//! - no row with that key is [`FencedWrite::Missing`] (nothing written);
//!   [`FencedRow::upsert`] inserts it instead (`INSERT … ON CONFLICT (key)
//!   DO UPDATE … WHERE fence <= :fence`, which needs a `PRIMARY KEY` or
//!   `UNIQUE` constraint on the key column);
//! - a `NULL` fence column counts as 0 (never written by a holder); make it
//!   `INTEGER NOT NULL DEFAULT 0`.
//!
//! It runs on any `&mut SqliteConnection`: [`InTransaction::conn`](crate::InTransaction::conn),
//! the caller's own `sqlx::Transaction` (`&mut *tx`) or a plain connection.
//! The update and, when it wrote nothing, the read of the row's fence run
//! in one savepoint (a transaction of their own on a connection outside
//! any), so the answer is exact, and a failed write leaves the caller's
//! transaction as it was. SQLite has one writer at a time, and a write
//! always reads the newest committed row (a transaction whose snapshot is
//! older fails with `SQLITE_BUSY` instead), so two holders racing end with
//! the higher fence's row whatever their order.
//!
//! Table and column names are validated (ASCII letters, digits and `_`, not
//! starting with a digit; the table may be `schema.table`) and quoted;
//! anything else is [`InvalidInput::Argument`], never put in the SQL.
//!
//! ```no_run
//! use coord_sqlite::fenced::{FencedRow, FencedWrite};
//! use coord_sqlite::InTransaction;
//!
//! # async fn demo(tx: std::sync::Arc<InTransaction>, fence: u64) -> coord_backend::Result<()> {
//! // CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER, fence INTEGER NOT NULL DEFAULT 0)
//! let outcome = FencedRow::new("accounts", "id", "fence")?
//!     .set("balance", 120_i64)?
//!     .update(&mut *tx.conn().await?, "acct-7", fence)
//!     .await?;
//! match outcome {
//!     FencedWrite::Written => tx.commit().await?,
//!     FencedWrite::Stale { highest } => {
//!         // A newer holder (fence `highest`) wrote the row: this one lost its lock.
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
#[must_use]
pub enum FencedWrite {
    /// The row was written and its fence column holds the caller's fence.
    Written,
    /// The row's fence is higher than the caller's: nothing was written.
    Stale {
        /// The row's fence (a newer holder's).
        highest: u64,
    },
    /// No row has that key ([`FencedRow::update`] only): nothing was written.
    Missing,
}

/// A fenced write of one row, built column by column (see the [module
/// docs](self)). Values are bound, never formatted into the SQL; `Debug`
/// shows the names only.
pub struct FencedRow {
    table: String,
    key_column: String,
    fence_column: String,
    columns: Vec<String>,
    names: Vec<String>,
    values: SqliteArguments,
}

impl std::fmt::Debug for FencedRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedRow")
            .field("table", &self.table)
            .field("key_column", &self.key_column)
            .field("fence_column", &self.fence_column)
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

fn argument(message: String) -> Error {
    Error::InvalidInput(InvalidInput::Argument(format!("fenced write: {message}")))
}

/// `name` double-quoted when it is a plain identifier; `qualified` allows
/// one `schema.` in front.
fn quote(what: &str, name: &str, qualified: bool) -> Result<String> {
    let parts: Vec<&str> = if qualified {
        name.splitn(2, '.').collect()
    } else {
        vec![name]
    };
    let plain = |part: &str| {
        !part.is_empty()
            && part.len() <= 128
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !part.as_bytes()[0].is_ascii_digit()
    };
    if !parts.iter().all(|p| plain(p)) {
        return Err(argument(format!(
            "{what} {name:?} is not a plain SQL identifier \
             (ASCII letters, digits and _, not starting with a digit)"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

fn sql_error(table: &str, error: sqlx::Error) -> Error {
    match &error {
        // A table, column or constraint that is not there: fix the call.
        sqlx::Error::Database(db)
            if db.message().starts_with("no such")
                || db
                    .message()
                    .contains("does not match any PRIMARY KEY or UNIQUE") =>
        {
            Error::Config(format!("sqlite: fenced write of {table}: {error}"))
        }
        _ => Error::unavailable(format!("sqlite: fenced write of {table}"), error),
    }
}

impl FencedRow {
    /// A fenced write of a row of `table`, found by `key_column`, guarded by
    /// `fence_column` (an `INTEGER` column holding the highest fence that
    /// wrote the row).
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self> {
        let row = FencedRow {
            table: quote("table", table, true)?,
            key_column: quote("key column", key_column, false)?,
            fence_column: quote("fence column", fence_column, false)?,
            columns: Vec::new(),
            names: vec![key_column.to_owned(), fence_column.to_owned()],
            values: SqliteArguments::default(),
        };
        if key_column == fence_column {
            return Err(argument(format!(
                "the key column and the fence column are both {key_column:?}"
            )));
        }
        Ok(row)
    }

    /// Also write `value` into `column` (a column named twice, or the key
    /// or fence column, is refused).
    pub fn set<'v, T>(mut self, column: &str, value: T) -> Result<Self>
    where
        T: Encode<'v, Sqlite> + Type<Sqlite>,
    {
        let quoted = quote("column", column, false)?;
        if self.names.iter().any(|n| n == column) {
            return Err(argument(format!(
                "column {column:?} is written twice (or is the key or fence column)"
            )));
        }
        self.values
            .add(value)
            .map_err(|e| argument(format!("the value of {column:?} cannot be encoded: {e}")))?;
        self.names.push(column.to_owned());
        self.columns.push(quoted);
        Ok(self)
    }

    /// `UPDATE` the row whose key column is `key`, if its fence is at most
    /// `fence`: [`FencedWrite::Written`], [`Stale`](FencedWrite::Stale) or
    /// [`Missing`](FencedWrite::Missing).
    pub async fn update<'k, K>(
        self,
        conn: &mut SqliteConnection,
        key: K,
        fence: u64,
    ) -> Result<FencedWrite>
    where
        K: Encode<'k, Sqlite> + Type<Sqlite> + Clone,
    {
        let n = self.columns.len();
        // ?1..?n: the values, ?(n+1): the key, ?(n+2): the fence.
        let mut sql = format!("UPDATE {} SET ", self.table);
        for (i, column) in self.columns.iter().enumerate() {
            sql.push_str(&format!("{column} = ?{}, ", i + 1));
        }
        let (k, f) = (n + 1, n + 2);
        sql.push_str(&format!(
            "{fence} = ?{f} WHERE {key} = ?{k} AND ifnull({fence}, 0) <= ?{f} RETURNING 1",
            fence = self.fence_column,
            key = self.key_column,
        ));
        self.run(conn, sql, key, fence, true).await
    }

    /// `INSERT` the row (key, values, fence), or, when a row with that key
    /// exists, update it if its fence is at most `fence`:
    /// [`FencedWrite::Written`] or [`Stale`](FencedWrite::Stale), never
    /// `Missing`. The key column needs a `PRIMARY KEY` or `UNIQUE`
    /// constraint (else [`Error::Config`]).
    pub async fn upsert<'k, K>(
        self,
        conn: &mut SqliteConnection,
        key: K,
        fence: u64,
    ) -> Result<FencedWrite>
    where
        K: Encode<'k, Sqlite> + Type<Sqlite> + Clone,
    {
        let n = self.columns.len();
        let f = n + 2;
        let (fence_column, key_column) = (&self.fence_column, &self.key_column);
        let mut columns = self.columns.clone();
        columns.push(key_column.clone());
        columns.push(fence_column.clone());
        let placeholders = (1..=n + 2)
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut updates: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        updates.push(format!("{fence_column} = excluded.{fence_column}"));
        // In DO UPDATE, a bare column is the existing row's.
        let sql = format!(
            "INSERT INTO {table} ({columns}) VALUES ({placeholders}) \
             ON CONFLICT ({key_column}) DO UPDATE SET {updates} \
             WHERE ifnull({fence_column}, 0) <= ?{f} RETURNING 1",
            table = self.table,
            columns = columns.join(", "),
            updates = updates.join(", "),
        );
        self.run(conn, sql, key, fence, false).await
    }

    async fn run<'k, K>(
        self,
        conn: &mut SqliteConnection,
        sql: String,
        key: K,
        fence: u64,
        may_be_missing: bool,
    ) -> Result<FencedWrite>
    where
        K: Encode<'k, Sqlite> + Type<Sqlite> + Clone,
    {
        let fence = i64::try_from(fence)
            .map_err(|_| argument(format!("fence {fence} does not fit an SQLite INTEGER")))?;
        let encode = |e| argument(format!("the key cannot be encoded: {e}"));
        let mut values = self.values;
        values.add(key.clone()).map_err(encode)?;
        values.add(fence).map_err(|e| argument(format!("{e}")))?;
        let mut key_only = SqliteArguments::default();
        key_only.add(key).map_err(encode)?;
        let table = self.table;

        // A savepoint inside the caller's transaction, a transaction of its
        // own on a connection outside any: the write and the read of the
        // fence that refused it see the same row, and a failure undoes
        // exactly this write.
        let mut tx = conn.begin().await.map_err(|e| sql_error(&table, e))?;
        let written = QueryBuilder::<Sqlite>::with_arguments(sql, values)
            .build()
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| sql_error(&table, e))?
            .is_some();
        let outcome = if written {
            FencedWrite::Written
        } else {
            let highest: Option<Option<i64>> = QueryBuilder::<Sqlite>::with_arguments(
                format!(
                    "SELECT {} FROM {table} WHERE {} = ?1",
                    self.fence_column, self.key_column
                ),
                key_only,
            )
            .build_query_scalar()
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| sql_error(&table, e))?;
            match highest {
                None if may_be_missing => FencedWrite::Missing,
                Some(highest) => {
                    let highest = highest.unwrap_or(0);
                    FencedWrite::Stale {
                        highest: u64::try_from(highest).map_err(|_| {
                            Error::malformed(
                                format!("{table} row"),
                                format!("fence {highest} is negative"),
                            )
                        })?,
                    }
                }
                // The upsert neither inserted nor found a row: only a
                // constraint that ignores conflicts can do that.
                None => {
                    return Err(Error::Config(format!(
                        "sqlite: fenced upsert of {table} wrote nothing and found no row"
                    )))
                }
            }
        };
        match tx.commit().await {
            Ok(()) => Ok(outcome),
            // Only on a connection outside any transaction is this a
            // COMMIT of the write (inside one it is a RELEASE of the
            // savepoint, which keeps it in the caller's transaction).
            Err(e) if written && !crate::is_busy(&e) => Err(Error::indeterminate(
                format!("sqlite: COMMIT of the fenced write of {table} failed"),
                e,
            )),
            Err(e) => Err(sql_error(&table, e)),
        }
    }
}
