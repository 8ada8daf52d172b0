//! [`InTransaction`]: a coord store bound to one open transaction of the
//! caller's pool (see the crate docs, "In the caller's transaction").

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use coord_backend::reclaim as floor;
use coord_backend::{
    validate_namespace, Assert, Backend, ChangeWatch, Changes, Entry, Error, InvalidInput, Limits,
    Mutation, ReclaimOptions, Reclaimed, Result, TxnOutcome,
};
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{Sqlite, Transaction};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use crate::{apply_txn, is_busy, list_keys, read_entries, required_format, Attempt};

/// The [`Backend::store_name`] of an [`InTransaction`].
const STORE_NAME: &str = "sqlite-in-transaction";

/// What [`Changes::watch`] of an [`InTransaction`] refuses (see the crate
/// docs, "In the caller's transaction", for why).
const NO_WAITING: &str = "waiting for other clients' commits inside a caller's transaction";

/// A coord store bound to ONE open transaction of the caller's pool: every
/// coord write made through it commits or rolls back with the caller's own
/// rows.
///
/// The contract (schema, errors, what is refused, versions) is in the
/// [crate docs](crate#in-the-callers-transaction). Build adapters over it per
/// transaction (`BoardAdapter::new(in_tx.clone())`, …), then
/// [`commit`](Self::commit) or [`rollback`](Self::rollback).
///
/// ```no_run
/// use coord_backend::{Assert, Backend, Mutation};
/// use coord_sqlite::{InTransaction, SqliteBackend};
/// use sqlx::sqlite::SqlitePool;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// // Once per process: creates the schema and announces the storage format.
/// let store = SqliteBackend::open("data/app.db", "app").await?;
/// // The application's own pool, on the same file.
/// let pool = SqlitePool::connect_with(coord_sqlite::pool_options("data/app.db")).await?;
///
/// let tx = InTransaction::begin(&pool, "app").await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (?1)")
///     .bind(7_i64)
///     .execute(&mut *tx.conn().await?)
///     .await?;
/// let out = tx
///     .txn(&[Assert::missing("order/7")], &[Mutation::put("order/7", b"new".to_vec())])
///     .await?;
/// if out.applied {
///     tx.commit().await?; // the order row and the coord record, or neither
/// } else {
///     tx.rollback().await?;
/// }
/// # Ok(()) }
/// ```
pub struct InTransaction {
    namespace: String,
    state: Mutex<State>,
    /// Whether a txn already read the namespace's required storage format.
    format_checked: AtomicBool,
}

/// Where the bound transaction is.
enum State {
    /// Open and usable.
    Open(Transaction<'static, Sqlite>),
    /// A coord statement failed or was cancelled half way: what the
    /// transaction holds is no longer known (SQLite may even have rolled it
    /// back on its own after `SQLITE_BUSY`), so it can only be rolled back.
    Broken {
        tx: Transaction<'static, Sqlite>,
        why: String,
    },
    /// Committed, rolled back, or ended by a failed `COMMIT`.
    Finished(&'static str),
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Open(_) => "open",
            State::Broken { .. } => "broken",
            State::Finished(how) => how,
        }
    }
}

impl std::fmt::Debug for InTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.try_lock().map_or("in use", |s| s.name());
        f.debug_struct("InTransaction")
            .field("namespace", &self.namespace)
            .field("state", &state)
            .finish()
    }
}

/// The refusal of every call after `commit` / `rollback`: nothing is sent.
fn finished(how: &str) -> Error {
    Error::InvalidInput(InvalidInput::Argument(format!(
        "the coord-sqlite InTransaction is finished ({how}); begin another transaction"
    )))
}

/// The refusal of every call after a coord statement failed in the transaction.
fn broken(why: &str) -> Error {
    Error::Unavailable {
        message: format!(
            "sqlite: {why}; this transaction can only be rolled back: \
             roll it back and retry the whole transaction"
        ),
        source: None,
    }
}

/// An attempt's failure as the caller sees it inside their transaction:
/// no retry loop of ours (the caller retries the whole transaction).
fn in_transaction_error(attempt: Attempt) -> Error {
    match attempt {
        Attempt::Busy(error) => Error::unavailable(
            "sqlite: the database was busy (SQLITE_BUSY / SQLITE_LOCKED) inside the \
             caller's transaction; roll it back and retry the whole transaction",
            error,
        ),
        Attempt::Failed(error) => error,
    }
}

/// The transaction's connection for the caller's own statements, from
/// [`InTransaction::conn`]: derefs to [`SqliteConnection`] (`&mut *guard`
/// is an executor). Coord calls through the same [`InTransaction`] wait
/// while it is held: drop it before the next one (holding it across a coord
/// call in the same task never finishes).
pub struct TransactionConn<'a> {
    conn: MappedMutexGuard<'a, SqliteConnection>,
}

impl std::fmt::Debug for TransactionConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionConn").finish_non_exhaustive()
    }
}

impl Deref for TransactionConn<'_> {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.conn
    }
}

impl DerefMut for TransactionConn<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }
}

/// One coord call in progress: holds the transaction, and breaks it when
/// the call's statements failed, or when the call is dropped (cancelled)
/// before it [`end`](Call::end)s: a statement cut off half way may or may
/// not have run, and committing would make that unknown permanent.
struct Call<'a> {
    state: MutexGuard<'a, State>,
    what: &'static str,
    ended: bool,
}

impl Call<'_> {
    fn conn(&mut self) -> &mut SqliteConnection {
        match &mut *self.state {
            State::Open(tx) => tx,
            // `InTransaction::call` hands out only open transactions.
            State::Broken { tx, .. } => tx,
            State::Finished(_) => unreachable!("a call on a finished transaction"),
        }
    }

    /// The call's answer; a statement failure breaks the transaction (a
    /// decoding error or a missing schema changed nothing in it).
    fn end<T>(mut self, result: std::result::Result<T, Attempt>) -> Result<T> {
        self.ended = true;
        let result = result.map_err(in_transaction_error);
        if let Err(Error::Unavailable { .. }) = &result {
            self.mark_broken(format!("a coord {} failed in this transaction", self.what));
        }
        result
    }

    fn mark_broken(&mut self, why: String) {
        let state = std::mem::replace(&mut *self.state, State::Finished("broken"));
        *self.state = match state {
            State::Open(tx) => State::Broken { tx, why },
            other => other,
        };
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.mark_broken(format!(
                "a coord {} was cancelled before it finished",
                self.what
            ));
        }
    }
}

impl InTransaction {
    /// Open a transaction on `pool` with `BEGIN IMMEDIATE` (it takes the
    /// database's write lock at once, so no later write of it can meet
    /// `SQLITE_BUSY`) and bind it to `namespace`.
    ///
    /// `pool` must open the coord store's file (see [`crate::pool_options`]).
    /// While another connection holds the write lock, `BEGIN IMMEDIATE`
    /// waits up to the pool's `busy_timeout`, then fails with
    /// [`Error::Unavailable`] (nothing began; retry).
    pub async fn begin(pool: &SqlitePool, namespace: &str) -> Result<Arc<InTransaction>> {
        validate_namespace(namespace)?;
        let tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(|e| {
            if is_busy(&e) {
                Error::unavailable(
                    "sqlite: BEGIN IMMEDIATE found the database locked for the whole busy_timeout",
                    e,
                )
            } else {
                Error::unavailable("sqlite: BEGIN IMMEDIATE failed", e)
            }
        })?;
        Ok(Self::bind(tx, namespace))
    }

    /// Bind a transaction the caller already began on the coord store's
    /// file. A `DEFERRED` one (sqlx's `begin()`) takes the write lock only at
    /// its first write; when another connection committed since its first
    /// read, that write fails with `SQLITE_BUSY` ([`Error::Unavailable`]):
    /// roll back and retry the whole transaction. `BEGIN IMMEDIATE`
    /// (`pool.begin_with("BEGIN IMMEDIATE")`, or [`begin`](Self::begin))
    /// never meets that.
    pub fn from_transaction(
        tx: Transaction<'static, Sqlite>,
        namespace: &str,
    ) -> Result<Arc<InTransaction>> {
        validate_namespace(namespace)?;
        Ok(Self::bind(tx, namespace))
    }

    fn bind(tx: Transaction<'static, Sqlite>, namespace: &str) -> Arc<InTransaction> {
        Arc::new(InTransaction {
            namespace: namespace.to_owned(),
            state: Mutex::new(State::Open(tx)),
            format_checked: AtomicBool::new(false),
        })
    }

    /// The transaction's connection, for the caller's own statements in the
    /// same transaction: `query.execute(&mut *tx.conn().await?)`. Coord
    /// calls wait while the guard is held. Refused after
    /// [`commit`](Self::commit) / [`rollback`](Self::rollback)
    /// ([`Error::InvalidInput`]) and after a coord call failed in the
    /// transaction ([`Error::Unavailable`]: roll back).
    pub async fn conn(&self) -> Result<TransactionConn<'_>> {
        let state = self.state.lock().await;
        match &*state {
            State::Open(_) => {}
            State::Broken { why, .. } => return Err(broken(why)),
            State::Finished(how) => return Err(finished(how)),
        }
        let conn = MutexGuard::try_map(state, |state| match state {
            State::Open(tx) => Some(&mut **tx),
            _ => None,
        })
        .map_err(|state| finished(state.name()))?;
        Ok(TransactionConn { conn })
    }

    /// `COMMIT`: the caller's rows and every coord write made through this
    /// backend become visible together.
    ///
    /// Errors: [`Error::Unavailable`] when nothing was committed (SQLite
    /// answered `SQLITE_BUSY`, and the transaction was rolled back; or a
    /// coord call had failed in the transaction, which is then rolled back
    /// instead); [`Error::Indeterminate`] when `COMMIT` failed otherwise (it
    /// may have committed: re-read to learn). Afterwards, whatever the
    /// answer, every call through this backend is refused.
    pub async fn commit(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        match std::mem::replace(&mut *state, State::Finished("ended by a failed COMMIT")) {
            State::Open(tx) => match tx.commit().await {
                Ok(()) => {
                    *state = State::Finished("committed");
                    Ok(())
                }
                // SQLite leaves the transaction open after a busy COMMIT;
                // dropping it (inside `commit`) rolled it back.
                Err(e) if is_busy(&e) => Err(Error::unavailable(
                    "sqlite: COMMIT found the database busy; the transaction was rolled back",
                    e,
                )),
                Err(e) => Err(Error::indeterminate("sqlite: COMMIT failed", e)),
            },
            State::Broken { tx, why } => {
                // Dropped on failure: sqlx rolls it back before the
                // connection is used again.
                let _ = tx.rollback().await;
                *state = State::Finished("rolled back after a failed coord call");
                Err(Error::Unavailable {
                    message: format!(
                        "sqlite: not committed: {why}; the transaction was rolled back, \
                         retry the whole transaction"
                    ),
                    source: None,
                })
            }
            State::Finished(how) => {
                *state = State::Finished(how);
                Err(finished(how))
            }
        }
    }

    /// `ROLLBACK`: nothing of the transaction is kept. A failed `ROLLBACK`
    /// is [`Error::Unavailable`] (nothing was committed either: sqlx rolls
    /// the connection back before reusing it). Afterwards every call through
    /// this backend is refused.
    pub async fn rollback(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        let tx = match std::mem::replace(&mut *state, State::Finished("rolled back")) {
            State::Open(tx) | State::Broken { tx, .. } => tx,
            State::Finished(how) => {
                *state = State::Finished(how);
                return Err(finished(how));
            }
        };
        tx.rollback()
            .await
            .map_err(|e| Error::unavailable("sqlite: ROLLBACK failed", e))
    }

    /// Start a coord call on the open transaction (refused when it is not).
    async fn call(&self, what: &'static str) -> Result<Call<'_>> {
        let state = self.state.lock().await;
        match &*state {
            State::Open(_) => Ok(Call {
                state,
                what,
                ended: false,
            }),
            State::Broken { why, .. } => Err(broken(why)),
            State::Finished(how) => Err(finished(how)),
        }
    }
}

#[async_trait]
impl Backend for InTransaction {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        Limits::DEFAULT
    }

    fn store_name(&self) -> &'static str {
        STORE_NAME
    }

    /// `Some`, but every watch is refused: see the crate docs.
    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        let mut call = self.call("read").await?;
        let result = read_entries(call.conn(), &self.namespace, keys).await;
        call.end(result)
    }

    /// The statements of [`SqliteBackend`](crate::SqliteBackend)'s txn
    /// without its `BEGIN IMMEDIATE` / `COMMIT` and busy retries: applied
    /// inside the caller's transaction.
    ///
    /// The first txn also reads (never writes) the namespace's required
    /// storage format: a namespace that a newer coord reclaimed refuses
    /// this client's writes ([`Error::FormatMismatch`]), as the pooled
    /// store's announcement does (see `coord_backend::reclaim`, "Mixed versions").
    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let mut call = self.call("txn").await?;
        let result = async {
            let conn = call.conn();
            if !self.format_checked.load(Ordering::Relaxed) {
                let required = required_format(&mut *conn, &self.namespace).await?;
                floor::check_announce(
                    floor::STORAGE_FORMAT,
                    required.map_or(0, |r| u32::try_from(r).unwrap_or(u32::MAX)),
                )?;
                self.format_checked.store(true, Ordering::Relaxed);
            }
            apply_txn(conn, &self.namespace, asserts, mutations).await
        }
        .await;
        call.end(result)
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut call = self.call("listing").await?;
        let result = list_keys(call.conn(), &self.namespace, prefix, None).await;
        call.end(result)
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let mut call = self.call("listing").await?;
        let result = list_keys(call.conn(), &self.namespace, prefix, Some(limit)).await;
        call.end(result)
    }

    /// Refused ([`Error::Unsupported`]): maintenance runs on the pooled
    /// [`SqliteBackend`](crate::SqliteBackend).
    async fn reclaim(&self, _options: &ReclaimOptions) -> Result<Reclaimed> {
        Err(Error::Unsupported {
            what: "reclaim inside a caller's transaction (run it on the pooled SqliteBackend)",
            store: STORE_NAME,
        })
    }
}

/// Every watch is refused: the transaction holds the database's write lock,
/// so another client's commit cannot come while it is open.
#[async_trait]
impl Changes for InTransaction {
    async fn watch(&self, _prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        Err(Error::Unsupported {
            what: NO_WAITING,
            store: STORE_NAME,
        })
    }
}
