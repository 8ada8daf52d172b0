//! The middleware in front of every route. While the console is not started
//! with `--allow-remote`, a request whose `Host` is not a loopback name is
//! refused with a plain 403 that names no store, so a DNS-rebinding page
//! learns nothing. Every answer, refused or not, carries the headers that
//! forbid scripts, framing, foreign form targets, sniffing, referrers and
//! caching.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;

/// Whether a `Host` header names this machine's loopback (`localhost`,
/// `127.x.y.z`, `[::1]`, with or without a port).
pub(super) fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub(super) async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
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
