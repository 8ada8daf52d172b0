//! Fair queueing: waiters take the lock in the order they asked for it
//! (tickets in the store, one waiter woken per release), each grant with its
//! own fence.
//!
//! ```sh
//! cargo run -p coord --example fair_lock
//! ```

mod common;

use std::sync::Arc;
use std::time::Duration;

use coord::adapters::lock::{FairLock, Lock, LockError, LockExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let lock = Arc::new(FairLock::new(store));

    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..3u64 {
        let lock = lock.clone();
        workers.spawn(async move {
            // Line up 50 ms apart so that the order is visible.
            tokio::time::sleep(Duration::from_millis(50 * worker)).await;
            let handle = lock
                .lock("printer", Duration::from_secs(30), Duration::from_secs(20))
                .await?;
            println!("worker {worker} prints with fence {}", handle.fence());
            tokio::time::sleep(Duration::from_millis(200)).await;
            lock.release(handle).await?;
            Ok::<_, LockError>(())
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(())
}
