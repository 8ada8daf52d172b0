//! Prometheus exposition of coord's metrics for `coordctl` commands
//! (`cron --metrics-addr`, and `serve`'s `/metrics`).
//!
//! # Contract
//!
//! - [`install_recorder`] installs ONE process-wide `metrics` recorder
//!   (metrics-exporter-prometheus, without its own HTTP listener) the first
//!   time it is called and returns a handle to it on every call; it also
//!   starts the exporter's upkeep task (histogram draining) on the current
//!   Tokio runtime.
//! - [`UncertainGauge::refresh`] sets `coord_sideeffect_uncertain` from a
//!   store: it lists `se/act/` once (one `keys` call) and reads at most
//!   `limit` of those keys, one snapshot each (two for an in-flight intent);
//!   a result younger than its reuse window (default 10 s) is reused instead.
//!   Past `limit` keys the gauge is a lower bound and
//!   `coord_sideeffect_uncertain_truncated` is 1.
//! - [`QueueGauges::refresh`] sets the `coord_queue_*` gauges of the
//!   default board (`board/`) through
//!   `BoardAdapter::refresh_queue_metrics`: at most 100 queues, each of
//!   its three index listings at most 10,000 keys (past them the
//!   `*_truncated` gauges are 1), reused for its window (default 10 s).
//! - [`render`] refreshes the gauges (when given them) and returns the
//!   Prometheus text format; [`router`] serves it at `GET /metrics`;
//!   [`serve`] binds an address first (a bad or busy address is an error
//!   before anything runs) and serves the router in the background.
//!
//! Names, labels and their meaning: docs/operations.md.
//!
//! # Boundary
//!
//! A store that fails during a refresh leaves the previous gauge value in
//! place and logs a warning: the other metrics are still served. Counters
//! only count what happened in THIS process since it started.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use coord_adapters::board::{BoardAdapter, BoardError, QueueDepths};
use coord_adapters::sideeffect::{KeyStatus, SideEffectAdapter};
use coord_adapters::telemetry::SIDEEFFECT_UNCERTAIN;
use coord_backend::{Backend, Error, TXN_SECONDS};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge `coord_sideeffect_uncertain_truncated`: 1 when the last refresh of
/// `coord_sideeffect_uncertain` stopped at its key limit (a lower bound).
pub(crate) const SIDEEFFECT_UNCERTAIN_TRUNCATED: &str = "coord_sideeffect_uncertain_truncated";

/// Buckets of `coord_txn_seconds`: 0.5 ms (embedded SQLite) to 10 s (a
/// txn near a store's timeout).
const TXN_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How often the upkeep task drains histogram samples between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The installed recorder's handle; a mutex, not a `OnceLock`, so that two
/// first calls cannot both try to install a recorder.
static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Install the process-wide Prometheus recorder (once) and return its handle.
///
/// Must run inside a Tokio runtime (it spawns the upkeep task). Fails only
/// when another `metrics` recorder was installed first.
pub(crate) fn install_recorder() -> Result<PrometheusHandle, Error> {
    let mut installed = HANDLE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(TXN_SECONDS.to_owned()), TXN_BUCKETS)
        .map_err(|e| Error::Config(format!("metrics buckets: {e}")))?
        .install_recorder()
        .map_err(|e| Error::Config(format!("cannot install the metrics recorder: {e}")))?;
    *installed = Some(handle.clone());
    coord_backend::metered::describe();
    coord_adapters::telemetry::describe();
    coord_scheduler::telemetry::describe();
    metrics::describe_gauge!(
        SIDEEFFECT_UNCERTAIN_TRUNCATED,
        "1 when the last count of coord_sideeffect_uncertain stopped at its key limit"
    );
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `coord_sideeffect_uncertain` for one store (and namespace).
#[derive(Debug)]
pub(crate) struct UncertainGauge {
    adapter: SideEffectAdapter,
    limit: usize,
    max_age: Duration,
    last: tokio::sync::Mutex<Option<(Instant, UncertainCount)>>,
}

/// What one refresh found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UncertainCount {
    /// Keys marked uncertain, plus intents whose lease ran out (what
    /// `acquire` answers `Uncertain` for and `coordctl inspect` lists).
    pub(crate) uncertain: u64,
    /// Keys read (at most the limit).
    pub(crate) examined: u64,
    /// Whether `se/act/` held more keys than the limit.
    pub(crate) truncated: bool,
}

impl UncertainGauge {
    /// Default bound on keys read per refresh.
    pub(crate) const DEFAULT_LIMIT: usize = 10_000;
    /// Default reuse window of a refresh (a scrape every few seconds costs one walk per window).
    pub(crate) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(10);

    /// A gauge over `backend` with the default limit and reuse window.
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_limits(backend, Self::DEFAULT_LIMIT, Self::DEFAULT_MAX_AGE)
    }

    /// A gauge reading at most `limit` keys per refresh, reusing a refresh for `max_age`.
    pub(crate) fn with_limits(backend: Arc<dyn Backend>, limit: usize, max_age: Duration) -> Self {
        UncertainGauge {
            adapter: SideEffectAdapter::new(backend),
            limit,
            max_age,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Count uncertain keys (or reuse a count younger than the window) and set the gauges.
    pub(crate) async fn refresh(&self) -> Result<UncertainCount, Error> {
        let mut last = self.last.lock().await;
        if let Some((at, count)) = *last {
            if at.elapsed() < self.max_age {
                return Ok(count);
            }
        }
        let count = self.walk().await?;
        metrics::gauge!(SIDEEFFECT_UNCERTAIN).set(count.uncertain as f64);
        metrics::gauge!(SIDEEFFECT_UNCERTAIN_TRUNCATED).set(if count.truncated {
            1.0
        } else {
            0.0
        });
        *last = Some((Instant::now(), count));
        Ok(count)
    }

    async fn walk(&self) -> Result<UncertainCount, Error> {
        // Only the keys in flight or uncertain (the adapter's index of them),
        // not every key the namespace holds.
        let keys = self.adapter.open_keys().await.map_err(|e| match e {
            coord_adapters::SideEffectError::Store(e) => e,
            other => Error::Config(other.to_string()),
        })?;
        let truncated = keys.len() > self.limit;
        let mut count = UncertainCount {
            uncertain: 0,
            examined: 0,
            truncated,
        };
        for key in keys.iter().take(self.limit) {
            let status = self.adapter.key_status(key).await.map_err(|e| match e {
                coord_adapters::SideEffectError::Store(e) => e,
                other => Error::Config(other.to_string()),
            })?;
            count.examined += 1;
            if matches!(
                status,
                KeyStatus::Uncertain { .. } | KeyStatus::InFlight { live: false, .. }
            ) {
                count.uncertain += 1;
            }
        }
        Ok(count)
    }
}

/// The `coord_queue_*` gauges of the default board of one store (and
/// namespace).
#[derive(Debug)]
pub(crate) struct QueueGauges {
    board: BoardAdapter,
    max_queues: usize,
    limit: usize,
    max_age: Duration,
    last: tokio::sync::Mutex<Option<(Instant, QueueDepths)>>,
}

impl QueueGauges {
    /// Default bound on the queues read per refresh.
    pub(crate) const DEFAULT_MAX_QUEUES: usize = 100;
    /// Default bound on the keys of each index listing.
    pub(crate) const DEFAULT_LIMIT: usize = 10_000;

    /// Gauges over `backend` with the default bounds and the reuse window
    /// of [`UncertainGauge`].
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_limits(
            backend,
            Self::DEFAULT_MAX_QUEUES,
            Self::DEFAULT_LIMIT,
            UncertainGauge::DEFAULT_MAX_AGE,
        )
    }

    /// Gauges reading at most `max_queues` queues and `limit` keys per
    /// listing, reusing a refresh for `max_age`.
    pub(crate) fn with_limits(
        backend: Arc<dyn Backend>,
        max_queues: usize,
        limit: usize,
        max_age: Duration,
    ) -> Self {
        QueueGauges {
            board: BoardAdapter::new(backend),
            max_queues,
            limit,
            max_age,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Read every queue's numbers and set the gauges (or reuse a read
    /// younger than the window); a failed read keeps the previous values.
    pub(crate) async fn refresh(&self) -> Result<QueueDepths, BoardError> {
        let mut last = self.last.lock().await;
        if let Some((at, depths)) = last.as_ref() {
            if at.elapsed() < self.max_age {
                return Ok(depths.clone());
            }
        }
        let depths = self
            .board
            .refresh_queue_metrics(self.max_queues, self.limit)
            .await?;
        *last = Some((Instant::now(), depths.clone()));
        Ok(depths)
    }
}

/// The Prometheus text of every metric of this process, after refreshing
/// `uncertain` and `queues` (a failed refresh keeps the previous values and
/// is logged).
pub(crate) async fn render(
    handle: &PrometheusHandle,
    uncertain: Option<&UncertainGauge>,
    queues: Option<&QueueGauges>,
) -> String {
    if let Some(gauge) = uncertain {
        if let Err(error) = gauge.refresh().await {
            tracing::warn!(%error, "could not refresh coord_sideeffect_uncertain");
        }
    }
    if let Some(gauges) = queues {
        if let Err(error) = gauges.refresh().await {
            tracing::warn!(%error, "could not refresh the coord_queue_* gauges");
        }
    }
    handle.run_upkeep();
    handle.render()
}

/// `GET /metrics` → [`render`], as a router to serve or merge into another.
pub(crate) fn router(handle: PrometheusHandle, uncertain: Option<Arc<UncertainGauge>>) -> Router {
    let state = Arc::new((handle, uncertain));
    Router::new().route(
        "/metrics",
        get(move || {
            let state = state.clone();
            async move {
                let (handle, uncertain) = &*state;
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    render(handle, uncertain.as_deref(), None).await,
                )
            }
        }),
    )
}

/// Bind `addr` now (an error if it cannot), then serve `router` in the background.
pub(crate) async fn serve(
    addr: SocketAddr,
    router: Router,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))?;
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "metrics endpoint stopped");
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_adapters::sideeffect::{Action, EffectResult, Runner};

    #[tokio::test]
    async fn counts_uncertain_keys_within_the_limit() {
        let backend = coord::connect("memory://?namespace=metrics-uncertain")
            .await
            .unwrap();
        let runner = Runner::new(Arc::new(SideEffectAdapter::new(backend.clone())));
        let ttl = Duration::from_secs(30);
        for i in 0..3 {
            let action = Action::new(format!("bad/{i}"), format!("r{i}"));
            let _ = runner
                .execute(&action, ttl, |_| async {
                    Err::<EffectResult, _>(std::io::Error::other("lost"))
                })
                .await;
        }
        let ok = Action::new("good", "r9");
        runner
            .execute(&ok, ttl, |_| async {
                Ok::<_, std::io::Error>(EffectResult::from("ok"))
            })
            .await
            .unwrap();
        let all = UncertainGauge::with_limits(backend.clone(), 100, Duration::ZERO);
        assert_eq!(
            all.refresh().await.unwrap(),
            UncertainCount {
                uncertain: 3,
                // The completed key needs no attention: it is not even read.
                examined: 3,
                truncated: false
            }
        );
        let bounded = UncertainGauge::with_limits(backend, 2, Duration::ZERO);
        let count = bounded.refresh().await.unwrap();
        assert_eq!((count.examined, count.truncated), (2, true));
        assert!(count.uncertain <= 2);
    }
}
