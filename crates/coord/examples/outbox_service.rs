//! A transactional outbox in an HTTP service (docs/outbox.md): `POST /orders`
//! records the order row AND its confirmation-mail intent in ONE SQL
//! transaction; a dispatcher task beside the server "sends" each mail (prints
//! it) at most once. main() posts two orders, one of them twice (a client
//! retry): two rows, two mails.
//!
//! Runs on PostgreSQL when `COORD_STORE` is a `postgres://` URL, on SQLite
//! otherwise (the examples' SQLite file, or the file a `sqlite://` URL names).

#[path = "common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use coord::adapters::outbox::{HandlerError, Outbox};
use coord::backend::{Backend, StoreUrl};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application's own database: its pool, next to coord's records.
#[derive(Clone)]
enum Db {
    Postgres(sqlx::PgPool, String),
    Sqlite(sqlx::SqlitePool, String),
}

impl Db {
    /// Record the order and its mail intent: both commit, or neither.
    async fn place_order(&self, id: &str, email: &str) -> Result<(), BoxError> {
        let mail = format!("to: {email}\nsubject: order {id} confirmed").into_bytes();
        match self {
            Db::Postgres(pool, namespace) => {
                let tx = coord::postgres::InTransaction::begin(pool, namespace).await?;
                sqlx::query("INSERT INTO example_orders (id, email) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING")
                    .bind(id)
                    .bind(email)
                    .execute(&mut *tx.conn().await?)
                    .await?;
                // Same key, same payload: a retried POST enqueues nothing new.
                Outbox::new(tx.clone(), "mail")?.enqueue(id, mail).await?;
                tx.commit().await?;
            }
            Db::Sqlite(pool, namespace) => {
                let tx = coord::sqlite::InTransaction::begin(pool, namespace).await?;
                sqlx::query("INSERT INTO example_orders (id, email) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING")
                    .bind(id)
                    .bind(email)
                    .execute(&mut *tx.conn().await?)
                    .await?;
                Outbox::new(tx.clone(), "mail")?.enqueue(id, mail).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

/// `POST /orders` with body `ORDER_ID EMAIL`.
async fn post_order(State(db): State<Db>, body: Bytes) -> (StatusCode, String) {
    let text = String::from_utf8_lossy(&body).into_owned();
    let Some((id, email)) = text.split_once(' ') else {
        return (StatusCode::BAD_REQUEST, "expected `ORDER_ID EMAIL`".into());
    };
    match db.place_order(id, email).await {
        Ok(()) => (StatusCode::ACCEPTED, format!("order {id} accepted")),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("try again: {e}")),
    }
}

/// The application's pool and coord's store (for the dispatcher), on the
/// same database. `memory://` (how scripts/test runs every example) has no
/// SQL transactions: it falls back to a SQLite file in the temp directory.
async fn open() -> Result<(Db, Arc<dyn Backend>, Option<std::path::PathBuf>), BoxError> {
    let url = common::store_url();
    let parsed = StoreUrl::parse(&url)?;
    let namespace = parsed.namespace().to_owned();
    let without_query = url.split('?').next().unwrap_or(&url).to_owned();
    let create =
        "CREATE TABLE IF NOT EXISTS example_orders (id TEXT PRIMARY KEY, email TEXT NOT NULL)";
    if parsed.scheme().starts_with("postgres") {
        let store = coord::connect(&url).await?; // creates coord's schema
        let pool = sqlx::PgPool::connect(&without_query).await?;
        sqlx::query(create).execute(&pool).await?;
        return Ok((Db::Postgres(pool, namespace), store, None));
    }
    let (path, scratch) = match without_query.strip_prefix("sqlite://") {
        Some(path) => (std::path::PathBuf::from(path), false),
        None => {
            let file = format!("coord-outbox-example-{}.db", std::process::id());
            (std::env::temp_dir().join(file), true)
        }
    };
    let store = coord::sqlite::SqliteBackend::open(&path, &namespace).await?;
    let pool = sqlx::SqlitePool::connect_with(coord::sqlite::pool_options(&path)).await?;
    sqlx::query(create).execute(&pool).await?;
    let scratch = scratch.then_some(path);
    Ok((Db::Sqlite(pool, namespace), Arc::new(store), scratch))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (db, store, scratch) = open().await?;
    let app = Router::new()
        .route("/orders", post(post_order))
        .with_state(db);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The dispatcher: takes each committed intent once and "sends" it.
    let sent = Arc::new(Mutex::new(Vec::<String>::new()));
    let dispatcher = Outbox::new(store, "mail")?.dispatcher("mailer-1");
    let log = sent.clone();
    tokio::spawn(async move {
        dispatcher
            .run(
                |intent| {
                    let log = log.clone();
                    async move {
                        let mail =
                            String::from_utf8(intent.payload).map_err(HandlerError::not_applied)?;
                        println!("sending (fence {}):\n{mail}", intent.fence);
                        log.lock().unwrap().push(intent.key);
                        Ok::<_, HandlerError>(b"sent".to_vec())
                    }
                },
                |done| println!("dispatched: {done:?}"),
                std::future::pending(),
            )
            .await;
    });

    // Fresh order ids per run (the SQLite file outlives it).
    let run = std::process::id();
    let (first, second) = (format!("order-{run}-1"), format!("order-{run}-2"));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for body in [
        format!("{first} ada@example.invalid"),
        format!("{first} ada@example.invalid"), // a client retry
        format!("{second} grace@example.invalid"),
    ] {
        let request = http::Request::post(format!("http://{addr}/orders"))
            .body(Full::new(Bytes::from(body)))?;
        let response = client.request(request).await?;
        let status = response.status();
        let text = response.into_body().collect().await?.to_bytes();
        println!("POST /orders: {status} {}", String::from_utf8_lossy(&text));
        assert_eq!(status, StatusCode::ACCEPTED);
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Only this run's orders (an earlier run may have left intents).
        let mut keys: Vec<String> = sent
            .lock()
            .unwrap()
            .iter()
            .filter(|k| k.starts_with(&format!("order-{run}-")))
            .cloned()
            .collect();
        keys.sort();
        if keys == [first.clone(), second.clone()] {
            break;
        }
        assert!(keys.len() <= 2, "a mail was sent twice: {keys:?}");
        assert!(
            Instant::now() < deadline,
            "mails not sent in time: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("two orders, one retried: two mails, each sent once");
    if let Some(path) = scratch {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    Ok(())
}
