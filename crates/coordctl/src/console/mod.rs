//! `coordctl serve`: the web console. Server-rendered HTML pages (no
//! script) and a JSON API under `/api/`, both built from the same
//! [`crate::views`] functions and types, so a page and its API answer can
//! never disagree.
//!
//! # Contract
//!
//! - Read-only unless started with `--allow-writes`. Two writes: the
//!   reconcile of an uncertain side-effect key (a form per key, verdict and
//!   a required reason, then a confirmation page, then the verdict is
//!   recorded through [`crate::sideeffect_cmd::resolve`], the same adapter
//!   path as `coordctl reconcile`), and the retry of a dead task of a work
//!   queue (a button per dead task on the task page, then a confirmation
//!   page, then `Board::retry_dead`). Without `--allow-writes` neither form
//!   is shown and `POST /reconcile` and `POST /retry` answer 403.
//! - Listens on loopback unless `--allow-remote` is given; then too (no
//!   authentication here) it is for a trusted network only. While not
//!   remote, a request whose `Host` is not a loopback name is refused (403):
//!   a DNS-rebinding page cannot read the console. Every form carries a
//!   per-process random token (checked on POST), and every answer forbids
//!   scripts, framing and foreign form targets (Content-Security-Policy).
//! - Hostile input is escaped or refused, never a panic: every string from
//!   the store or the request is HTML-escaped; `?limit=` is 1..=500 and an
//!   unknown or malformed query parameter, a bad job name or an over-long
//!   cursor is a 400 with a message; a request body is at most 16 KiB.
//!   Listings are bounded (`limit` names per page, then a "more…" link).
//! - A store failure is an error answer (503 when unavailable, 500
//!   otherwise), never an empty page that looks healthy.
//!
//! # Layout
//!
//! This file starts the server and holds what every handler shares: the
//! state, the routes, the error answers and the parsing of query
//! parameters. The Host guard, the JSON API, the HTML pages and the
//! reconcile form each have their own file; the handlers stay private to
//! this module.

mod api;
mod guard;
mod html;
mod pages;
mod reconcile;
mod retry;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Args;
use coord_backend::{Error, StoreUrl};
use serde::Deserialize;

use crate::views::{self, Page, Stores, MAX_LIMIT};
use api::{api_job_runs, api_listing};
use guard::guard;
use pages::{
    job_page, leaders_page, listing_page, locks_page, metrics_text, not_found, overview_page,
};
use reconcile::reconcile;
use retry::retry;

/// Arguments of `coordctl serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Address to listen on (an IP literal and a port; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// Allow a non-loopback address (the console has no authentication:
    /// a trusted network only).
    #[arg(long)]
    allow_remote: bool,
    /// Allow reconciling uncertain keys from the side-effects page.
    #[arg(long)]
    allow_writes: bool,
}

/// Rows per listing page unless `?limit=` says otherwise.
const DEFAULT_LIMIT: usize = 100;
/// Runs per job on the jobs page.
const RECENT_RUNS: usize = 5;
/// Runs on one job's page unless `?limit=` says otherwise.
const DEFAULT_RUNS: usize = 50;
/// The longest `?after=` cursor, key or reason accepted.
const MAX_TEXT: usize = 1024;
/// The longest result a reconcile form may store.
const MAX_RESULT: usize = 4096;
/// How long a reconcile from the console holds its claim.
const CLAIM_TTL: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct AppState {
    stores: Stores,
    /// The store as shown: credentials hidden, with its namespace.
    shown: String,
    /// The store URL for the `coordctl reconcile` command shown (credentials hidden).
    command_url: String,
    allow_writes: bool,
    allow_remote: bool,
    /// The per-process token every form carries (a CSRF guard).
    csrf: String,
    /// This process's Prometheus recorder (`GET /metrics`).
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// `coord_sideeffect_uncertain` for the watched store, refreshed on scrape.
    uncertain: crate::metrics::UncertainGauge,
    /// The `coord_queue_*` gauges of the default board, refreshed on scrape.
    queues: crate::metrics::QueueGauges,
}

type Shared = Arc<AppState>;

/// `coordctl serve`.
pub(crate) async fn run(args: ServeArgs) -> Result<ExitCode, Error> {
    let addr: SocketAddr = args.addr.parse().map_err(|_| {
        Error::Config(format!(
            "--addr {:?} is not an IP address and port (e.g. 127.0.0.1:8080)",
            args.addr
        ))
    })?;
    check_addr(addr, args.allow_remote)?;
    let url = StoreUrl::parse(&args.store)?;
    // Watching a store must not create an empty SQLite file (a typo'd path
    // would otherwise look like a store with nothing in it).
    if url.scheme() == "sqlite" && !std::path::Path::new(url.body()).exists() {
        return Err(Error::Config(format!(
            "the store file {} does not exist",
            url.body()
        )));
    }
    // Before connecting, so the store's first txns are counted too.
    let metrics = crate::metrics::install_recorder()?;
    let backend = coord::connect(&args.store).await?;
    // Fail fast with the store's own error when it cannot be reached at all
    // (some clients connect lazily): one read proves the store answers.
    backend.snapshot(&["coordctl/probe".to_owned()]).await?;
    let redacted = coord_backend::redact::url(url.without_namespace());
    let state = Arc::new(AppState {
        uncertain: crate::metrics::UncertainGauge::new(backend.clone()),
        queues: crate::metrics::QueueGauges::new(backend.clone()),
        metrics,
        stores: Stores::new(backend)?,
        shown: format!("{redacted} (namespace {})", url.namespace()),
        command_url: coord_backend::redact::url(&args.store),
        allow_writes: args.allow_writes,
        allow_remote: args.allow_remote,
        csrf: coord_adapters::mint_token(),
    });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("cannot read the listening address: {e}")))?;
    println!(
        "coordctl serve: http://{bound}/ on {} ({})",
        state.shown,
        if args.allow_writes {
            "writes allowed: reconcile from the side-effects page, retry dead tasks from the task page"
        } else {
            "read-only"
        }
    );
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| Error::Config(format!("the console server failed: {e}")))?;
    println!("coordctl serve: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Loopback only, unless `--allow-remote`.
fn check_addr(addr: SocketAddr, allow_remote: bool) -> Result<(), Error> {
    if addr.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "refusing to listen on {addr}: not a loopback address. The console has no \
authentication; pass --allow-remote to serve a trusted network anyway"
        )))
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How a listing reads one page of its view (the same function behind a
/// page and its `/api/` twin).
type ReadPage<T> =
    for<'a> fn(&'a Stores, &'a Page) -> Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview_page))
        .route("/locks", get(locks_page))
        .route(
            "/tasks",
            listing_page(
                "Task board",
                "/tasks",
                |s, page| Box::pin(views::task_page(s, page)),
                |view, state, limit| {
                    let writes = html::Writes { csrf: &state.csrf };
                    html::tasks(view, state.allow_writes.then_some(&writes), limit)
                },
            ),
        )
        .route(
            "/sideeffects",
            listing_page(
                "Side-effect keys needing attention",
                "/sideeffects",
                |s, page| Box::pin(views::side_effects(s, None, Some(page), false)),
                |view, state, limit| {
                    let writes = html::Writes { csrf: &state.csrf };
                    html::side_effects(
                        view,
                        &state.command_url,
                        state.allow_writes.then_some(&writes),
                        limit,
                    )
                },
            ),
        )
        .route(
            "/jobs",
            listing_page(
                "Scheduler jobs",
                "/jobs",
                |s, page| Box::pin(views::jobs(s, page, RECENT_RUNS)),
                |view, _, limit| html::jobs(view, limit),
            ),
        )
        .route("/jobs/{job}", get(job_page))
        .route("/reconcile", axum::routing::post(reconcile))
        .route("/retry", axum::routing::post(retry))
        .route("/leaders", get(leaders_page))
        .route(
            "/api/locks",
            api_listing(|s, page| Box::pin(views::locks(s, page))),
        )
        .route(
            "/api/elections",
            api_listing(|s, page| Box::pin(views::elections(s, page))),
        )
        .route(
            "/api/rwlocks",
            api_listing(|s, page| Box::pin(views::rwlocks(s, page))),
        )
        .route(
            "/api/fairlocks",
            api_listing(|s, page| Box::pin(views::fair_locks(s, page))),
        )
        .route(
            "/api/semaphores",
            api_listing(|s, page| Box::pin(views::semaphores(s, page))),
        )
        .route(
            "/api/resources",
            api_listing(|s, page| Box::pin(views::resources(s, None, Some(page)))),
        )
        .route(
            "/api/tasks",
            api_listing(|s, page| Box::pin(views::tasks(s, page))),
        )
        .route(
            "/api/queues",
            api_listing(|s, page| Box::pin(views::queues(s, page))),
        )
        .route(
            "/api/sideeffects",
            api_listing(|s, page| Box::pin(views::side_effects(s, None, Some(page), false))),
        )
        .route(
            "/api/jobs",
            api_listing(|s, page| Box::pin(views::jobs(s, page, RECENT_RUNS))),
        )
        .route("/api/jobs/{job}/runs", get(api_job_runs))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(16 * 1024))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

// ----- errors -----

/// An error answer: HTML for pages, `{"error": "..."}` for the API.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn store(e: Error) -> Self {
        let status = if matches!(e, Error::Unavailable { .. }) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Self::new(status, format!("store error: {e}"))
    }

    fn respond(self, state: &AppState, json: bool) -> Response {
        if json {
            (
                self.status,
                Json(serde_json::json!({ "error": self.message })),
            )
                .into_response()
        } else {
            let title = self.status.canonical_reason().unwrap_or("Error");
            let body = html::page(
                title,
                "",
                &state.shown,
                state.allow_writes,
                &html::note(&self.message),
            );
            (self.status, Html(body)).into_response()
        }
    }
}

type Answer<T> = Result<T, Failure>;

fn html_answer(state: &AppState, result: Answer<(String, &str, String)>) -> Response {
    match result {
        Ok((title, nav, body)) => Html(html::page(
            &title,
            nav,
            &state.shown,
            state.allow_writes,
            &body,
        ))
        .into_response(),
        Err(f) => f.respond(state, false),
    }
}

fn json_answer<T: serde::Serialize>(state: &AppState, result: Answer<T>) -> Response {
    match result {
        Ok(view) => Json(view).into_response(),
        Err(f) => f.respond(state, true),
    }
}

// ----- query parameters -----

/// The query parameters every listing accepts; anything else is a 400.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<String>,
    after: Option<String>,
    /// The resources' cursor on the locks page.
    res_after: Option<String>,
    /// The read-write locks' cursor on the leaders page.
    rw_after: Option<String>,
    /// The fair locks' cursor on the locks page.
    fair_after: Option<String>,
    /// The semaphores' cursor on the locks page.
    sem_after: Option<String>,
}

fn parse_limit(raw: Option<&str>, default: usize) -> Answer<usize> {
    let Some(raw) = raw else {
        return Ok(default);
    };
    match raw.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        _ => Err(Failure::bad_request(format!(
            "limit must be a whole number from 1 to {MAX_LIMIT} (got {:?})",
            views::shorten(raw, 40)
        ))),
    }
}

fn parse_cursor(raw: Option<&str>) -> Answer<Option<String>> {
    match raw {
        None | Some("") => Ok(None),
        Some(c) if c.len() > MAX_TEXT || c.contains('\0') => Err(Failure::bad_request(format!(
            "a cursor must be at most {MAX_TEXT} bytes without NUL"
        ))),
        Some(c) => Ok(Some(c.to_owned())),
    }
}

fn query(q: Result<Query<ListQuery>, QueryRejection>) -> Answer<ListQuery> {
    q.map(|Query(q)| q).map_err(|e| {
        Failure::bad_request(format!(
            "bad query string: {} (accepted: limit=1..{MAX_LIMIT}, after=NAME)",
            e.body_text()
        ))
    })
}

fn page_of(q: &ListQuery, default: usize) -> Answer<Page> {
    Ok(Page {
        limit: parse_limit(q.limit.as_deref(), default)?,
        after: parse_cursor(q.after.as_deref())?,
    })
}

/// The page of a listing `q` asks for, and `read`'s view of it.
async fn read_listing<T>(
    state: &AppState,
    q: Result<Query<ListQuery>, QueryRejection>,
    read: ReadPage<T>,
) -> Answer<(Page, T)> {
    let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
    let view = read(&state.stores, &page).await.map_err(Failure::store)?;
    Ok((page, view))
}

/// The runs of the job named in `path` (`/jobs/<job>`, `/api/jobs/<job>/runs`),
/// as many as `?limit=` asks.
async fn job_runs(
    state: &AppState,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Answer<views::RunsView> {
    let job = job_name(path)?;
    let limit = parse_limit(query(q)?.limit.as_deref(), DEFAULT_RUNS)?;
    views::runs(&state.stores.runs, &job, limit, None)
        .await
        .map_err(Failure::store)
}

fn job_name(path: Result<Path<String>, PathRejection>) -> Answer<String> {
    let Path(job) =
        path.map_err(|e| Failure::bad_request(format!("bad path: {}", e.body_text())))?;
    coord_scheduler::validate_job_name(&job).map_err(|_| {
        Failure::bad_request(format!(
            "{:?} is not a job name (1 to 128 characters of A-Z a-z 0-9 . _ : -)",
            views::shorten(&job, 60)
        ))
    })?;
    Ok(job)
}
