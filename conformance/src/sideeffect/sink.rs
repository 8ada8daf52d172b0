//! Rules 45–47: the downstream half: a fenced sink refuses a fence lower
//! than the highest it has seen, accepts an equal one, and compares and
//! writes in one step when writers race.

use std::sync::Arc;

use coord_adapters::sideeffect::{Fence, SideEffectError};
use coord_backend::{BackendExt, Mutation};

use super::helpers::{expect_err, join};
use super::Fixture;
use crate::{ensure, CheckResult, Failure};

// ---------------------------------------------------------------- FencedSink

/// Rule 45: a fence lower than the highest seen → fence-stale, no write at all.
pub async fn rule_45_sink_lower_fence_rejected(fx: Fixture) -> CheckResult {
    let backend = fx.backend().await?;
    let sink = fx.sink().await?;
    sink.write_fenced(
        "acct",
        Fence(5),
        vec![Mutation::put("acct/balance", "five")],
    )
    .await?;
    let before = backend.get("acct/balance").await?;
    expect_err!(
        sink.write_fenced(
            "acct",
            Fence(3),
            vec![
                Mutation::put("acct/balance", "three"),
                Mutation::put("acct/other", "x"),
            ],
        )
        .await,
        SideEffectError::FenceStale,
        "write with a lower fence"
    );
    ensure!(
        backend.get("acct/balance").await? == before,
        "the stale write changed the data"
    );
    ensure!(
        !backend.get("acct/other").await?.exists(),
        "the stale write wrote part of its data"
    );
    // The refused write did not lower the highest seen: 4 is still stale.
    expect_err!(
        sink.write_fenced(
            "acct",
            Fence(4),
            vec![Mutation::put("acct/balance", "four")]
        )
        .await,
        SideEffectError::FenceStale,
        "fence 4 after 5 and a refused 3"
    );
    Ok(())
}

/// Rule 46: an equal fence is allowed (several writes of one holder).
pub async fn rule_46_sink_equal_fence_allowed(fx: Fixture) -> CheckResult {
    let backend = fx.backend().await?;
    let sink = fx.sink().await?;
    sink.write_fenced("acct", Fence(4), vec![Mutation::put("acct/balance", "a")])
        .await?;
    sink.write_fenced("acct", Fence(4), vec![Mutation::put("acct/balance", "b")])
        .await
        .map_err(|e| Failure::new(format!("second write with the same fence: {e}")))?;
    let value = backend.get("acct/balance").await?.value;
    ensure!(
        value.as_deref() == Some(&b"b"[..]),
        "data after two equal-fence writes: {value:?}"
    );
    expect_err!(
        sink.write_fenced("acct", Fence(3), vec![Mutation::put("acct/balance", "c")])
            .await,
        SideEffectError::FenceStale,
        "lower fence after equal ones"
    );
    Ok(())
}

/// Rule 47: a higher fence is applied and becomes the highest seen, compare
/// and write in one step: racing writers end with the highest one's write.
pub async fn rule_47_sink_atomic_race(fx: Fixture) -> CheckResult {
    const WRITERS: u64 = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS as usize));
    let mut tasks = Vec::new();
    for fence in 1..=WRITERS {
        let sink = fx.sink().await?;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let write = vec![Mutation::put("acct/balance", format!("w{fence}"))];
            (fence, sink.write_fenced("acct", Fence(fence), write).await)
        }));
    }
    for task in tasks {
        let (fence, written) = join(task).await?;
        match written {
            Ok(()) | Err(SideEffectError::FenceStale) if fence < WRITERS => {}
            Ok(()) => {}
            other => {
                return Err(Failure::new(format!(
                    "writer with fence {fence}: {other:?}"
                )))
            }
        }
    }
    let backend = fx.backend().await?;
    let value = backend.get("acct/balance").await?.value;
    ensure!(
        value.as_deref() == Some(format!("w{WRITERS}").as_bytes()),
        "after the race the data is {:?}, expected the highest fence's write",
        value.map(|v| String::from_utf8_lossy(&v).into_owned())
    );
    let sink = fx.sink().await?;
    expect_err!(
        sink.write_fenced("acct", Fence(WRITERS - 1), vec![]).await,
        SideEffectError::FenceStale,
        "after the race, a fence below the highest"
    );
    sink.write_fenced("acct", Fence(WRITERS), vec![])
        .await
        .map_err(|e| Failure::new(format!("after the race, the highest fence itself: {e}")))?;
    Ok(())
}
