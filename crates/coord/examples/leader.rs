//! Leader election: one leader of `ingest` at a time, with a term that grows
//! at every new leadership (a fence for what the leader writes), a value it
//! publishes (its address), and resignation.
//!
//! ```sh
//! cargo run -p coord --example leader     # run it twice at once: one waits for the other
//! ```

mod common;

use std::time::Duration;

use coord::adapters::election::{Election, GenericElection};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let election = GenericElection::new(store);
    let me = format!("node-{}", std::process::id());

    // Wait up to 30 s to lead; the leadership lasts 10 s unless renewed.
    let leadership = election
        .campaign(
            "ingest",
            &me,
            "10.0.0.7:8080",
            Duration::from_secs(10),
            Duration::from_secs(30),
        )
        .await?;
    println!("{me} leads ingest in term {}", leadership.term());

    let seen = election.leader("ingest").await?.expect("a leader");
    println!(
        "everyone sees {} at {} (term {})",
        seen.candidate, seen.value, seen.term
    );

    // Lead for a moment, renewing as a long-lived leader would.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        election.renew(&leadership).await?;
    }
    election.resign(leadership).await?;
    println!("{me} resigned");
    Ok(())
}
