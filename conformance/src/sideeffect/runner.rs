//! Rules 35–44: the `Runner`, which drives one attempt for its caller: it
//! refuses to run without a store, replays a completed key, reports
//! contention, checks ownership before apply, hands apply the lease, and
//! turns a failing prepare, apply or complete into the right outcome;
//! `reconcile` and `run` go through the resolution rules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use coord_adapters::sideeffect::{
    Acquired, Action, Execution, Fence, Lease, Outcome, Resolution, RetrySafety, Runner,
    SideEffectError,
};

use super::doubles::{failing_apply, flag, recording_apply, CompleteFails};
use super::helpers::{action, expect_err, grant, io_error, result, uncertain_to_another};
use super::{Fixture, PAST_TTL, TTL};
use crate::{ensure, CheckResult, Failure};

// ---------------------------------------------------------------- Runner

/// `runner` executes `action` with an apply that records into `called` and
/// answers `text`: `Applied` with that result, or the check fails (`context`).
async fn applies(
    runner: &Runner,
    action: &Action,
    called: &Arc<AtomicBool>,
    text: &'static str,
    context: &str,
) -> CheckResult {
    let done = runner
        .execute(action, TTL, recording_apply(called, text))
        .await?;
    ensure!(
        done == Execution {
            outcome: Outcome::Applied,
            result: Some(result(text))
        },
        "{context}: {done:?}"
    );
    Ok(())
}

/// Rule 35: no store → no-store error (never a silent success).
pub async fn rule_35_runner_no_store(_fx: Fixture) -> CheckResult {
    let runner = Runner::from_option(None);
    let a = action("a", "r");
    let called = flag();
    expect_err!(
        runner.execute(&a, TTL, recording_apply(&called, "x")).await,
        SideEffectError::NoStore,
        "execute without a store"
    );
    expect_err!(
        runner.run(&a, TTL, recording_apply(&called, "x")).await,
        SideEffectError::NoStore,
        "run without a store"
    );
    expect_err!(
        runner.reconcile(&a, Resolution::not_applied("?")).await,
        SideEffectError::NoStore,
        "reconcile without a store"
    );
    ensure!(
        !called.load(Ordering::SeqCst),
        "apply was called without a store"
    );
    Ok(())
}

/// Rule 36: a completed key → the effect is not called; the stored result comes back, Replayed.
pub async fn rule_36_runner_replays_completed(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    applies(&runner, &a, &flag(), "x", "first run").await?;
    let store = fx.store().await?;
    let lb = grant(&store, &b).await?;
    let called = flag();
    let again = fx
        .runner()
        .await?
        .execute(&a, TTL, recording_apply(&called, "y"))
        .await?;
    ensure!(
        !called.load(Ordering::SeqCst),
        "the effect ran again for a completed key"
    );
    ensure!(
        again
            == Execution {
                outcome: Outcome::Replayed,
                result: Some(result("x"))
            },
        "replay (resource held by another): {again:?}"
    );
    store.complete(&b, &lb, result("b")).await?;
    Ok(())
}

/// Rule 37: Contended → outcome Contended, no error, effect not called.
pub async fn rule_37_runner_contended(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let lb = grant(&store, &b).await?;
    let called = flag();
    let runner = fx.runner().await?;
    let contended = runner
        .execute(&a, TTL, recording_apply(&called, "x"))
        .await?;
    ensure!(
        contended
            == Execution {
                outcome: Outcome::Contended,
                result: None
            },
        "busy resource: {contended:?}"
    );
    ensure!(
        !called.load(Ordering::SeqCst),
        "the effect ran on a busy resource"
    );
    store.abandon(&b, &lb, "done").await?;
    applies(&runner, &a, &called, "x", "retry after the holder left").await?;
    Ok(())
}

/// `answer` is `Err(OutcomeUnknown)` saying the key is `Uncertain`.
fn outcome_unknown<T: std::fmt::Debug>(
    answer: &Result<T, SideEffectError>,
    context: &str,
) -> CheckResult {
    match answer {
        Err(e @ SideEffectError::OutcomeUnknown { .. })
            if e.outcome() == Some(Outcome::Uncertain) =>
        {
            Ok(())
        }
        other => Err(Failure::new(format!(
            "{context}: expected Err(OutcomeUnknown), got {other:?}"
        ))),
    }
}

/// Rule 38: prepare fails → nothing applied, the attempt is abandoned, the
/// same key can run again at once.
pub async fn rule_38_runner_prepare_fails(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let a = action("a", "r");
    let called = flag();
    let apply_called = called.clone();
    let failed = runner
        .execute_with(
            &a,
            TTL,
            || async { Err::<(), _>(io_error("could not build the request")) },
            move |(), _lease| async move {
                apply_called.store(true, Ordering::SeqCst);
                Ok::<_, std::io::Error>(result("x"))
            },
        )
        .await;
    expect_err!(
        failed,
        SideEffectError::PrepareFailed { .. },
        "prepare failure"
    );
    ensure!(
        !called.load(Ordering::SeqCst),
        "apply ran after prepare failed"
    );
    applies(&runner, &a, &called, "y", "rerun after a prepare failure").await?;
    Ok(())
}

/// Rule 39: the ownership check (renew) between prepare and apply fails →
/// apply not called; Contended with lease-lost; the action can be retried.
pub async fn rule_39_runner_ownership_check(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let rival = fx.store().await?;
    let rival_lease: Arc<Mutex<Option<Lease>>> = Arc::default();
    let called = flag();
    let outcome = {
        let (clock, rival, slot, b) = (
            fx.clock().clone(),
            rival.clone(),
            rival_lease.clone(),
            b.clone(),
        );
        let apply_called = called.clone();
        runner
            .execute_with(
                &a,
                TTL,
                move || async move {
                    // A slow prepare: the lease expires and another action takes the resource.
                    clock.advance(PAST_TTL);
                    let taken = rival.acquire(&b, TTL).await;
                    if let Ok(Acquired::Applied(lease)) = &taken {
                        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease.clone());
                    }
                    Ok::<_, std::io::Error>(())
                },
                move |(), _lease| async move {
                    apply_called.store(true, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(result("x"))
                },
            )
            .await
    };
    ensure!(
        !called.load(Ordering::SeqCst),
        "apply ran after the lease was taken over"
    );
    let lb = rival_lease
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| Failure::new("the rival could not take over the expired lease"))?;
    match &outcome {
        Err(e @ SideEffectError::LeaseLost) if e.outcome() == Some(Outcome::Contended) => {}
        other => {
            return Err(Failure::new(format!(
                "ownership check failed: expected Err(LeaseLost) meaning Contended, got {other:?}"
            )))
        }
    }
    rival.complete(&b, &lb, result("b")).await?;
    applies(
        &runner,
        &a,
        &called,
        "x",
        "retrying the whole action after lease-lost",
    )
    .await?;
    Ok(())
}

/// Rule 40: apply receives the lease, with its fence (the current grant).
pub async fn rule_40_runner_apply_gets_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (z, a) = (action("z", "r"), action("a", "r"));
    let lz = grant(&store, &z).await?;
    store.abandon(&z, &lz, "warm-up").await?;
    let seen: Arc<Mutex<Option<(Lease, bool)>>> = Arc::default();
    let runner = fx.runner().await?;
    {
        let (seen, store, a2) = (seen.clone(), store.clone(), a.clone());
        runner
            .execute(&a, TTL, move |lease| async move {
                let current = store.renew(&a2, &lease, TTL).await.is_ok();
                *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some((lease, current));
                Ok::<_, std::io::Error>(result("ok"))
            })
            .await?;
    }
    let (lease, current) = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| Failure::new("apply was not called"))?;
    ensure!(
        lease.resource == "r" && lease.holder == "a",
        "apply got {lease:?}"
    );
    ensure!(
        lease.fence == Fence(lz.fence.0 + 1),
        "apply got {:?}, expected the grant's fence {}",
        lease.fence,
        lz.fence.0 + 1
    );
    ensure!(
        current,
        "the lease given to apply is not the current one (renew refused it)"
    );
    Ok(())
}

/// Rule 41: apply fails on a retry-safe action → attempt abandoned; retryable at once.
pub async fn rule_41_runner_apply_fails_safe(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let a = action("a", "r").with_retry_safety(RetrySafety::Safe);
    expect_err!(
        runner.execute(&a, TTL, failing_apply).await,
        SideEffectError::ApplyFailed { .. },
        "apply failure of a retry-safe action"
    );
    applies(&runner, &a, &flag(), "z", "retry of a retry-safe action").await?;
    Ok(())
}

/// Rule 42: apply fails with retry safety Unknown (default) or Unsafe → key
/// Uncertain, outcome-unknown error; the resource is released.
pub async fn rule_42_runner_apply_fails_unknown(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    for safety in [RetrySafety::Unknown, RetrySafety::Unsafe] {
        let resource = format!("r-{safety}");
        let a = action(&format!("a-{safety}"), &resource).with_retry_safety(safety);
        let failed = runner.execute(&a, TTL, failing_apply).await;
        outcome_unknown(&failed, &format!("apply failure ({safety})"))?;
        uncertain_to_another(&fx, &a, &format!("after an apply failure ({safety})")).await?;
        let called = flag();
        let again = runner
            .execute(&a, TTL, recording_apply(&called, "x"))
            .await?;
        ensure!(
            again.outcome == Outcome::Uncertain && !called.load(Ordering::SeqCst),
            "rerun of an uncertain key ({safety}): {again:?}, apply called: {}",
            called.load(Ordering::SeqCst)
        );
        grant(
            &fx.store().await?,
            &action(&format!("other-{safety}"), &resource),
        )
        .await
        .map_err(|f| Failure::new(format!("resource not released ({safety}): {f}")))?;
    }
    Ok(())
}

/// Rule 43: apply succeeds but complete fails → key Uncertain, outcome-unknown error.
pub async fn rule_43_runner_complete_fails(fx: Fixture) -> CheckResult {
    let runner = Runner::new(Arc::new(CompleteFails(fx.store().await?)));
    let a = action("a", "r");
    let called = flag();
    let failed = runner.execute(&a, TTL, recording_apply(&called, "x")).await;
    ensure!(called.load(Ordering::SeqCst), "apply was not called");
    outcome_unknown(&failed, "complete failed after apply")?;
    uncertain_to_another(&fx, &a, "after a failed complete").await?;
    fx.advance(PAST_TTL);
    uncertain_to_another(&fx, &a, "after a failed complete, later").await?;
    Ok(())
}

/// Rule 44: `reconcile` resolves through rules 28–31; `run` returns only the result.
pub async fn rule_44_runner_reconcile_and_run(fx: Fixture) -> CheckResult {
    let runner = fx.runner().await?;
    let a = action("a", "r1");
    let _ = runner.execute(&a, TTL, failing_apply).await;
    let resolved = runner
        .reconcile(&a, Resolution::applied("r", "downstream has it"))
        .await?;
    ensure!(
        resolved
            == Execution {
                outcome: Outcome::Replayed,
                result: Some(result("r"))
            },
        "reconcile(applied): {resolved:?}"
    );
    let called = flag();
    let ran = runner
        .run(&a, TTL, recording_apply(&called, "again"))
        .await?;
    ensure!(
        ran == Some(result("r")) && !called.load(Ordering::SeqCst),
        "run after reconcile(applied): {ran:?}"
    );
    let second = runner
        .reconcile(&a, Resolution::not_applied("late"))
        .await?;
    ensure!(
        second.result == Some(result("r")),
        "second reconcile: {second:?}"
    );

    let b = action("b", "r2");
    let _ = runner.execute(&b, TTL, failing_apply).await;
    expect_err!(
        runner.run(&b, TTL, recording_apply(&called, "b")).await,
        SideEffectError::OutcomeUnknown { .. },
        "run of an uncertain key"
    );
    runner
        .reconcile(&b, Resolution::not_applied("not downstream"))
        .await?;
    let ran = runner.run(&b, TTL, recording_apply(&flag(), "b")).await?;
    ensure!(
        ran == Some(result("b")),
        "run after reconcile(not applied): {ran:?}"
    );

    expect_err!(
        runner
            .reconcile(&action("fresh", "r3"), Resolution::not_applied("?"))
            .await,
        SideEffectError::NotUncertain,
        "reconcile of a key that never failed"
    );

    let store = fx.store().await?;
    let holder = action("holder", "r4");
    let lease = grant(&store, &holder).await?;
    let called = flag();
    let contended = runner
        .run(&action("d", "r4"), TTL, recording_apply(&called, "d"))
        .await?;
    ensure!(
        contended.is_none() && !called.load(Ordering::SeqCst),
        "run on a busy resource: {contended:?}"
    );
    store.complete(&holder, &lease, result("h")).await?;
    Ok(())
}
