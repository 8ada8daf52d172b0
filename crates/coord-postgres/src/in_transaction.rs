//! [`InTransaction`]: a coord store bound to one open transaction of the
//! caller's pool (crate docs, "In the caller's transaction").

use std::sync::Arc;

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, Assert, Backend, ChangeWatch, Changes, Entry, Error, InvalidInput, Limits,
    Mutation, ReclaimOptions, Reclaimed, Result, TxnOutcome,
};
use futures_util::StreamExt;
use sqlx::postgres::PgRow;
use sqlx::{Executor, PgConnection, PgPool, Postgres, Transaction};

use crate::errors;
use crate::statements::{self, Session, Statement};

/// [`Backend::store_name`] of an [`InTransaction`].
const STORE_NAME: &str = "postgres-in-transaction";

/// What [`Changes::watch`] refuses inside a caller's transaction.
const NO_WAITING: &str = "waiting for other clients' commits inside a caller's transaction";

/// The statement [`InTransaction::begin`] opens its transaction with.
const BEGIN_SQL: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// A coord store bound to ONE open transaction of the caller's pool: every
/// coord write made through it commits or rolls back with the caller's own
/// rows.
///
/// Build adapters over it per transaction (`BoardAdapter::new(in_tx.clone())`,
/// `SideEffectAdapter`, `GenericLock`, `BackendFencedSink`, …), write your
/// own rows through [`InTransaction::conn`], then [`InTransaction::commit`]
/// (or [`InTransaction::rollback`]). What it answers, and why nothing
/// waits for other clients inside it: the crate docs, "In the caller's
/// transaction". Dropping the last reference without either rolls back.
///
/// ```no_run
/// use coord_backend::{Assert, Backend, Mutation};
/// use coord_postgres::InTransaction;
///
/// # async fn demo(pool: sqlx::PgPool) -> coord_backend::Result<()> {
/// let tx = InTransaction::begin(&pool, "shop").await?;
/// sqlx::query("INSERT INTO orders (id, status) VALUES ($1, 'new')")
///     .bind(17_i64)
///     .execute(&mut *tx.conn().await?)
///     .await
///     .map_err(|e| coord_backend::Error::unavailable("insert failed", e))?;
/// let out = tx
///     .txn(&[Assert::missing("job/17")], &[Mutation::put("job/17", b"pending".to_vec())])
///     .await?;
/// assert!(out.applied);
/// tx.commit().await?; // the order and the job, or neither
/// # Ok(())
/// # }
/// ```
pub struct InTransaction {
    namespace: String,
    limits: Limits,
    options: TransactionOptions,
    state: tokio::sync::Mutex<State>,
}

/// How an [`InTransaction`] sends its statements (default: prepared, cached
/// on the caller's connection as sqlx does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionOptions {
    /// Each statement as one simple-protocol query, parameters as literals.
    inline: bool,
}

impl TransactionOptions {
    /// The caller's pool goes through a pooler that lends a server session
    /// per transaction and does not keep prepared statements apart per
    /// client (PgBouncer `pool_mode = transaction` before 1.21, or without
    /// `max_prepared_statements`): each coord statement is then sent as one
    /// simple-protocol query with its parameters written as literals, as
    /// the pooled store does behind such a pooler, so nothing stays
    /// prepared on a server session the pooler later lends to another
    /// client. Still one round trip per statement. Your own statements in
    /// the transaction need the same care (`.persistent(false)` in sqlx).
    pub fn behind_transaction_pooler(mut self) -> Self {
        self.inline = true;
        self
    }
}

/// The transaction (`None` once finished) and why it may no longer commit.
struct State {
    tx: Option<Transaction<'static, Postgres>>,
    /// How it finished, once it did.
    finished: &'static str,
    /// Set when a coord call through it failed (or was cancelled while its
    /// statement ran): the transaction must not commit.
    failed: Option<String>,
}

impl std::fmt::Debug for InTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state.try_lock() {
            Ok(state) if state.tx.is_none() => state.finished,
            Ok(state) if state.failed.is_some() => "open, a coord call failed",
            Ok(_) => "open",
            Err(_) => "open, in use",
        };
        f.debug_struct("InTransaction")
            .field("namespace", &self.namespace)
            .field("state", &state)
            .finish()
    }
}

/// The refusal of every call after COMMIT or ROLLBACK; nothing is sent.
fn finished(how: &str) -> Error {
    Error::InvalidInput(InvalidInput::Argument(format!(
        "the coord-postgres InTransaction is finished ({how}); begin another transaction"
    )))
}

/// The refusal of every call after one failed; nothing is sent.
fn doomed(failure: &str) -> Error {
    Error::Unavailable {
        message: format!(
            "{failure} earlier in this transaction, which cannot commit any more: roll it back \
             and retry the whole transaction"
        ),
        source: None,
    }
}

/// The transaction's connection, for the caller's own statements: derefs
/// to [`PgConnection`]. coord calls through the same [`InTransaction`] wait
/// while it is held; drop it before making one.
pub struct TransactionConn<'a> {
    state: tokio::sync::MutexGuard<'a, State>,
}

impl std::fmt::Debug for TransactionConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionConn").finish_non_exhaustive()
    }
}

impl std::ops::Deref for TransactionConn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        // `conn` hands a guard out only while the transaction is open, and
        // only `commit` / `rollback` (which need the lock) end it.
        self.state.tx.as_deref().expect("an open transaction")
    }
}

impl std::ops::DerefMut for TransactionConn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.state.tx.as_deref_mut().expect("an open transaction")
    }
}

impl InTransaction {
    /// Open a transaction on `pool` with `BEGIN ISOLATION LEVEL READ
    /// COMMITTED`, whatever the database's default, bound to `namespace`.
    ///
    /// The coord schema must exist in the database (created once by
    /// [`crate::PostgresBackend::connect`]). A pool that cannot lend a
    /// session is [`Error::Unavailable`]; an invalid namespace is refused
    /// before anything is sent.
    pub async fn begin(pool: &PgPool, namespace: &str) -> Result<Arc<InTransaction>> {
        Self::begin_with(pool, namespace, TransactionOptions::default()).await
    }

    /// [`InTransaction::begin`] with `options` (see [`TransactionOptions`]).
    pub async fn begin_with(
        pool: &PgPool,
        namespace: &str,
        options: TransactionOptions,
    ) -> Result<Arc<InTransaction>> {
        validate_namespace(namespace)?;
        let tx = pool
            .begin_with(BEGIN_SQL)
            .await
            .map_err(|e| errors::before_sending("beginning a transaction", e))?;
        Self::from_transaction_with(tx, namespace, options)
    }

    /// Bind a transaction the caller already began, to `namespace`.
    ///
    /// It must run at READ COMMITTED (`coord_txn` is correct at that level
    /// only, see "Atomicity boundary"): at another level every coord txn
    /// through it fails with [`Error::Config`] naming READ COMMITTED, and
    /// aborts the transaction. Nothing is sent here.
    pub fn from_transaction(
        tx: Transaction<'static, Postgres>,
        namespace: &str,
    ) -> Result<Arc<InTransaction>> {
        Self::from_transaction_with(tx, namespace, TransactionOptions::default())
    }

    /// [`InTransaction::from_transaction`] with `options` (see
    /// [`TransactionOptions`]).
    pub fn from_transaction_with(
        tx: Transaction<'static, Postgres>,
        namespace: &str,
        options: TransactionOptions,
    ) -> Result<Arc<InTransaction>> {
        validate_namespace(namespace)?;
        Ok(Arc::new(InTransaction {
            namespace: namespace.to_owned(),
            limits: Limits::DEFAULT,
            options,
            state: tokio::sync::Mutex::new(State {
                tx: Some(tx),
                finished: "open",
                failed: None,
            }),
        }))
    }

    /// The transaction's connection for the caller's own statements (see
    /// [`TransactionConn`]). Refused once the transaction is finished.
    pub async fn conn(&self) -> Result<TransactionConn<'_>> {
        let state = self.state.lock().await;
        if state.tx.is_none() {
            return Err(finished(state.finished));
        }
        Ok(TransactionConn { state })
    }

    /// COMMIT the caller's rows and the coord writes together, in one
    /// round trip.
    ///
    /// - [`Error::Unavailable`]: nothing was committed, the transaction
    ///   rolled back: a coord call through it had failed, a statement of the
    ///   caller's had failed (PostgreSQL aborts the transaction and would
    ///   answer a bare COMMIT with a silent ROLLBACK, which sqlx reports as a
    ///   success: the COMMIT is sent behind a `SELECT 1`, which fails in an
    ///   aborted transaction and keeps the COMMIT from running), or the
    ///   server refused the COMMIT (serialization failure, deferred
    ///   constraint).
    /// - [`Error::Indeterminate`]: COMMIT was sent and its answer lost: it
    ///   may have committed; re-read to learn which.
    ///
    /// Afterwards every call through this backend, and [`InTransaction::conn`],
    /// is refused with [`Error::InvalidInput`] and sends nothing.
    pub async fn commit(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        let Some(mut tx) = state.tx.take() else {
            return Err(finished(state.finished));
        };
        state.finished = "committed";
        if let Some(failure) = state.failed.take() {
            state.finished = "rolled back";
            let _ = tx.rollback().await;
            return Err(doomed(&failure));
        }
        // One message: the check, the COMMIT, and an empty transaction for
        // sqlx to end. sqlx's `Transaction` cannot be told that a COMMIT it
        // did not send ended it: dropped, it queues a ROLLBACK (sent when
        // the pool takes the connection back, off this call's path), which
        // then ends that empty transaction instead of warning "there is no
        // transaction in progress".
        let mut completed = 0;
        let mut failure = None;
        {
            let mut replies = tx.fetch_many(sqlx::raw_sql("SELECT 1; COMMIT; BEGIN"));
            while let Some(reply) = replies.next().await {
                match reply {
                    Ok(sqlx::Either::Left(_)) => completed += 1,
                    Ok(sqlx::Either::Right(_)) => {}
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
        }
        match (failure, completed) {
            // COMMIT's CommandComplete arrived: committed, whatever followed.
            (_, 2..) | (None, _) => Ok(()),
            // The check failed, so the server skipped the COMMIT.
            (Some(sqlx::Error::Database(db)), 0) => {
                state.finished = "rolled back";
                let _ = tx.rollback().await;
                Err(
                    if db.code().as_deref() == Some(errors::TRANSACTION_ABORTED) {
                        Error::unavailable(
                            "not committed: a statement of the transaction failed, which aborted \
                         it; it was rolled back, retry the whole transaction",
                            db,
                        )
                    } else {
                        errors::in_transaction("COMMIT", sqlx::Error::Database(db))
                    },
                )
            }
            // The COMMIT itself failed, or the connection did once the
            // message was sent (the COMMIT in it may have run).
            (Some(error), _) => Err(errors::commit(error)),
        }
    }

    /// ROLLBACK: nothing of the transaction is applied. A connection that
    /// fails meanwhile rolls it back too, so this never fails but for a
    /// transaction already finished ([`Error::InvalidInput`]).
    pub async fn rollback(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        let Some(tx) = state.tx.take() else {
            return Err(finished(state.finished));
        };
        state.finished = "rolled back";
        state.failed = None;
        let _ = tx.rollback().await;
        Ok(())
    }

    /// Mark the transaction as unable to commit, for `failure`.
    async fn fail(&self, failure: String) {
        let mut state = self.state.lock().await;
        if state.tx.is_some() && state.failed.is_none() {
            state.failed = Some(failure);
        }
    }
}

#[async_trait]
impl Session for InTransaction {
    async fn rows(&self, statement: &Statement<'_>) -> Result<Vec<PgRow>> {
        let what = statement.what();
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        let Some(tx) = state.tx.as_mut() else {
            return Err(finished(state.finished));
        };
        if let Some(failure) = &state.failed {
            return Err(doomed(failure));
        }
        // Stays if this future is dropped while the statement runs: it may
        // have written, and nobody learned whether.
        state.failed = Some(format!("a coord {what} was cancelled while it ran"));
        let fetched = if self.options.inline {
            let Some(sql) = statement.inline(&self.namespace) else {
                state.failed = None;
                return Err(Error::InvalidInput(InvalidInput::NulByte(what.to_owned())));
            };
            statements::fetch(tx, sqlx::raw_sql(sqlx::AssertSqlSafe(sql))).await
        } else {
            statements::fetch(tx, statement.query(&self.namespace)).await
        };
        match fetched {
            Ok(rows) => {
                state.failed = None;
                Ok(rows)
            }
            Err((error, _)) => {
                let error = errors::in_transaction(what, error);
                state.failed = Some(format!("a coord {what} failed ({error})"));
                Err(error)
            }
        }
    }
}

/// Every `watch` is refused: see the crate docs, "In the caller's transaction".
#[async_trait]
impl Changes for InTransaction {
    async fn watch(&self, _prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        Err(Error::Unsupported {
            what: NO_WAITING,
            store: STORE_NAME,
        })
    }
}

#[async_trait]
impl Backend for InTransaction {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn store_name(&self) -> &'static str {
        STORE_NAME
    }

    /// Always `Some`, whose `watch` refuses with [`Error::Unsupported`]: the
    /// adapters then refuse every call that would have to wait for another
    /// client, instead of polling while this transaction holds its locks.
    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        statements::snapshot(self, keys).await
    }

    /// No `Error::Indeterminate`: rows that cannot be read leave this txn's
    /// outcome unknown, so the transaction is marked unable to commit and
    /// the call fails with [`Error::Unavailable`].
    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        match statements::txn(self, asserts, mutations).await {
            Err(Error::Indeterminate { message, source }) => {
                self.fail(format!(
                    "a coord txn's answer could not be read ({message})"
                ))
                .await;
                Err(Error::Unavailable {
                    message: format!(
                        "{message}; the transaction cannot commit any more, retry the whole \
                         transaction"
                    ),
                    source,
                })
            }
            outcome => outcome,
        }
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        statements::keys(self, prefix, None).await
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        statements::keys(self, prefix, Some(limit)).await
    }

    /// Refused ([`Error::Unsupported`]): maintenance runs on the pooled
    /// [`crate::PostgresBackend`].
    async fn reclaim(&self, _options: &ReclaimOptions) -> Result<Reclaimed> {
        Err(Error::Unsupported {
            what: "reclaim inside a caller's transaction (run it on the pooled PostgresBackend)",
            store: STORE_NAME,
        })
    }
}
