//! A side effect that runs at most once: the first call runs the closure and
//! keeps its result, every later call (a retry, another process) gets the
//! result back without running it; a crash mid-run leaves it `Uncertain`,
//! for `coordctl reconcile`, never run twice.
//!
//! ```sh
//! cargo run -p coord --example once_only   # run it twice: the second replays
//! ```

mod common;

use std::sync::Arc;
use std::time::Duration;

use coord::adapters::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = coord::connect(&common::store_url()).await?;
    let runner = Runner::new(Arc::new(SideEffectAdapter::new(store)));
    let refund = Action::new("refund/order-42", "payments");

    for attempt in 1..=2 {
        let done = runner
            .execute(&refund, Duration::from_secs(30), |lease| async move {
                println!("calling the payment API ({})", lease.fence);
                Ok::<_, std::io::Error>(EffectResult::from(&b"refund-id 9f2c"[..]))
            })
            .await?;
        // Applied the first time ever, Replayed after that.
        println!("attempt {attempt}: {:?}", done.outcome);
    }
    Ok(())
}
