//! An HTTP endpoint whose retries run once (feature `http`): a client that
//! timed out and retries with the same `Idempotency-Key` gets the first
//! answer back, replayed, and the handler (here: a card charge) runs once,
//! whichever instance of the service the retry reaches.
//!
//! ```sh
//! cargo run -p coord --features http --example http_idempotency
//! ```

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use coord::http::IdempotencyLayer;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let charges = Arc::new(AtomicUsize::new(0));
    let counted = charges.clone();
    let app = Router::new()
        .route(
            "/charges",
            post(move |body: Bytes| async move {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                format!("charge #{n} of {}", String::from_utf8_lossy(&body))
            }),
        )
        .layer(IdempotencyLayer::for_backend(store));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A fresh key per run of the example; a retry reuses it.
    let key = format!("order-{}", std::process::id());
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for attempt in 1..=2 {
        let request = http::Request::post(format!("http://{addr}/charges"))
            .header("Idempotency-Key", &key)
            .body(Full::new(Bytes::from_static(b"12.00 EUR")))?;
        let response = client.request(request).await?;
        let replayed = response.headers().contains_key("idempotent-replayed");
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        println!(
            "attempt {attempt}: {status} {:?}{}",
            String::from_utf8_lossy(&body),
            if replayed { " (replayed)" } else { "" }
        );
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "the card was charged once"
    );
    Ok(())
}
