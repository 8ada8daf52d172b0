//! `coordctl serve`: the web console. Server-rendered HTML pages (no
//! script) and a JSON API under `/api/`, both built from the same
//! [`crate::views`] functions and types, so a page and its API answer can
//! never disagree.
//!
//! # Contract
//!
//! - Read-only unless started with `--allow-writes`. The one write is the
//!   reconcile of an uncertain side-effect key: a form per key (verdict and
//!   a required reason), then a confirmation page, then the verdict is
//!   recorded through [`crate::sideeffect_cmd::resolve`], the same adapter
//!   path as `coordctl reconcile`. Without `--allow-writes` the form is not
//!   shown and `POST /reconcile` answers 403.
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

mod html;

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Form, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use clap::Args;
use coord_adapters::sideeffect::KeyStatus;
use coord_backend::{Error, StoreUrl};
use serde::Deserialize;

use crate::sideeffect_cmd::{resolve, Resolved, Verdict};
use crate::views::{self, side_effect_error, Page, Stores, MAX_LIMIT};

/// Arguments of `coordctl serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long)]
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
            "writes allowed: reconcile from the side-effects page"
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

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview_page))
        .route("/locks", get(locks_page))
        .route("/tasks", get(tasks_page))
        .route("/sideeffects", get(side_effects_page))
        .route("/jobs", get(jobs_page))
        .route("/jobs/{job}", get(job_page))
        .route("/reconcile", axum::routing::post(reconcile))
        .route("/leaders", get(leaders_page))
        .route("/api/locks", get(api_locks))
        .route("/api/elections", get(api_elections))
        .route("/api/rwlocks", get(api_rwlocks))
        .route("/api/fairlocks", get(api_fair_locks))
        .route("/api/semaphores", get(api_semaphores))
        .route("/api/resources", get(api_resources))
        .route("/api/tasks", get(api_tasks))
        .route("/api/sideeffects", get(api_side_effects))
        .route("/api/jobs", get(api_jobs))
        .route("/api/jobs/{job}/runs", get(api_job_runs))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(16 * 1024))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

// ----- the guard: Host check and security headers on every answer -----

/// Whether a `Host` header names this machine's loopback (`localhost`,
/// `127.x.y.z`, `[::1]`, with or without a port).
fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let host_ok = state.allow_remote
        || request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(loopback_host);
    let mut response = if host_ok {
        next.run(request).await
    } else {
        // Plain text without the store's name: the asker may be a rebinding page.
        (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "this console answers loopback host names only (127.0.0.1, localhost, [::1]); \
start it with --allow-remote to serve other names\n",
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
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
                &html::error_body(&self.message),
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

// ----- the JSON API -----

/// A listing's JSON answer: the page from the query, then `read` it.
async fn api_list<T, Fut>(
    state: &AppState,
    q: Result<Query<ListQuery>, QueryRejection>,
    read: impl FnOnce(Page) -> Fut,
) -> Response
where
    T: serde::Serialize,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let result = match query(q).and_then(|q| page_of(&q, DEFAULT_LIMIT)) {
        Ok(page) => read(page).await.map_err(Failure::store),
        Err(f) => Err(f),
    };
    json_answer(state, result)
}

async fn api_locks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::locks(stores, &page).await
    })
    .await
}

async fn api_elections(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::elections(stores, &page).await
    })
    .await
}

async fn api_rwlocks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::rwlocks(stores, &page).await
    })
    .await
}

async fn api_fair_locks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::fair_locks(stores, &page).await
    })
    .await
}

async fn api_semaphores(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::semaphores(stores, &page).await
    })
    .await
}

async fn api_resources(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::resources(stores, None, Some(&page)).await
    })
    .await
}

async fn api_tasks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::tasks(stores, &page).await
    })
    .await
}

async fn api_side_effects(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::side_effects(stores, None, Some(&page), false).await
    })
    .await
}

async fn api_jobs(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::jobs(stores, &page, RECENT_RUNS).await
    })
    .await
}

async fn api_job_runs(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let job = job_name(path)?;
        let limit = parse_limit(query(q)?.limit.as_deref(), DEFAULT_RUNS)?;
        views::runs(&state.stores.runs, &job, limit, None)
            .await
            .map_err(Failure::store)
    }
    .await;
    json_answer(&state, result)
}

// ----- pages -----

async fn overview_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        query(q)?;
        let page = Page::first(DEFAULT_LIMIT);
        let s = &state.stores;
        let locks = views::locks(s, &page).await.map_err(Failure::store)?;
        let tasks = views::tasks(s, &page).await.map_err(Failure::store)?;
        let effects = views::side_effects(s, None, Some(&page), false)
            .await
            .map_err(Failure::store)?;
        let jobs = views::jobs(s, &page, 1).await.map_err(Failure::store)?;
        Ok((
            "Overview".to_owned(),
            "/",
            html::overview(&locks, &tasks, &effects, &jobs),
        ))
    }
    .await;
    html_answer(&state, result)
}

async fn locks_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let q = query(q)?;
        let page = page_of(&q, DEFAULT_LIMIT)?;
        let res_page = Page {
            limit: page.limit,
            after: parse_cursor(q.res_after.as_deref())?,
        };
        let locks = views::locks(&state.stores, &page)
            .await
            .map_err(Failure::store)?;
        let resources = views::resources(&state.stores, None, Some(&res_page))
            .await
            .map_err(Failure::store)?;
        Ok((
            "Locks held".to_owned(),
            "/locks",
            html::locks(&locks, &resources, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

async fn leaders_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let q = query(q)?;
        let page = page_of(&q, DEFAULT_LIMIT)?;
        let rw_page = Page {
            limit: page.limit,
            after: parse_cursor(q.rw_after.as_deref())?,
        };
        let elections = views::elections(&state.stores, &page)
            .await
            .map_err(Failure::store)?;
        let rwlocks = views::rwlocks(&state.stores, &rw_page)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Leaders and read-write locks".to_owned(),
            "/leaders",
            html::leaders(&elections, &rwlocks, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

async fn tasks_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
        let view = views::tasks(&state.stores, &page)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Task board".to_owned(),
            "/tasks",
            html::tasks(&view, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

async fn side_effects_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
        let view = views::side_effects(&state.stores, None, Some(&page), false)
            .await
            .map_err(Failure::store)?;
        let writes = html::Writes { csrf: &state.csrf };
        Ok((
            "Side-effect keys needing attention".to_owned(),
            "/sideeffects",
            html::side_effects(
                &view,
                &state.command_url,
                state.allow_writes.then_some(&writes),
                page.limit,
            ),
        ))
    }
    .await;
    html_answer(&state, result)
}

async fn jobs_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
        let view = views::jobs(&state.stores, &page, RECENT_RUNS)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Scheduler jobs".to_owned(),
            "/jobs",
            html::jobs(&view, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

async fn job_page(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let job = job_name(path)?;
        let limit = parse_limit(query(q)?.limit.as_deref(), DEFAULT_RUNS)?;
        let view = views::runs(&state.stores.runs, &job, limit, None)
            .await
            .map_err(Failure::store)?;
        Ok((format!("Job {job}"), "/jobs", html::job_runs(&view)))
    }
    .await;
    html_answer(&state, result)
}

/// Prometheus text of this process's metrics (docs/operations.md), behind
/// the same Host guard as every page.
async fn metrics_text(State(state): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&state.metrics, Some(&state.uncertain)).await,
    )
        .into_response()
}

async fn not_found(State(state): State<Shared>, request: Request) -> Response {
    let json = request.uri().path().starts_with("/api/");
    Failure::new(
        StatusCode::NOT_FOUND,
        "no such page (pages: /, /locks, /leaders, /tasks, /sideeffects, /jobs, /jobs/JOB; API: /api/locks, \
/api/elections, /api/rwlocks, /api/fairlocks, /api/semaphores, /api/resources, /api/tasks, /api/sideeffects, /api/jobs, /api/jobs/JOB/runs)",
    )
    .respond(&state, json)
}

// ----- reconcile (only with --allow-writes) -----

/// The reconcile form (first step) and its confirmation (second step, `confirm=yes`).
#[derive(Debug, Deserialize)]
struct ReconcileForm {
    csrf: String,
    key: String,
    /// `applied` or `not_applied`.
    verdict: String,
    reason: String,
    #[serde(default)]
    result: String,
    confirm: Option<String>,
}

async fn reconcile(
    State(state): State<Shared>,
    form: Result<Form<ReconcileForm>, FormRejection>,
) -> Response {
    let result = reconcile_step(&state, form).await;
    html_answer(&state, result)
}

async fn reconcile_step(
    state: &AppState,
    form: Result<Form<ReconcileForm>, FormRejection>,
) -> Answer<(String, &'static str, String)> {
    if !state.allow_writes {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "this console is read-only: start `coordctl serve` with --allow-writes to reconcile from it",
        ));
    }
    let Form(form) = form.map_err(|e| {
        Failure::bad_request(format!(
            "bad reconcile form: {} (fields: key, verdict=applied|not_applied, reason, result, csrf)",
            e.body_text()
        ))
    })?;
    if form.csrf != state.csrf {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "the form is stale or was not made by this console (reload the side-effects page)",
        ));
    }
    let key = form.key;
    if key.is_empty() || key.len() > MAX_TEXT || key.contains('\0') {
        return Err(Failure::bad_request(format!(
            "the key must be 1 to {MAX_TEXT} bytes without NUL"
        )));
    }
    let reason = form.reason.trim().to_owned();
    if reason.is_empty() || reason.len() > MAX_TEXT {
        return Err(Failure::bad_request(format!(
            "a reason is required (the evidence behind the verdict, at most {MAX_TEXT} bytes)"
        )));
    }
    if form.result.len() > MAX_RESULT {
        return Err(Failure::bad_request(format!(
            "the result must be at most {MAX_RESULT} bytes"
        )));
    }
    let verdict = match form.verdict.as_str() {
        "applied" => Verdict::Applied {
            result: form.result.clone(),
        },
        "not_applied" if form.result.is_empty() => Verdict::NotApplied,
        "not_applied" => {
            return Err(Failure::bad_request(
                "a result goes with an `applied` verdict only",
            ))
        }
        other => {
            return Err(Failure::bad_request(format!(
                "verdict must be `applied` or `not_applied` (got {:?})",
                views::shorten(other, 40)
            )))
        }
    };
    let adapter = &state.stores.effects;
    match form.confirm.as_deref() {
        None => {
            let current = match adapter
                .key_status(&key)
                .await
                .map_err(|e| Failure::store(side_effect_error(e)))?
            {
                KeyStatus::Uncertain { reason } => format!("uncertain: {reason}"),
                KeyStatus::InFlight {
                    live: false, fence, ..
                } => {
                    format!("in flight ({fence}), lease expired: reads as uncertain")
                }
                KeyStatus::InFlight { .. } => {
                    "in flight with a live lease: the verdict will be refused".into()
                }
                KeyStatus::Completed { .. } => "completed: the verdict will be refused".into(),
                KeyStatus::Idle => "idle: the verdict will be refused".into(),
                _ => "in a state this coordctl does not know".into(),
            };
            Ok((
                "Confirm the reconcile".to_owned(),
                "/sideeffects",
                html::confirm(
                    &key,
                    &form.verdict,
                    &reason,
                    &form.result,
                    &current,
                    &state.csrf,
                ),
            ))
        }
        Some("yes") => {
            let outcome = resolve(adapter, &key, None, &verdict, &reason, CLAIM_TTL)
                .await
                .map_err(Failure::store)?;
            match outcome {
                Ok(resolved) => {
                    // The record of who decided what: the reason is stored with an
                    // applied verdict by the adapter and printed here for both.
                    println!(
                        "coordctl serve: reconciled key {key:?} as {}; reason: {reason}",
                        form.verdict
                    );
                    let what = match resolved {
                        Resolved::Completed { .. } => {
                            "the key is completed; later runs replay its result"
                        }
                        Resolved::Cleared => "the mark is cleared; the key may run again",
                    };
                    Ok((
                        "Reconciled".to_owned(),
                        "/sideeffects",
                        format!(
                            "<p class=\"note\" id=\"reconciled\">Resolved <span class=\"key\">{}</span> as <b>{}</b>: {what}.<br>Reason: {}</p>\
<p><a href=\"/sideeffects\">Back to the side-effect keys</a></p>",
                            html::esc(&key),
                            html::esc(&form.verdict),
                            html::esc(&reason)
                        ),
                    ))
                }
                Err(refused) => Err(Failure::new(
                    if refused.code == 5 {
                        StatusCode::BAD_REQUEST
                    } else {
                        StatusCode::CONFLICT
                    },
                    refused.message,
                )),
            }
        }
        Some(_) => Err(Failure::bad_request("confirm must be `yes`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost:1",
            "LOCALHOST",
            "[::1]:8080",
            "[::1]",
            "127.1.2.3:9",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "10.0.0.1:8080",
            "localhost.evil.example",
            "[::2]:80",
            "",
            "127.0.0.1.nip.io:8080",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn addresses_other_than_loopback_need_allow_remote() {
        let lan: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let err = check_addr(lan, false).unwrap_err().to_string();
        assert!(err.contains("--allow-remote"), "{err}");
        assert!(check_addr(lan, true).is_ok());
        assert!(check_addr("127.0.0.1:0".parse().unwrap(), false).is_ok());
        assert!(check_addr("[::1]:0".parse().unwrap(), false).is_ok());
    }

    #[test]
    fn limits_are_bounded() {
        assert_eq!(parse_limit(None, 7).unwrap(), 7);
        assert_eq!(parse_limit(Some("500"), 7).unwrap(), 500);
        for bad in ["0", "501", "-1", "ten", "99999999999999999999999"] {
            let f = parse_limit(Some(bad), 7).unwrap_err();
            assert_eq!(f.status, StatusCode::BAD_REQUEST);
            assert!(f.message.contains("1 to 500"), "{}", f.message);
        }
        assert!(parse_cursor(Some(&"x".repeat(MAX_TEXT + 1))).is_err());
        assert_eq!(parse_cursor(Some("")).unwrap(), None);
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            html::esc(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
    }
}
