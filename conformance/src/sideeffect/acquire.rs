//! Rules 1–10: what `acquire` decides: invalid actions, one atomic step,
//! the order of outcomes (completed, uncertain, busy, contended), and the
//! fences it grants, never reused, also after an expired lease is taken over.

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::sideeffect::{Acquired, Fence, Outcome, RetrySafety, SideEffectError};
use coord_backend::Clock;

use super::helpers::{
    action, contended_to_another, dump, expect_err, expect_outcome, grant, granted_to_another,
    join, make_uncertain, replayed_to_another, result, uncertain_to_another,
};
use super::{Fixture, PAST_TTL, TTL};
use crate::{ensure, CheckResult, Failure};

// ---------------------------------------------------------------- acquire

/// Rule 1: empty key or resource, or a zero TTL → invalid-action error; nothing stored.
pub async fn rule_01_invalid_action(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let backend = fx.backend().await?;
    expect_err!(
        store.acquire(&action("", "r"), TTL).await,
        SideEffectError::InvalidAction(_),
        "acquire with an empty key"
    );
    expect_err!(
        store.acquire(&action("k", ""), TTL).await,
        SideEffectError::InvalidAction(_),
        "acquire with an empty resource"
    );
    expect_err!(
        store.acquire(&action("k", "r"), Duration::ZERO).await,
        SideEffectError::InvalidAction(_),
        "acquire with a zero TTL"
    );
    let stored = dump(&backend).await?;
    ensure!(stored.is_empty(), "invalid acquires stored {stored:?}");

    let valid = action("k", "r");
    let lease = grant(&store, &valid).await?;
    let before = dump(&backend).await?;
    expect_err!(
        store.renew(&valid, &lease, Duration::ZERO).await,
        SideEffectError::InvalidAction(_),
        "renew with a zero TTL"
    );
    expect_err!(
        store.complete(&action("", "r"), &lease, result("x")).await,
        SideEffectError::InvalidAction(_),
        "complete with an empty key"
    );
    expect_err!(
        store.begin_reconcile(&valid, Duration::ZERO).await,
        SideEffectError::InvalidAction(_),
        "begin_reconcile with a zero TTL"
    );
    ensure!(
        dump(&backend).await? == before,
        "an invalid call changed what is stored"
    );
    Ok(())
}

/// Rule 2: rules 3–9 are one atomic step: N racing acquires of one fresh key
/// → exactly one Applied; N racing keys on one free resource → exactly one Applied.
pub async fn rule_02_one_atomic_step(fx: Fixture) -> CheckResult {
    const RACERS: usize = 16;
    for (round, same_key) in [(0, true), (1, false)] {
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for racer in 0..RACERS {
            let store = fx.store().await?;
            let barrier = barrier.clone();
            let key = if same_key {
                format!("k{round}")
            } else {
                format!("k{round}-{racer}")
            };
            let act = action(&key, &format!("r{round}"));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.acquire(&act, TTL).await
            }));
        }
        let mut applied = Vec::new();
        for task in tasks {
            let acquired = join(task).await??;
            match acquired {
                Acquired::Applied(lease) => applied.push(Some(lease)),
                Acquired::Contended => {}
                other => {
                    return Err(Failure::new(format!(
                        "racing acquire on a fresh {} → {other:?}",
                        if same_key { "key" } else { "resource" }
                    )))
                }
            }
        }
        ensure!(
            applied.len() == 1,
            "{} of {RACERS} racing acquires ({}) were Applied (expected exactly 1)",
            applied.len(),
            if same_key {
                "one key"
            } else {
                "one resource, distinct keys"
            }
        );
        let fence = applied[0].as_ref().map(|l| l.fence);
        ensure!(
            fence == Some(Fence(1)),
            "the single grant on a fresh resource has {fence:?}, expected fence 1"
        );
    }
    Ok(())
}

/// Rule 3: a completed key → Replayed with the stored result, no fence,
/// even while another action holds the resource.
pub async fn rule_03_completed_outranks_busy(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let la = grant(&store, &a).await?;
    store.complete(&a, &la, result("ra")).await?;
    let lb = grant(&store, &b).await?;
    replayed_to_another(&fx, &a, "ra", "completed key while the resource is held").await?;
    store.complete(&b, &lb, result("rb")).await?;
    fx.advance(PAST_TTL);
    let lc = grant(&store, &c).await?;
    ensure!(
        lc.fence == Fence(lb.fence.0 + 1),
        "the replay issued a fence: next grant has {:?} after {:?}",
        lc.fence,
        lb.fence
    );
    Ok(())
}

/// Rule 4: an uncertain key → Uncertain, no fence, also while the resource is busy.
pub async fn rule_04_uncertain_outranks_busy(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    make_uncertain(&store, &a).await?;
    let lb = grant(&store, &b).await?;
    uncertain_to_another(&fx, &a, "uncertain key while the resource is held").await?;
    store.release(&b, &lb).await?;
    let lc = grant(&store, &c).await?;
    ensure!(
        lc.fence == Fence(lb.fence.0 + 1),
        "the Uncertain answer issued a fence: next grant has {:?} after {:?}",
        lc.fence,
        lb.fence
    );
    Ok(())
}

/// Rule 5: an unresolved intent whose lease is live → Contended (in flight).
pub async fn rule_05_live_intent_contended(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let lease = grant(&store, &a).await?;
    expect_outcome(&fx.store().await?, &a, Outcome::Contended, "key in flight").await?;
    fx.advance(TTL / 2);
    contended_to_another(&fx, &a, "key in flight, later").await?;
    // The in-flight holder is unaffected.
    store.complete(&a, &lease, result("done")).await?;
    Ok(())
}

/// Rule 6: an intent whose lease expired or was released → Uncertain, never
/// silently granted again; a declared retry-safe action may be granted again.
pub async fn rule_06_dead_intent_uncertain(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let expired = action("expired", "r1");
    grant(&store, &expired).await?;
    fx.advance(PAST_TTL);
    uncertain_to_another(&fx, &expired, "intent whose lease expired").await?;
    uncertain_to_another(&fx, &expired, "asked again").await?;

    let released = action("released", "r2");
    let lease = grant(&store, &released).await?;
    store.release(&released, &lease).await?;
    uncertain_to_another(&fx, &released, "intent whose lease was released").await?;

    let safe = action("safe", "r3").with_retry_safety(RetrySafety::Safe);
    let first = grant(&store, &safe).await?;
    store.release(&safe, &first).await?;
    let again = granted_to_another(&fx, &safe, "retry-safe action after release").await?;
    ensure!(
        again.fence > first.fence,
        "re-grant of a retry-safe action reused {:?}",
        again.fence
    );

    let declared_then = action("declared", "r4").with_retry_safety(RetrySafety::Safe);
    let lease = grant(&store, &declared_then).await?;
    store.release(&declared_then, &lease).await?;
    let undeclared_now = action("declared", "r4");
    uncertain_to_another(
        &fx,
        &undeclared_now,
        "granted as retry-safe, asked again without the declaration",
    )
    .await?;
    Ok(())
}

/// Rule 7: a resource leased by another live holder → Contended (not an
/// error, no fence); retryable once the holder is gone.
pub async fn rule_07_busy_resource_contended(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    contended_to_another(&fx, &b, "resource held by another key").await?;
    store.release(&a, &la).await?;
    let lb = granted_to_another(&fx, &b, "Contended was not retryable").await?;
    ensure!(
        lb.fence == Fence(la.fence.0 + 1),
        "the Contended answer issued a fence: next grant has {:?} after {:?}",
        lb.fence,
        la.fence
    );
    Ok(())
}

/// Rule 8: a grant's fence = highest ever issued + 1, its lease describes
/// the grant, and the execution intent exists as soon as the grant does.
pub async fn rule_08_grant_fence_and_intent(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let t0 = fx.clock().now();
    let la = grant(&store, &a).await?;
    ensure!(
        la.fence == Fence(1),
        "first grant on a fresh resource: {:?}",
        la.fence
    );
    ensure!(la.resource == "r", "lease resource {:?}", la.resource);
    ensure!(la.holder == "a", "lease holder {:?}", la.holder);
    ensure!(
        la.expires_at == t0 + TTL,
        "lease expires at {:?}, expected now + TTL = {:?}",
        la.expires_at,
        t0 + TTL
    );
    store.release(&a, &la).await?;
    let lb = grant(&store, &b).await?;
    ensure!(
        lb.fence == Fence(2),
        "grant after a release: {:?}, expected fence 2",
        lb.fence
    );
    // The intent is there right after the grant: in flight, then uncertain.
    contended_to_another(&fx, &b, "right after the grant").await?;
    fx.advance(PAST_TTL);
    uncertain_to_another(&fx, &b, "after the grant's lease expired").await?;
    let lc = grant(&store, &c).await?;
    ensure!(
        lc.fence == Fence(3),
        "grant after expiry: {:?}, expected fence 3",
        lc.fence
    );
    Ok(())
}

/// Rule 9: fences per resource strictly increase and are never reused, across
/// release, completion, expiry, takeover and abandon (each step by a fresh client).
pub async fn rule_09_fences_never_reused(fx: Fixture) -> CheckResult {
    let mut fences = Vec::new();
    let k = |i: usize| action(&format!("k{i}"), "r");

    let store = fx.store().await?;
    let l1 = grant(&store, &k(1)).await?;
    store.release(&k(1), &l1).await?;
    fences.push(l1.fence);

    let store = fx.store().await?;
    let l2 = grant(&store, &k(2)).await?;
    store.complete(&k(2), &l2, result("2")).await?;
    fences.push(l2.fence);
    fx.advance(PAST_TTL);

    let store = fx.store().await?;
    let l3 = grant(&store, &k(3)).await?;
    fences.push(l3.fence);
    fx.advance(PAST_TTL);

    let store = fx.store().await?;
    let l4 = grant(&store, &k(4)).await?;
    store.abandon(&k(4), &l4, "conformance").await?;
    fences.push(l4.fence);

    let store = fx.store().await?;
    let l5 = grant(&store, &k(5)).await?;
    fences.push(l5.fence);

    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences on one resource did not strictly increase: {fences:?}"
    );
    Ok(())
}

/// Rule 10: an expired lease is taken over by another action on the same
/// resource, with a higher fence.
pub async fn rule_10_takeover_after_expiry(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    expect_outcome(&store, &b, Outcome::Contended, "before expiry").await?;
    fx.advance(PAST_TTL);
    let lb = granted_to_another(&fx, &b, "takeover after expiry").await?;
    ensure!(
        lb.fence > la.fence,
        "takeover fence {:?} is not above {:?}",
        lb.fence,
        la.fence
    );
    Ok(())
}
