//! The board as a work queue: workers take the next ready task
//! (`claim_next`: highest priority first, first in first out within one),
//! a failed attempt comes back after a backoff, the last one makes the task
//! dead with its error; a task may wait for a run-at time or for others.
//!
//! ```sh
//! cargo run -p coord --example job_queue
//! ```

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use coord::adapters::board::{Board, BoardAdapter, RetryPolicy, TaskSpec, TaskState};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let board: Arc<dyn Board> = Arc::new(BoardAdapter::new(store));
    // One queue per run, so the example can run again on the same store.
    let run = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let queue = format!("emails-{run}");
    let retry =
        RetryPolicy::attempts(3).with_backoff(Duration::from_millis(200), Duration::from_secs(1));
    let job = |id: &str| {
        TaskSpec::new(format!("{queue}/{id}"), id.as_bytes().to_vec())
            .in_queue(queue.as_str())
            .with_retry(retry)
    };
    // All of them or none, in one txn.
    board
        .add_many(vec![
            job("welcome-ann"),
            job("welcome-bob"),
            job("password-reset").with_priority(10),
            job("digest").with_run_at(SystemTime::now() + Duration::from_millis(500)),
            job("receipt").with_deps([format!("{queue}/welcome-ann")]),
            job("flaky"),
        ])
        .await?;

    let mut workers = Vec::new();
    for w in 0..3 {
        let (board, queue) = (board.clone(), queue.clone());
        workers.push(tokio::spawn(async move {
            let agent = format!("worker-{w}");
            let ttl = Duration::from_secs(30);
            // Stop once nothing became ready for 1.5 s.
            while let Some(task) = board
                .claim_next_wait(&queue, &agent, ttl, Duration::from_millis(1500))
                .await?
            {
                let name = String::from_utf8_lossy(&task.payload).into_owned();
                if name == "flaky" {
                    let outcome = board.fail(&task.id, &task.token, "SMTP said 451").await?;
                    println!("{agent}: {name} failed, {outcome:?}");
                    continue;
                }
                println!("{agent}: sends {name} (fence {})", task.fence);
                board
                    .complete(&task.id, &task.token, b"sent".to_vec())
                    .await?;
            }
            Ok::<(), coord::adapters::board::BoardError>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let flaky = board.get(&format!("{queue}/flaky")).await?;
    match &flaky.state {
        TaskState::Dead { error } => println!(
            "flaky is dead after {} attempts: {}",
            flaky.attempts,
            error.as_deref().unwrap_or("")
        ),
        other => return Err(format!("flaky should be dead: {other:?}").into()),
    }
    Ok(())
}
