//! `coordctl bench --outbox`: the transactional outbox.
//!
//! - **Dispatch**, on any store: `--tasks` intents are enqueued (one txn
//!   each, not measured), then that many dispatchers (each its own
//!   `Outbox` over its own board client, as separate processes would be)
//!   drain them with a handler that does nothing, for each count in
//!   `--workers`. Store calls are counted under the adapters. Beside each:
//!   the store's one-round-trip conditional write by as many callers, for
//!   as long as the drain took.
//! - **Enqueue cost**, on PostgreSQL: a caller's transaction that inserts
//!   one business row (`BEGIN; INSERT; COMMIT` on a pool of the caller's
//!   own) against the same transaction that also enqueues an intent through
//!   `coord_postgres::InTransaction`, one caller, alternating slices of the
//!   same length; the ratio of their times per transaction. A third kind
//!   adds a bare `INSERT` of two rows of the same sizes (the intent's task
//!   record and its index entry) to a table of its own instead: what any
//!   one more statement costs, the floor of an enqueue that is not sent
//!   with the COMMIT.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::board::{BoardAdapter, BoardOptions};
use coord_adapters::outbox::{HandlerError, Outbox};
use coord_backend::{Backend, Error};
use serde::Serialize;

use super::queue::{board_error, raw_writes, Counted};

/// One dispatcher count's figures.
#[derive(Debug, Serialize)]
pub(crate) struct DispatchRow {
    pub(crate) dispatchers: usize,
    pub(crate) intents: usize,
    pub(crate) seconds: f64,
    pub(crate) intents_per_sec: f64,
    /// Store calls per dispatched intent (snapshots, txns, listings).
    pub(crate) round_trips_per_intent: f64,
    /// The store's conditional write, as many callers at once.
    pub(crate) raw_writes_per_sec: f64,
    /// intents_per_sec / raw_writes_per_sec.
    pub(crate) ratio: f64,
}

/// The caller's transaction with and without an enqueue.
#[derive(Debug, Serialize)]
pub(crate) struct EnqueueCost {
    /// Transactions of each kind.
    pub(crate) transactions: u64,
    /// Mean milliseconds per transaction inserting one row.
    pub(crate) plain_ms: f64,
    /// Mean milliseconds per transaction inserting one row and enqueueing.
    pub(crate) with_enqueue_ms: f64,
    /// with_enqueue_ms / plain_ms.
    pub(crate) ratio: f64,
    /// Mean milliseconds per transaction inserting one row, then two rows
    /// of an intent's sizes with one bare INSERT (no coord).
    pub(crate) with_bare_insert_ms: f64,
    /// with_bare_insert_ms / plain_ms.
    pub(crate) bare_insert_ratio: f64,
}

/// Drain `intents` intents with each count of `dispatchers`.
pub(crate) async fn measure_dispatch(
    store: &Arc<dyn Backend>,
    intents: usize,
    dispatchers: &[usize],
    progress: impl Fn(&str),
) -> Result<Vec<DispatchRow>, Error> {
    let mut rows = Vec::new();
    for &n in dispatchers {
        progress(&format!(
            "outbox, {n} dispatchers: enqueueing {intents} intents"
        ));
        let counted = Arc::new(Counted::new(store.clone()));
        let options = BoardOptions::default().with_key_prefix(format!("bench-outbox-{n}/"));
        let outbox = |backend: Arc<dyn Backend>| {
            Outbox::over(
                Arc::new(BoardAdapter::with_options(backend, options.clone())),
                "bench",
            )
            .map_err(board_error)
        };
        let setup = outbox(counted.clone())?;
        for i in 0..intents {
            setup
                .enqueue(&format!("i{i:06}"), b"intent".to_vec())
                .await
                .map_err(board_error)?;
        }
        counted.reset();
        progress(&format!("outbox, {n} dispatchers: draining"));
        let started = Instant::now();
        let mut running = Vec::new();
        for d in 0..n {
            let dispatcher = outbox(counted.clone())?.dispatcher(&format!("dispatcher-{d}"));
            running.push(tokio::spawn(async move {
                let mut done = 0u64;
                while dispatcher
                    .dispatch_next(|_| async { Ok::<_, HandlerError>(Vec::new()) })
                    .await?
                    .is_some()
                {
                    done += 1;
                }
                Ok::<u64, coord_adapters::board::BoardError>(done)
            }));
        }
        let mut dispatched = 0;
        for dispatcher in running {
            dispatched += dispatcher
                .await
                .map_err(|e| Error::Config(format!("a bench dispatcher panicked: {e}")))?
                .map_err(board_error)?;
        }
        let elapsed = started.elapsed();
        if dispatched != intents as u64 {
            return Err(Error::Config(format!(
                "{n} dispatchers ran {dispatched} of {intents} intents"
            )));
        }
        let calls = counted.calls.load(Ordering::Relaxed);
        progress(&format!("conditional writes, {n} callers"));
        let raw = raw_writes(store, n, elapsed.max(Duration::from_secs(1))).await?;
        let per_sec = dispatched as f64 / elapsed.as_secs_f64();
        rows.push(DispatchRow {
            dispatchers: n,
            intents,
            seconds: elapsed.as_secs_f64(),
            intents_per_sec: per_sec,
            round_trips_per_intent: calls as f64 / dispatched as f64,
            raw_writes_per_sec: raw,
            ratio: per_sec / raw.max(f64::EPSILON),
        });
    }
    Ok(rows)
}

/// The enqueue's cost in a caller's PostgreSQL transaction: `slices`
/// alternating slices of `per_slice` each, plain then with an enqueue.
#[cfg(feature = "postgres")]
pub(crate) async fn measure_enqueue_postgres(
    url: &coord_backend::StoreUrl,
    per_slice: Duration,
    slices: u32,
) -> Result<EnqueueCost, Error> {
    use coord_postgres::InTransaction;
    let sql_error = |what: &str, e: sqlx::Error| Error::Config(format!("{what}: {e}"));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(url.without_namespace())
        .await
        .map_err(|e| sql_error("connecting the caller's pool", e))?;
    let table = format!("coord_bench_orders_{}", &coord_adapters::mint_token()[..8]);
    // The table's name is ours (a fixed prefix and hex digits).
    let safe = |sql: String| sqlx::AssertSqlSafe(sql);
    let rows = format!("{table}_rows");
    for sql in [
        format!("CREATE TABLE {table} (id text PRIMARY KEY, item text NOT NULL)"),
        format!("CREATE TABLE {rows} (id text PRIMARY KEY, value bytea NOT NULL)"),
    ] {
        sqlx::query(safe(sql))
            .execute(&pool)
            .await
            .map_err(|e| sql_error("creating the business tables", e))?;
    }
    let insert = format!("INSERT INTO {table} (id, item) VALUES ($1, 'book')");
    let insert_rows = format!("INSERT INTO {rows} (id, value) VALUES ($1, $2), ($3, $4)");
    // The sizes of an intent's two records (its task, its index entry).
    let record = vec![b'x'; 220];
    let outbox_name = "bench-tx";
    let (mut plain, mut with) = ((Duration::ZERO, 0u64), (Duration::ZERO, 0u64));
    let mut bare = (Duration::ZERO, 0u64);
    let mut next = 0u64;
    let result = async {
        for _ in 0..slices {
            for with_rows in [false, true] {
                let slice = Instant::now();
                while slice.elapsed() < per_slice {
                    next += 1;
                    let started = Instant::now();
                    let mut tx = pool.begin().await.map_err(|e| sql_error("BEGIN", e))?;
                    sqlx::query(safe(insert.clone()))
                        .bind(format!("o{next}"))
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| sql_error("INSERT", e))?;
                    if with_rows {
                        sqlx::query(safe(insert_rows.clone()))
                            .bind(format!("task/o{next}"))
                            .bind(&record)
                            .bind(format!("index/o{next}"))
                            .bind(&b"o"[..])
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| sql_error("INSERT", e))?;
                    }
                    tx.commit().await.map_err(|e| sql_error("COMMIT", e))?;
                    let kind = if with_rows { &mut bare } else { &mut plain };
                    kind.0 += started.elapsed();
                    kind.1 += 1;
                }
            }
            let slice = Instant::now();
            while slice.elapsed() < per_slice {
                next += 1;
                let started = Instant::now();
                let tx = InTransaction::begin(&pool, url.namespace()).await?;
                sqlx::query(safe(insert.clone()))
                    .bind(format!("o{next}"))
                    .execute(&mut *tx.conn().await?)
                    .await
                    .map_err(|e| sql_error("INSERT", e))?;
                Outbox::new(tx.clone(), outbox_name)
                    .map_err(board_error)?
                    .enqueue(&format!("o{next}"), b"mail".to_vec())
                    .await
                    .map_err(board_error)?;
                tx.commit().await?;
                with.0 += started.elapsed();
                with.1 += 1;
            }
        }
        Ok::<(), Error>(())
    }
    .await;
    let _ = sqlx::query(safe(format!("DROP TABLE {table}, {rows}")))
        .execute(&pool)
        .await;
    result?;
    let mean_ms = |(total, n): (Duration, u64)| total.as_secs_f64() * 1000.0 / n.max(1) as f64;
    let (plain_ms, with_enqueue_ms, with_bare_insert_ms) =
        (mean_ms(plain), mean_ms(with), mean_ms(bare));
    Ok(EnqueueCost {
        transactions: plain.1.min(with.1).min(bare.1),
        plain_ms,
        with_enqueue_ms,
        ratio: with_enqueue_ms / plain_ms.max(f64::EPSILON),
        with_bare_insert_ms,
        bare_insert_ratio: with_bare_insert_ms / plain_ms.max(f64::EPSILON),
    })
}

/// The outbox figures as tables.
pub(crate) fn print(store: &str, rows: &[DispatchRow], enqueue: Option<&EnqueueCost>) {
    if let Some(cost) = enqueue {
        println!(
            "coordctl bench --outbox: {store}; a caller's transaction inserting one row, \
             without and with an enqueue, and with a bare INSERT of two rows of an intent's \
             sizes instead (one caller, alternating slices)"
        );
        println!(
            "{:>12} {:>10} {:>16} {:>7} {:>15} {:>7}",
            "transactions", "plain ms", "with enqueue ms", "ratio", "bare INSERT ms", "ratio"
        );
        println!(
            "{:>12} {:>10.3} {:>16.3} {:>7.2} {:>15.3} {:>7.2}",
            cost.transactions,
            cost.plain_ms,
            cost.with_enqueue_ms,
            cost.ratio,
            cost.with_bare_insert_ms,
            cost.bare_insert_ratio
        );
        println!();
    }
    println!(
        "coordctl bench --outbox: {store}; each dispatcher count: intents enqueued, then drained"
    );
    println!(
        "{:>11} {:>7} {:>8} {:>10} {:>9} | {:>22} {:>7}",
        "dispatchers",
        "intents",
        "seconds",
        "intents/s",
        "RT/intent",
        "cond. writes/s (same n)",
        "ratio"
    );
    for r in rows {
        println!(
            "{:>11} {:>7} {:>8.2} {:>10.0} {:>9.2} | {:>22.0} {:>7.2}",
            r.dispatchers,
            r.intents,
            r.seconds,
            r.intents_per_sec,
            r.round_trips_per_intent,
            r.raw_writes_per_sec,
            r.ratio
        );
    }
}
