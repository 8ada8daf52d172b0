//! The Sentinel topology of `scripts/ha` in tests, shared by the tests of
//! coord-redis and coord-locks-native (`#[path]`): a lock that serializes
//! failovers against every other user of the topology, and a clean failover.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::time::Duration;

/// A lock on the Sentinel topology shared by every test binary: tests
/// that only use it hold it shared, a failover holds it alone (a
/// failover drops every client connection of the old primary).
pub(crate) async fn topology(exclusive: bool) -> File {
    tokio::task::spawn_blocking(move || {
        let path = std::env::temp_dir().join("coord-ha-redis-sentinel.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .expect("lock file");
        if exclusive {
            file.lock().expect("exclusive lock");
        } else {
            file.lock_shared().expect("shared lock");
        }
        file
    })
    .await
    .unwrap()
}

/// `base` with `params` appended to its query.
pub(crate) fn with_params(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

/// The Sentinels (`host:port`) and the master name of a Sentinel URL.
pub(crate) fn sentinels_of(url: &str) -> (Vec<String>, String) {
    let body = url.split_once("://").unwrap().1;
    let body = body.split('?').next().unwrap();
    let (hosts, master) = body.split_once('/').unwrap();
    (
        hosts.split(',').map(str::to_owned).collect(),
        master.to_owned(),
    )
}

pub(crate) async fn cmd<T: redis::FromRedisValue>(
    addr: &str,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

/// The primary a Sentinel names now (`host:port`).
pub(crate) async fn primary(sentinel: &str, master: &str) -> String {
    let mut ask = redis::cmd("SENTINEL");
    ask.arg("get-master-addr-by-name").arg(master);
    let (host, port): (String, u16) = cmd(sentinel, &ask).await.unwrap();
    format!("{host}:{port}")
}

/// Wait (a bounded number of polls) until `node` is a primary with
/// every replica online and caught up, and the Sentinels all name it.
pub(crate) async fn settled(sentinels: &[String], master: &str) -> String {
    for _ in 0..600 {
        let node = primary(&sentinels[0], master).await;
        let mut agree = true;
        for other in &sentinels[1..] {
            agree &= primary(other, master).await == node;
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let info: String = cmd(&node, &info).await.unwrap_or_default();
        let online = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .count();
        if agree && info.contains("role:master") && online >= 2 {
            return node;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the Sentinel topology did not settle");
}

/// `SENTINEL FAILOVER` (a clean switch: no process is killed), then wait
/// until the new primary is settled. Returns (old, new).
pub(crate) async fn failover(url: &str) -> (String, String) {
    let (sentinels, master) = sentinels_of(url);
    let old = settled(&sentinels, &master).await;
    let mut ask = redis::cmd("SENTINEL");
    ask.arg("FAILOVER").arg(&master);
    let mut started = false;
    for _ in 0..100 {
        // INPROG / NOGOODSLAVE while the Sentinels still settle.
        if cmd::<String>(&sentinels[0], &ask).await.is_ok() {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(started, "SENTINEL FAILOVER was refused every time");
    for _ in 0..600 {
        if primary(&sentinels[0], &master).await != old {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new = settled(&sentinels, &master).await;
    assert_ne!(old, new, "the failover did not move the primary");
    (old, new)
}
