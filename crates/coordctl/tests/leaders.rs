//! `coordctl serve` shows who holds what for elections and read-write locks:
//! a SQLite store is seeded through the adapters (an election with a live
//! leader, one whose leader resigned, a key with two readers, a key with a
//! writer and one with a queued writer behind a reader), then `/api/elections`,
//! `/api/rwlocks` and the `/leaders` page must show exactly those holders,
//! with no token and no announced value.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::election::{Election, GenericElection};
use coord_adapters::rwlock::{GenericRwLock, RwLock};
use serde_json::Value;

mod common;
use common::serve::{find, Server};
use common::{unique, Scratch};

const HOUR: Duration = Duration::from_secs(3_600);
const SECRET_VALUE: &str = "announced-value-not-for-the-console";

#[test]
fn leaders_and_rwlock_holders_are_shown() {
    let scratch = Scratch::new("leaders");
    let url = scratch.sqlite_url("coord.db", Some(&unique("leaders")));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tokens = runtime.block_on(async {
        let backend = coord::connect(&url).await.expect("store reachable");
        let election = GenericElection::new(backend.clone());
        let campaign = |name, candidate| election.try_campaign(name, candidate, SECRET_VALUE, HOUR);
        let lead = campaign("scheduler", "node-a")
            .await
            .unwrap()
            .expect("leads");
        let gone = campaign("indexer", "node-b").await.unwrap().expect("leads");
        election.resign(gone).await.unwrap();
        let again = campaign("indexer", "node-c").await.unwrap().expect("leads");
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

    let server = Server::start(&url, &[]);
    let json = server.get("/api/elections").json_ok();
    let elections = &json["elections"];
    let scheduler = find(elections, "name", "scheduler");
    assert_eq!(scheduler["leader"], "node-a");
    assert_eq!(scheduler["term"], 1);
    assert!(scheduler["lease_expires_ms"].as_u64().unwrap() > json["now_ms"].as_u64().unwrap());
    let indexer = find(elections, "name", "indexer");
    assert_eq!(indexer["leader"], Value::Null);
    assert_eq!(indexer["term"], 2, "the term survives resignations");

    let json = server.get("/api/rwlocks").json_ok();
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

    let reply = server.get("/leaders");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let page = reply.body;
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
        &server.get("/api/elections").body,
        &server.get("/api/rwlocks").body,
    ] {
        assert!(!body.contains(SECRET_VALUE), "an announced value was shown");
        for token in &tokens {
            assert!(!body.contains(token.as_str()), "a token was shown");
        }
    }
    assert_eq!(
        server.get("/api/rwlocks?limit=0").status,
        400,
        "a bad limit is refused"
    );
}
