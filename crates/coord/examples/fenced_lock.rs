//! Mutual exclusion with a fencing token: one holder at a time, the lease
//! renewed in the background, and a fence that every protected write carries
//! so that a paused, stale holder's late write is refused downstream.
//!
//! ```sh
//! cargo run -p coord --example fenced_lock
//! COORD_STORE=redis://127.0.0.1:6379 cargo run -p coord --example fenced_lock
//! ```

mod common;

use std::sync::Arc;
use std::time::Duration;

use coord::adapters::lock::{GenericLock, Lock, LockGuard};
use coord::adapters::sideeffect::{BackendFencedSink, Fence, FencedSink};
use coord::backend::Mutation;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let lock: Arc<dyn Lock> = Arc::new(GenericLock::new(store.clone()));
    // The downstream resource: here a key of the same store, written only
    // when the presented fence is not lower than the highest it has seen.
    let ledger = BackendFencedSink::new(store);

    // Wait up to 10 s for the lock; lease of 30 s, renewed by the guard.
    let guard = LockGuard::acquire(
        &lock,
        "reports/daily",
        Duration::from_secs(30),
        Duration::from_secs(10),
    )
    .await?;
    let fence = Fence(guard.fence());
    println!("holding reports/daily with {fence}");

    let work = async {
        let line = format!("written under {fence}");
        ledger
            .write_fenced("reports", fence, vec![Mutation::put("reports/daily", line)])
            .await
    };
    tokio::select! {
        // The guard says the moment the lease is lost (a pause longer than the
        // TTL, a store that stopped answering): stop writing then.
        lost = guard.lost() => return Err(format!("lock lost: {lost}").into()),
        written = work => written?,
    }
    guard.release().await?;
    println!(
        "released; highest fence the ledger saw: {:?}",
        ledger.highest_seen("reports").await?
    );
    Ok(())
}
