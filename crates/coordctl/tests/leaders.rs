//! `coordctl serve` shows who holds what for elections and read-write locks:
//! a SQLite store is seeded through the adapters (an election with a live
//! leader, one whose leader resigned, a key with two readers, a key with a
//! writer and one with a queued writer behind a reader), then `/api/elections`,
//! `/api/rwlocks` and the `/leaders` page must show exactly those holders,
//! with no token and no announced value.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::election::{Election, GenericElection};
use coord_adapters::rwlock::{GenericRwLock, RwLock};
use serde_json::Value;

mod common;
use common::{unique, Scratch};

const COORDCTL: &str = env!("CARGO_BIN_EXE_coordctl");
const HOUR: Duration = Duration::from_secs(3_600);
const SECRET_VALUE: &str = "announced-value-not-for-the-console";

struct Serve(Child, String);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(url: &str) -> Serve {
    let mut child = Command::new(COORDCTL)
        .args(["serve", "--store", url, "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("coordctl serve starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .expect("coordctl serve prints its address");
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .trim()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "console never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    Serve(child, addr)
}

fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("console reachable");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, body.to_owned())
}

fn find<'v>(list: &'v Value, field: &str, value: &str) -> &'v Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .find(|item| item[field] == value)
        .unwrap_or_else(|| panic!("no {field}={value:?} in {list}"))
}

#[test]
fn leaders_and_rwlock_holders_are_shown() {
    let scratch = Scratch::new("leaders");
    let url = format!(
        "sqlite://{}?namespace={}",
        scratch.0.join("coord.db").display(),
        unique("leaders")
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tokens = runtime.block_on(async {
        let backend = coord::connect(&url).await.expect("store reachable");
        let election = GenericElection::new(backend.clone());
        let lead = election
            .try_campaign("scheduler", "node-a", SECRET_VALUE, HOUR)
            .await
            .unwrap()
            .expect("leads");
        let gone = election
            .try_campaign("indexer", "node-b", SECRET_VALUE, HOUR)
            .await
            .unwrap()
            .expect("leads");
        election.resign(gone).await.unwrap();
        let again = election
            .try_campaign("indexer", "node-c", SECRET_VALUE, HOUR)
            .await
            .unwrap()
            .expect("leads");
        election.resign(again).await.unwrap();

        let rw = Arc::new(GenericRwLock::new(backend.clone()));
        let r1 = rw.try_read("config", HOUR).await.unwrap().unwrap();
        let r2 = rw.try_read("config", HOUR).await.unwrap().unwrap();
        let w = rw.try_write("schema", HOUR).await.unwrap().unwrap();
        let r3 = rw.try_read("cache", HOUR).await.unwrap().unwrap();
        // A writer queues behind the reader of `cache`, then is cancelled: its
        // queue entry stays until its TTL, holding new readers back.
        let queued = rw.clone();
        let waiting =
            tokio::spawn(
                async move { queued.write("cache", HOUR, Duration::from_secs(600)).await },
            );
        let deadline = Instant::now() + Duration::from_secs(60);
        while rw.status("cache").await.unwrap().unwrap().queued_writers == 0 {
            assert!(Instant::now() < deadline, "the writer never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        waiting.abort();
        vec![
            lead.token().to_owned(),
            r1.lease().token().to_owned(),
            r2.lease().token().to_owned(),
            w.lease().token().to_owned(),
            r3.lease().token().to_owned(),
        ]
    });

    let server = serve(&url);
    let (status, body) = get(&server.1, "/api/elections");
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    let elections = &json["elections"];
    let scheduler = find(elections, "name", "scheduler");
    assert_eq!(scheduler["leader"], "node-a");
    assert_eq!(scheduler["term"], 1);
    assert!(scheduler["lease_expires_ms"].as_u64().unwrap() > json["now_ms"].as_u64().unwrap());
    let indexer = find(elections, "name", "indexer");
    assert_eq!(indexer["leader"], Value::Null);
    assert_eq!(indexer["term"], 2, "the term survives resignations");

    let (status, body) = get(&server.1, "/api/rwlocks");
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    let rwlocks = &json["rwlocks"];
    let config = find(rwlocks, "key", "config");
    assert_eq!(config["state"], "read");
    assert_eq!(config["holders"].as_array().unwrap().len(), 2);
    assert_eq!(config["fence"], 2);
    let schema = find(rwlocks, "key", "schema");
    assert_eq!(schema["state"], "write");
    assert_eq!(schema["holders"][0]["mode"], "write");
    assert_eq!(schema["holders"][0]["state"], "held");
    let cache = find(rwlocks, "key", "cache");
    assert_eq!(
        (cache["state"].as_str(), cache["queued_writers"].as_u64()),
        (Some("read"), Some(1))
    );

    let (status, page) = get(&server.1, "/leaders");
    assert_eq!(status, 200, "{page}");
    for needle in [
        "scheduler",
        "node-a",
        "indexer",
        "config",
        "schema",
        "cache",
    ] {
        assert!(page.contains(needle), "/leaders lacks {needle}");
    }
    for body in [
        &page,
        &get(&server.1, "/api/elections").1,
        &get(&server.1, "/api/rwlocks").1,
    ] {
        assert!(!body.contains(SECRET_VALUE), "an announced value was shown");
        for token in &tokens {
            assert!(!body.contains(token.as_str()), "a token was shown");
        }
    }
    let (status, _) = get(&server.1, "/api/rwlocks?limit=0");
    assert_eq!(status, 400, "a bad limit is refused");
}
