//! The idempotency layer in a real axum server, called by a real HTTP client
//! (hyper), over SQLite, Redis and PostgreSQL (`COORD_TEST_REDIS_URL`,
//! `COORD_TEST_POSTGRES_URL`; SKIPPED without them unless
//! `COORD_REQUIRE_SERVERS=1`). Every case runs on every store; two
//! deliberately broken layers (no fingerprint check, no in-flight check)
//! must fail it; a server process killed mid-request leaves its key
//! uncertain, never run twice.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use coord_adapters::sideeffect::{
    Acquired, Action, EffectResult, Execution, Lease, ReconcileClaim, Resolution,
    SideEffectAdapter, SideEffectError, SideEffectStore,
};
use coord_http::{IdempotencyLayer, IdempotencyOptions, REPLAYED_HEADER};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Notify, Semaphore};

type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

// ------------------------------------------------------------------ stores

/// The stores the suite runs on: (name, URL without a namespace).
fn stores(sqlite_dir: &tempfile::TempDir) -> Vec<(&'static str, String)> {
    let mut stores = vec![(
        "sqlite",
        format!("sqlite://{}", sqlite_dir.path().join("http.db").display()),
    )];
    if let Some(url) = coord_conformance::server_env("COORD_TEST_REDIS_URL") {
        stores.push(("redis", url));
    }
    if let Some(url) = coord_conformance::server_env("COORD_TEST_POSTGRES_URL") {
        stores.push(("postgres", url));
    }
    stores
}

fn in_namespace(url: &str, label: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!(
        "{url}{separator}namespace={}",
        coord_conformance::unique_namespace(label)
    )
}

async fn side_effects(url: &str) -> Arc<dyn SideEffectStore> {
    let backend = coord::connect(url).await.expect("a store");
    Arc::new(SideEffectAdapter::new(backend))
}

// ------------------------------------------------------------------ the app

/// What the handlers did.
struct Handlers {
    /// Runs of `/orders` and `/slow`.
    runs: AtomicUsize,
    /// Runs of `/panic`.
    panics: AtomicUsize,
    /// `/slow` waits for a permit here.
    gate: Semaphore,
    /// Notified when `/slow` starts.
    started: Notify,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers {
            runs: AtomicUsize::new(0),
            panics: AtomicUsize::new(0),
            gate: Semaphore::new(0),
            started: Notify::new(),
        }
    }
}

fn app(layer: IdempotencyLayer, handlers: Arc<Handlers>) -> Router {
    Router::new()
        .route(
            "/orders",
            post(|State(h): State<Arc<Handlers>>, body: Bytes| async move {
                let n = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    [("x-order", n.to_string())],
                    format!("order {n}: {}", String::from_utf8_lossy(&body)),
                )
            }),
        )
        .route(
            "/slow",
            post(|State(h): State<Arc<Handlers>>| async move {
                h.runs.fetch_add(1, Ordering::SeqCst);
                h.started.notify_one();
                h.gate.acquire().await.expect("gate open").forget();
                (StatusCode::CREATED, "slow done")
            }),
        )
        .route(
            "/panic",
            post(|State(h): State<Arc<Handlers>>| async move {
                h.panics.fetch_add(1, Ordering::SeqCst);
                if h.panics.load(Ordering::SeqCst) > 0 {
                    panic!("a handler bug (on purpose)");
                }
                "unreachable"
            }),
        )
        .layer(layer)
        .with_state(handlers)
}

/// A server on a free loopback port.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

// ------------------------------------------------------------------ the client

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers
            .get(REPLAYED_HEADER)
            .is_some_and(|v| v == "true")
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?} {:?}", self.status, self.headers, self.body)
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Result<Answer, String> {
    let mut request = Request::post(format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| e.to_string())?;
    let response = client()
        .request(request)
        .await
        .map_err(|e| format!("POST {path}: {e}"))?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

// ------------------------------------------------------------------ the cases

/// The cases, each over a fresh namespace of the store at `url`, through
/// layers made by `layer` (the real one, or a broken one).
type MakeLayer = fn(Arc<dyn SideEffectStore>) -> IdempotencyLayer;

async fn server(url: &str, label: &str, layer: MakeLayer) -> (SocketAddr, Arc<Handlers>) {
    let store = side_effects(&in_namespace(url, label)).await;
    let handlers = Arc::new(Handlers::default());
    let addr = serve(app(layer(store), handlers.clone())).await;
    (addr, handlers)
}

/// Same key, same request: the first answer, replayed; the handler ran once.
async fn replays_the_first_answer(url: &str, layer: MakeLayer) -> Check {
    let (addr, handlers) = server(url, "replay", layer).await;
    let first = send(addr, "/orders", Some("k1"), "two apples").await?;
    ensure!(
        first.status == StatusCode::CREATED && !first.replayed(),
        "first request: {first:?}"
    );
    for _ in 0..2 {
        let again = send(addr, "/orders", Some("k1"), "two apples").await?;
        ensure!(
            again.status == first.status
                && again.body == first.body
                && again.headers.get("x-order") == first.headers.get("x-order")
                && again.replayed(),
            "a retry is not the first answer replayed: {again:?} (first {first:?})"
        );
    }
    let runs = handlers.runs.load(Ordering::SeqCst);
    ensure!(runs == 1, "the handler ran {runs} times for one key");
    let other = send(addr, "/orders", Some("k2"), "two apples").await?;
    ensure!(
        other.status == StatusCode::CREATED && !other.replayed(),
        "another key is another request: {other:?}"
    );
    Ok(())
}

/// Same key, another body or target: 422, the handler not run again.
async fn refuses_a_key_reused_for_another_request(url: &str, layer: MakeLayer) -> Check {
    let (addr, handlers) = server(url, "reuse", layer).await;
    send(addr, "/orders", Some("k"), "two apples").await?;
    for (path, body) in [("/orders", "three pears"), ("/orders?x=1", "two apples")] {
        let reused = send(addr, path, Some("k"), body).await?;
        ensure!(
            reused.status == StatusCode::UNPROCESSABLE_ENTITY,
            "key reused for {path} {body:?}: {reused:?}"
        );
    }
    let runs = handlers.runs.load(Ordering::SeqCst);
    ensure!(runs == 1, "the handler ran {runs} times");
    Ok(())
}

/// Duplicates while the first is running: 409 with Retry-After; the
/// handler runs once; afterwards the key replays. Then 8 duplicates sent
/// at once: one handler run.
async fn concurrent_duplicates_run_once(url: &str, layer: MakeLayer) -> Check {
    let (addr, handlers) = server(url, "concurrent", layer).await;
    let first = tokio::spawn(async move { send(addr, "/slow", Some("k"), "").await });
    handlers.started.notified().await;
    let duplicates: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { send(addr, "/slow", Some("k"), "").await }))
        .collect();
    for duplicate in duplicates {
        // A duplicate let through runs the handler, which waits at the gate.
        let answer = tokio::time::timeout(Duration::from_secs(10), duplicate)
            .await
            .map_err(|_| {
                let runs = handlers.runs.load(Ordering::SeqCst);
                format!("a duplicate of a running request got no answer: it runs the handler ({runs} runs)")
            })?
            .map_err(|e| e.to_string())??;
        ensure!(
            answer.status == StatusCode::CONFLICT && answer.headers.get("retry-after").is_some(),
            "a duplicate of a running request: {answer:?}"
        );
    }
    handlers.gate.add_permits(1);
    let first = first.await.map_err(|e| e.to_string())??;
    ensure!(first.status == StatusCode::CREATED, "first: {first:?}");
    let after = send(addr, "/slow", Some("k"), "").await?;
    ensure!(after.replayed(), "after the first ended: {after:?}");

    handlers.gate.add_permits(64);
    let racing: Vec<_> = (0..8)
        .map(|_| tokio::spawn(async move { send(addr, "/slow", Some("race"), "").await }))
        .collect();
    let mut created = 0;
    for answer in racing {
        let answer = answer.await.map_err(|e| e.to_string())??;
        match answer.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {}
            _ => return Err(format!("a racing duplicate: {answer:?}")),
        }
    }
    let runs = handlers.runs.load(Ordering::SeqCst);
    ensure!(
        runs == 2 && created >= 1,
        "8 racing duplicates ran the handler {} times ({created} answered 201)",
        runs - 1
    );
    Ok(())
}

/// A handler that panics: 500 naming `coordctl reconcile`, and the key
/// stays uncertain (never run again on a guess).
async fn a_panic_leaves_the_key_uncertain(url: &str, layer: MakeLayer) -> Check {
    let (addr, handlers) = server(url, "panic", layer).await;
    for attempt in 0..2 {
        let answer = send(addr, "/panic", Some("k"), "").await?;
        ensure!(
            answer.status == StatusCode::INTERNAL_SERVER_ERROR
                && answer.body.contains("coordctl reconcile"),
            "attempt {attempt} after a panic: {answer:?}"
        );
    }
    let panics = handlers.panics.load(Ordering::SeqCst);
    ensure!(panics == 1, "the panicking handler ran {panics} times");
    Ok(())
}

/// Without a key, requests pass through; malformed keys are 400.
async fn requests_without_a_key_pass_through(url: &str, layer: MakeLayer) -> Check {
    let (addr, handlers) = server(url, "no_key", layer).await;
    for _ in 0..2 {
        let answer = send(addr, "/orders", None, "x").await?;
        ensure!(answer.status == StatusCode::CREATED, "no key: {answer:?}");
    }
    let long = "k".repeat(256);
    for bad in ["", long.as_str()] {
        let answer = send(addr, "/orders", Some(bad), "x").await?;
        ensure!(
            answer.status == StatusCode::BAD_REQUEST,
            "key of {} characters: {answer:?}",
            bad.len()
        );
    }
    let runs = handlers.runs.load(Ordering::SeqCst);
    ensure!(runs == 2, "the handler ran {runs} times, not 2");
    Ok(())
}

/// Every case on the store at `url`: the failures, by name.
async fn suite(url: &str, layer: MakeLayer) -> Vec<String> {
    let mut failed = Vec::new();
    macro_rules! run {
        ($($case:ident),*) => {$(
            if let Err(why) = $case(url, layer).await {
                eprintln!("{}: {why}", stringify!($case));
                failed.push(stringify!($case).to_owned());
            }
        )*};
    }
    run!(
        replays_the_first_answer,
        refuses_a_key_reused_for_another_request,
        concurrent_duplicates_run_once,
        a_panic_leaves_the_key_uncertain,
        requests_without_a_key_pass_through
    );
    failed
}

fn real_layer(store: Arc<dyn SideEffectStore>) -> IdempotencyLayer {
    IdempotencyLayer::new(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_on_every_store() {
    let dir = tempfile::tempdir().expect("a temp dir");
    for (name, url) in stores(&dir) {
        let failed = suite(&url, real_layer).await;
        assert!(failed.is_empty(), "{name}: {failed:?}");
    }
}

// ------------------------------------------------------------------ broken layers

/// A layer that fingerprints nothing: a reused key replays another request's answer.
fn no_fingerprint_check(store: Arc<dyn SideEffectStore>) -> IdempotencyLayer {
    IdempotencyLayer::with_options(
        store,
        IdempotencyOptions::default().with_fingerprint(|_, _| String::new()),
    )
}

/// A store that grants a key that is in flight (no in-flight check).
#[derive(Debug)]
struct NoInFlightCheck(Arc<dyn SideEffectStore>);

#[async_trait]
impl SideEffectStore for NoInFlightCheck {
    async fn acquire(&self, action: &Action, ttl: Duration) -> Result<Acquired, SideEffectError> {
        match self.0.acquire(action, ttl).await? {
            Acquired::Contended => Ok(Acquired::Applied(Lease {
                resource: action.resource.clone(),
                fence: coord_adapters::sideeffect::Fence(u64::MAX),
                token: "forged".into(),
                holder: action.key.clone(),
                expires_at: std::time::SystemTime::now() + ttl,
            })),
            other => Ok(other),
        }
    }
    async fn complete(
        &self,
        action: &Action,
        lease: &Lease,
        result: EffectResult,
    ) -> Result<EffectResult, SideEffectError> {
        self.0.complete(action, lease, result).await
    }
    async fn release(&self, action: &Action, lease: &Lease) -> Result<(), SideEffectError> {
        self.0.release(action, lease).await
    }
    async fn renew(
        &self,
        action: &Action,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease, SideEffectError> {
        match self.0.renew(action, lease, ttl).await {
            Err(_) if lease.token == "forged" => Ok(lease.clone()),
            other => other,
        }
    }
    async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.0.mark_uncertain(action, lease, reason).await
    }
    async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Execution, SideEffectError> {
        self.0.resolve_uncertain(action, resolution).await
    }
    async fn abandon(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.0.abandon(action, lease, reason).await
    }
    async fn begin_reconcile(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError> {
        self.0.begin_reconcile(action, ttl).await
    }
    async fn resolve_uncertain_owned(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: &str,
    ) -> Result<Execution, SideEffectError> {
        self.0
            .resolve_uncertain_owned(action, resolution, holder)
            .await
    }
}

fn no_in_flight_check(store: Arc<dyn SideEffectStore>) -> IdempotencyLayer {
    IdempotencyLayer::new(Arc::new(NoInFlightCheck(store)))
}

/// The suite goes red on each broken layer, on SQLite, in the case that
/// names its defect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_fails_broken_layers() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = stores(&dir).remove(0).1;
    let failed = suite(&url, no_fingerprint_check).await;
    assert_eq!(failed, ["refuses_a_key_reused_for_another_request"]);
    let failed = suite(&url, no_in_flight_check).await;
    assert!(
        failed.contains(&"concurrent_duplicates_run_once".to_owned()),
        "{failed:?}"
    );
}

// ------------------------------------------------------------------ a server killed mid-request

const CHILD_STORE: &str = "COORD_HTTP_TEST_CHILD_STORE";
const CHILD_HOLD: &str = "COORD_HTTP_TEST_CHILD_HOLD";
const CHILD_LEASE: Duration = Duration::from_secs(2);

/// Not a check: the server process the kill test starts (twice), run as
/// `<this binary> --ignored --exact child_server` with the store in
/// `COORD_HTTP_TEST_CHILD_STORE`. It prints `listening <port>`, then
/// `started` each time `/slow` starts; with `COORD_HTTP_TEST_CHILD_HOLD=1`
/// `/slow` never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the kill test's server process, started by it"]
async fn child_server() {
    let Ok(url) = std::env::var(CHILD_STORE) else {
        return;
    };
    let hold = std::env::var(CHILD_HOLD).as_deref() == Ok("1");
    let layer = IdempotencyLayer::with_options(
        side_effects(&url).await,
        IdempotencyOptions::default().with_lease(CHILD_LEASE),
    );
    let router = Router::new()
        .route(
            "/slow",
            post(move || async move {
                println!("started");
                if hold {
                    std::future::pending::<()>().await;
                }
                (StatusCode::CREATED, "slow done")
            }),
        )
        .layer(layer);
    let addr = serve(router).await;
    println!("listening {}", addr.port());
    std::future::pending::<()>().await;
}

struct ChildServer {
    child: Child,
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildServer {
    fn start(url: &str, hold: bool) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--ignored", "--exact", "child_server", "--nocapture"])
            .env(CHILD_STORE, url)
            .env(CHILD_HOLD, if hold { "1" } else { "0" })
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server process");
        let stdout = BufReader::new(child.stdout.take().expect("its stdout"));
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let seen = lines.clone();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Some(port) = line.strip_prefix("listening ") {
                    let _ = port_tx.send(port.trim().parse::<u16>().ok());
                }
                seen.lock().unwrap().push(line);
            }
        });
        let port = port_rx
            .recv_timeout(Duration::from_secs(60))
            .ok()
            .flatten()
            .expect("the server process listens");
        ChildServer {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            lines,
        }
    }

    fn starts(&self) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| *l == "started")
            .count()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server process is SIGKILLed while its handler runs. A new process
/// on the same store answers the retry with 409 while the dead run's lease
/// lasts, then with 500 naming `coordctl reconcile`, and never runs the
/// handler; once an operator resolves the key as not applied, it runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_request_leaves_the_key_uncertain() {
    let dir = tempfile::tempdir().expect("a temp dir");
    for (name, base) in stores(&dir) {
        let url = in_namespace(&base, "killed");
        let mut first = ChildServer::start(&url, true);
        let addr = first.addr;
        let request = tokio::spawn(async move { send(addr, "/slow", Some("k"), "").await });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while first.starts() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: the handler never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        first.child.kill().expect("SIGKILL");
        first.child.wait().expect("the killed server exits");
        assert!(
            request.await.unwrap().is_err(),
            "{name}: a killed server answered"
        );

        let second = ChildServer::start(&url, false);
        let mut answers = Vec::new();
        let deadline = std::time::Instant::now() + CHILD_LEASE * 10;
        loop {
            let answer = send(second.addr, "/slow", Some("k"), "").await.unwrap();
            let status = answer.status;
            answers.push(status);
            if status == StatusCode::INTERNAL_SERVER_ERROR {
                assert!(
                    answer.body.contains("coordctl reconcile"),
                    "{name}: {answer:?}"
                );
                break;
            }
            assert_eq!(
                status,
                StatusCode::CONFLICT,
                "{name}: {answer:?} after {answers:?}"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: still in flight: {answers:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            second.starts(),
            0,
            "{name}: the handler ran again: {answers:?}"
        );

        let store = side_effects(&url).await;
        let action = Action::new("http/k", "http/k");
        store
            .resolve_uncertain(
                &action,
                &Resolution::not_applied("checked downstream: nothing was made"),
            )
            .await
            .expect("resolved");
        let answer = send(second.addr, "/slow", Some("k"), "").await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{name}: {answer:?}");
        let replay = send(second.addr, "/slow", Some("k"), "").await.unwrap();
        assert!(replay.replayed(), "{name}: {replay:?}");
        assert_eq!(second.starts(), 1, "{name}");
    }
}
