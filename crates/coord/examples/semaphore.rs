//! Limited concurrency: at most two holders of `api-quota` at a time, across
//! every process that shares the store; each permit with its own fence.
//!
//! ```sh
//! cargo run -p coord --example semaphore
//! ```

mod common;

use std::sync::Arc;
use std::time::Duration;

use coord::adapters::lock::{GenericSemaphore, LockError, Semaphore, WaitOptions};

const PERMITS: u32 = 2;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let semaphore = Arc::new(GenericSemaphore::new(store));

    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..5 {
        let semaphore = semaphore.clone();
        workers.spawn(async move {
            let wait = WaitOptions::with_timeout(Duration::from_secs(30));
            let permit = semaphore
                .acquire("api-quota", PERMITS, Duration::from_secs(30), &wait)
                .await?;
            println!("worker {worker} calls the API (fence {})", permit.fence());
            tokio::time::sleep(Duration::from_millis(200)).await;
            semaphore.release(permit).await?;
            Ok::<_, LockError>(())
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(())
}
