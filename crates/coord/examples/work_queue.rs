//! A task board: tasks with dependencies, claimed by one agent at a time
//! (a claim is a lease with a fence), completed with a result.
//!
//! ```sh
//! cargo run -p coord --example work_queue
//! ```

mod common;

use std::time::Duration;

use coord::adapters::board::{Board, BoardAdapter, BoardError, TaskSpec};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let board = BoardAdapter::new(store);
    // Task ids are unique per run, so the example can run again on the same store.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let fetch = format!("run-{run}/fetch");
    let index = format!("run-{run}/index");
    board
        .seed(vec![
            TaskSpec::new(fetch.as_str(), b"https://example.invalid/data".to_vec()),
            TaskSpec::new(index.as_str(), Vec::new()).with_deps([fetch.as_str()]),
        ])
        .await?;

    let ttl = Duration::from_secs(60);
    // `index` waits for `fetch`.
    match board.claim(&index, "agent-1", ttl).await {
        Err(BoardError::DependenciesNotMet { .. }) => println!("{index} waits for {fetch}"),
        other => return Err(format!("unexpected: {other:?}").into()),
    }
    let claimed = board.claim(&fetch, "agent-1", ttl).await?;
    println!("agent-1 runs {} with fence {}", claimed.id, claimed.fence);
    board
        .complete(&fetch, &claimed.token, b"42 rows".to_vec())
        .await?;

    let claimed = board.claim(&index, "agent-2", ttl).await?;
    println!("agent-2 runs {} with fence {}", claimed.id, claimed.fence);
    board
        .complete(&index, &claimed.token, b"indexed".to_vec())
        .await?;
    println!("{index}: {:?}", board.get(&index).await?.state);
    Ok(())
}
