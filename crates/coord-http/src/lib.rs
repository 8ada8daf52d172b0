//! An `Idempotency-Key` layer for HTTP services (a [`tower_layer::Layer`],
//! so it wraps an axum `Router` or any tower HTTP service), built on coord's
//! at-most-once side effects: a retried request runs its handler at most
//! once, across every instance of the service that shares the store.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use coord_http::IdempotencyLayer;
//!
//! let store = coord::connect("sqlite://orders.db?namespace=api").await?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/orders", axum::routing::post(|| async { "created" }))
//!     .layer(IdempotencyLayer::for_backend(store));
//! # let _ = app; Ok(()) }
//! ```
//!
//! # What a request gets
//!
//! Requests with a method the layer covers (`POST` and `PATCH` by default)
//! and an `Idempotency-Key` header (1 to 255 visible ASCII characters):
//!
//! | situation | answer |
//! | --- | --- |
//! | the key is new | the handler runs; its status, headers and body are stored with the request's fingerprint and returned |
//! | the key completed, same fingerprint | the stored response, plus `Idempotent-Replayed: true`; the handler does not run |
//! | the key completed, another fingerprint (method, path and query, or body differ) | `422 Unprocessable Content` |
//! | the key is in flight (another request with it is running) | `409 Conflict` with `Retry-After: 1` |
//! | the outcome of an earlier run is unknown (its handler panicked or failed, its server died mid-request, or the store lost the answer) | `500 Internal Server Error` whose body names `coordctl reconcile` |
//! | the store is unreachable before anything ran | `503 Service Unavailable` with `Retry-After: 1` |
//! | the key is malformed, or missing when [`IdempotencyOptions::required`] | `400 Bad Request` |
//! | the body is larger than [`IdempotencyOptions::max_body_bytes`] | `413 Content Too Large` |
//!
//! Other requests pass through untouched. Errors are `application/problem+json`.
//!
//! # The contract, and its boundary
//!
//! Each key is one side effect (`coord_adapters::sideeffect`) named
//! [`IdempotencyOptions::key_prefix`] + the header's value: one atomic
//! decision grants the run, and the response is stored in the same step
//! that completes the key. So two requests with one key never both run
//! the handler, whichever instances they reach, as long as those share the
//! store (and namespace). What the handler did before a crash is not known
//! to anyone: a run that ended without its response stored (panic, service
//! error, killed server, lost store answer) makes the key **uncertain**,
//! never "not run". An operator checks what the handler did downstream and
//! resolves it: `coordctl reconcile http/KEY --store URL --not-applied
//! --reason ...` lets the key run again; `--applied --result TEXT` replays
//! `TEXT` as a `200` body from then on.
//!
//! The handler holds the key for [`IdempotencyOptions::lease`] (60 s by
//! default): set it above your slowest handler. A run that outlives it is
//! still answered, but its key may be judged uncertain by then.
//!
//! Stored responses stay until side-effect retention removes them
//! (`coordctl gc --side-effects-retention 24h`, or
//! `MaintenanceOptions::side_effects_retention`; off by default, so keys
//! are kept forever); after that a key is new again.
//!
//! # Compared with Stripe
//!
//! Stripe's API (the model most clients follow) stores the first response
//! of a key, errors included, and replays it with `Idempotent-Replayed:
//! true`; answers `409` to a request whose key is still being processed;
//! rejects a key reused with other parameters; keeps keys at least 24
//! hours. This layer does the same (a handler's `5xx` is stored and
//! replayed like any response), answers `422` for a reused key as the IETF
//! draft `Idempotency-Key` header does (Stripe answers `400`), and differs
//! where Stripe cannot be copied: Stripe does not store a result when a
//! request fails before or inside its own processing and lets it run again;
//! this layer cannot know whether an interrupted handler already charged a
//! card, so it says `500` + reconcile instead of running it twice.

mod record;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use coord_adapters::sideeffect::{
    Action, EffectResult, Execution, Outcome, Runner, SideEffectAdapter, SideEffectError,
    SideEffectStore,
};
use coord_backend::Backend;
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

pub use record::request_fingerprint;
use record::StoredResponse;

/// The header a replayed response carries (`true`), as Stripe's API does.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A boxed error, as the body types' errors are converted to.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a request is fingerprinted: from its head and its whole body.
pub type Fingerprint = fn(&http::request::Parts, &[u8]) -> String;

/// The layer's settings (`Default` + one `with_*` per field).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct IdempotencyOptions {
    /// The header holding the key. Default `Idempotency-Key`.
    pub header: HeaderName,
    /// Prepended to each key to name its side effect (and its resource):
    /// keeps the HTTP keys apart from other side effects of the namespace.
    /// Default `http/`.
    pub key_prefix: String,
    /// How long a running request holds its key. Default 60 s.
    pub lease: Duration,
    /// The largest request body, and the largest response body, the layer
    /// reads (both are held in memory; a larger request is `413`, a larger
    /// response ends its key uncertain). Default 1 MiB.
    pub max_body_bytes: usize,
    /// Whether a request of a covered method without the header is refused
    /// (`400`) instead of passed through. Default `false`.
    pub required: bool,
    /// The methods the layer covers. Default `POST`, `PATCH`.
    pub methods: Vec<Method>,
    /// How a request is fingerprinted. Default [`request_fingerprint`].
    pub fingerprint: Fingerprint,
}

impl Default for IdempotencyOptions {
    fn default() -> Self {
        IdempotencyOptions {
            header: HeaderName::from_static("idempotency-key"),
            key_prefix: "http/".into(),
            lease: Duration::from_secs(60),
            max_body_bytes: 1 << 20,
            required: false,
            methods: vec![Method::POST, Method::PATCH],
            fingerprint: request_fingerprint,
        }
    }
}

coord_backend::setters! {
    IdempotencyOptions {
        /// The same options reading the key from `header`.
        with_header(header: HeaderName) => header = header;
        /// The same options with another key prefix.
        with_key_prefix(key_prefix: impl Into<String>) => key_prefix = key_prefix.into();
        /// The same options with another lease.
        with_lease(lease: Duration) => lease = lease;
        /// The same options with another body limit.
        with_max_body_bytes(max_body_bytes: usize) => max_body_bytes = max_body_bytes;
        /// The same options, refusing covered requests without a key or not.
        with_required(required: bool) => required = required;
        /// The same options covering `methods`.
        with_methods(methods: Vec<Method>) => methods = methods;
        /// The same options with another fingerprint.
        with_fingerprint(fingerprint: Fingerprint) => fingerprint = fingerprint;
    }
}

/// The layer: wraps a service in an [`IdempotencyService`].
#[derive(Clone, Debug)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    runner: Runner,
    options: IdempotencyOptions,
}

impl IdempotencyLayer {
    /// A layer over the side effects of `store`, default options.
    pub fn new(store: Arc<dyn SideEffectStore>) -> Self {
        Self::with_options(store, IdempotencyOptions::default())
    }

    /// A layer over the side effects of `store`.
    pub fn with_options(store: Arc<dyn SideEffectStore>, options: IdempotencyOptions) -> Self {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                runner: Runner::new(store),
                options,
            }),
        }
    }

    /// A layer over a store connection (`coord::connect`), default options.
    pub fn for_backend(backend: Arc<dyn Backend>) -> Self {
        Self::new(Arc::new(SideEffectAdapter::new(backend)))
    }

    /// The options in force.
    pub fn options(&self) -> &IdempotencyOptions {
        &self.shared.options
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`IdempotencyLayer`] makes. Request and response bodies keep
/// their types (rebuilt from the bytes read), so it slots into an axum
/// `Router` with `.layer(...)`.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + From<Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The instance polled ready serves this request; a clone waits for the next.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(handle(self.shared.clone(), inner, request))
    }
}

async fn handle<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + From<Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let options = &shared.options;
    if !options.methods.contains(request.method()) {
        return inner.call(request).await;
    }
    let key = match request.headers().get(&options.header) {
        None if options.required => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                &format!("this request needs an {} header", options.header),
            ))
        }
        None => return inner.call(request).await,
        Some(value) => match valid_key(value) {
            Some(key) => key,
            None => {
                return Ok(problem(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "{} must be 1 to 255 visible ASCII characters",
                        options.header
                    ),
                ))
            }
        },
    };
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, options.max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => {
            return Ok(problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the body is larger than the {} bytes this endpoint reads",
                    options.max_body_bytes
                ),
            ))
        }
        Err(error) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                &format!("the request body could not be read: {error}"),
            ))
        }
    };
    let fingerprint = (options.fingerprint)(&parts, &body);
    let name = format!("{}{key}", options.key_prefix);
    let action = Action::new(name.clone(), name.clone()).with_payload(fingerprint.clone());
    // What the handler answered (kept when its run ends in doubt after it
    // answered), and the inner service's own error.
    let answered: Arc<Mutex<Option<StoredResponse>>> = Arc::default();
    let failed: Arc<Mutex<Option<S::Error>>> = Arc::new(Mutex::new(None));
    let run = {
        let (answered, failed, fingerprint) =
            (answered.clone(), failed.clone(), fingerprint.clone());
        let max = options.max_body_bytes;
        shared
            .runner
            .execute(&action, options.lease, move |_lease| async move {
                let request = Request::from_parts(parts, ReqBody::from(body));
                let response = match AssertUnwindSafe(inner.call(request)).catch_unwind().await {
                    Ok(Ok(response)) => response,
                    Ok(Err(error)) => {
                        *lock(&failed) = Some(error);
                        return Err(BoxError::from("the service failed"));
                    }
                    Err(_) => return Err(BoxError::from("the handler panicked")),
                };
                let (head, body) = response.into_parts();
                let body = Limited::new(body, max)
                    .collect()
                    .await
                    .map_err(|e| format!("the response body could not be read whole: {e}"))?
                    .to_bytes();
                let stored = StoredResponse::new(fingerprint, head.status, &head.headers, body);
                let bytes = stored.encode();
                *lock(&answered) = Some(stored);
                Ok::<_, BoxError>(EffectResult(bytes))
            })
            .await
    };
    if let Some(error) = lock(&failed).take() {
        return Err(error);
    }
    let answered = lock(&answered).take();
    Ok(match run {
        Ok(Execution {
            outcome: Outcome::Applied,
            result,
        }) => match answered.or_else(|| result.and_then(|r| StoredResponse::decode(&r.0))) {
            Some(stored) => respond(stored, false),
            None => problem(StatusCode::INTERNAL_SERVER_ERROR, "the response was lost"),
        },
        Ok(Execution {
            outcome: Outcome::Replayed,
            result,
        }) => replay(&result.unwrap_or_default(), &fingerprint, &key),
        Ok(Execution {
            outcome: Outcome::Contended,
            ..
        }) => with_retry_after(problem(
            StatusCode::CONFLICT,
            "a request with this idempotency key is in progress: retry later",
        )),
        Ok(Execution {
            outcome: Outcome::Uncertain,
            ..
        }) => uncertain(&name),
        // The handler answered but its completion was not stored: the client
        // gets what the handler did; the key stays uncertain for everyone else.
        Err(SideEffectError::OutcomeUnknown { .. }) if answered.is_some() => {
            answered.map_or_else(|| uncertain(&name), |stored| respond(stored, false))
        }
        Err(SideEffectError::OutcomeUnknown { .. }) => uncertain(&name),
        Err(SideEffectError::InvalidAction(why)) => problem(
            StatusCode::BAD_REQUEST,
            &format!("this idempotency key cannot be stored: {why}"),
        ),
        // Nothing ran: the store was unreachable, or the grant ended before
        // the handler was called.
        Err(error @ (SideEffectError::Store(_) | SideEffectError::LeaseLost)) => {
            tracing::warn!(%error, "idempotency key not decided");
            with_retry_after(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the idempotency store is unavailable: nothing was done, retry later",
            ))
        }
        Err(error) => {
            tracing::warn!(%error, "idempotency key not decided");
            problem(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string())
        }
    })
}

fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// The key in `value`: 1 to 255 visible ASCII characters.
fn valid_key(value: &HeaderValue) -> Option<String> {
    let key = value.to_str().ok()?;
    let visible = key.bytes().all(|b| b.is_ascii_graphic());
    (visible && (1..=255).contains(&key.len())).then(|| key.to_owned())
}

/// The stored result of a completed key, for a request of `fingerprint`.
fn replay<B: From<Bytes>>(result: &EffectResult, fingerprint: &str, key: &str) -> Response<B> {
    match StoredResponse::decode(&result.0) {
        Some(stored) if stored.fingerprint != fingerprint => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!(
                "idempotency key {key:?} was used by a request with another method, target or \
                 body: use a new key for a new request"
            ),
        ),
        Some(stored) => respond(stored, true),
        // A result an operator stored by hand (`coordctl reconcile --applied
        // --result TEXT`): its text, as a 200.
        None => respond(
            StoredResponse::new(
                fingerprint.to_owned(),
                StatusCode::OK,
                &http::HeaderMap::new(),
                Bytes::copy_from_slice(&result.0),
            ),
            true,
        ),
    }
}

fn respond<B: From<Bytes>>(stored: StoredResponse, replayed: bool) -> Response<B> {
    let mut response = Response::new(B::from(stored.body));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    if replayed {
        response.headers_mut().insert(
            HeaderName::from_static(REPLAYED_HEADER),
            HeaderValue::from_static("true"),
        );
    }
    response
}

fn uncertain<B: From<Bytes>>(name: &str) -> Response<B> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!(
            "an earlier request with this idempotency key may or may not have been carried out \
             (it was interrupted); it will not run again on a guess. An operator must check and \
             resolve it: coordctl reconcile '{name}' --store URL --not-applied --reason '...' \
             (or --applied --result TEXT)"
        ),
    )
}

fn with_retry_after<B>(mut response: Response<B>) -> Response<B> {
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// An `application/problem+json` answer (RFC 9457).
fn problem<B: From<Bytes>>(status: StatusCode, detail: &str) -> Response<B> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(B::from(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
