//! A cluster-wide cron: every instance runs the same scheduler, and each slot
//! of each job runs on exactly one of them.
//!
//! ```sh
//! cargo run -p coord --example cron    # run it twice at once: each second runs once in all
//! ```

mod common;

use std::sync::Arc;
use std::time::Duration;

use coord::backend::SystemClock;
use coord::scheduler::{
    handler, Job, RunStore, RunStoreOptions, Schedule, Scheduler, SchedulerOptions, SlotStore,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let clock = Arc::new(SystemClock);
    let slots: Arc<dyn SlotStore> = Arc::new(RunStore::new(
        store,
        clock.clone(),
        RunStoreOptions::default(),
    )?);
    let me = format!("instance-{}", std::process::id());
    let scheduler = Scheduler::new(Some(slots.clone()), clock, SchedulerOptions::instance(&me));

    // Cron with seconds ("0 */5 * * * *") or an interval, as here.
    let job = Job::new(
        "heartbeat",
        Schedule::parse("every 1s", None)?,
        handler(|run| async move {
            println!("{} runs slot {}", run.instance, run.slot);
            Ok(())
        }),
    );
    scheduler.add_job(job)?;
    scheduler.start();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    scheduler.shutdown().await;

    for record in slots.history("heartbeat", 5).await? {
        println!(
            "slot {} ran on {}: {:?}",
            record.slot, record.instance, record.status
        );
    }
    Ok(())
}
