//! Rules 24–34: keys whose apply may or may not have happened:
//! `mark_uncertain`, `resolve_uncertain` (first resolution wins), and the
//! reconcile claim that lets one reconciler at a time resolve a key.

use std::sync::Arc;

use coord_adapters::sideeffect::{
    Execution, Outcome, ReconcileClaim, Resolution, RetrySafety, SideEffectError,
};

use super::helpers::{
    action, expect_err, expect_outcome, expect_replayed, grant, granted_to_another, join,
    make_uncertain, replayed_to_another, result, taken_over, uncertain_to_another,
};
use super::{Fixture, PAST_TTL, TTL};
use crate::faults::{Fault, FaultyBackend, Target};
use crate::{ensure, CheckResult, Failure};

// ---------------------------------------------------------------- mark_uncertain

/// Rule 24: after mark_uncertain the key reads Uncertain; the mark is per key:
/// the resource may be leased by other actions meanwhile.
pub async fn rule_24_uncertain_per_key(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    make_uncertain(&store, &a).await?;
    let lb = granted_to_another(&fx, &b, "another action on the resource").await?;
    uncertain_to_another(&fx, &a, "while another action holds the resource").await?;
    store.complete(&b, &lb, result("b")).await?;
    fx.advance(PAST_TTL);
    uncertain_to_another(&fx, &a, "later, resource free").await?;
    Ok(())
}

/// Rule 25: mark_uncertain is idempotent.
pub async fn rule_25_mark_uncertain_idempotent(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let la = grant(&store, &a).await?;
    store.mark_uncertain(&a, &la, "once").await?;
    store
        .mark_uncertain(&a, &la, "twice")
        .await
        .map_err(|e| Failure::new(format!("second mark_uncertain: {e}")))?;
    uncertain_to_another(&fx, &a, "after two marks").await?;
    Ok(())
}

/// Rule 26: mark_uncertain with a stale fence is refused: a late holder must
/// not mark a newer holder's completed work unknown.
pub async fn rule_26_mark_uncertain_stale_fence(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let (la, lb) = taken_over(&fx, &store, &a, &b).await?;
    expect_err!(
        store.mark_uncertain(&a, &la, "late").await,
        SideEffectError::FenceStale,
        "mark_uncertain after a takeover"
    );
    store.complete(&b, &lb, result("b")).await?;
    expect_replayed(&store, &b, "b", "the newer holder's work").await?;

    // The same key granted again (declared retry-safe) and completed by the
    // newer holder: the old holder's mark must not make it unknown.
    let k = action("k", "r2").with_retry_safety(RetrySafety::Safe);
    let (old, new) = taken_over(&fx, &store, &k, &k).await?;
    store.complete(&k, &new, result("new")).await?;
    expect_err!(
        store.mark_uncertain(&k, &old, "late").await,
        SideEffectError::FenceStale,
        "late mark_uncertain of a key the newer holder completed"
    );
    expect_replayed(&fx.store().await?, &k, "new", "after the refused mark").await
}

/// Rule 27: marking and clearing the intent are one txn: whichever txn of
/// mark_uncertain fails, the key is never left runnable.
pub async fn rule_27_mark_uncertain_one_txn(fx: Fixture) -> CheckResult {
    for nth in 1..=3 {
        let a = action(&format!("a{nth}"), &format!("r{nth}"));
        let faulty = Arc::new(FaultyBackend::new(fx.backend().await?, nth as u64));
        let store = fx.store_over(faulty.clone());
        let la = grant(&store, &a).await?;
        // The nth txn of mark_uncertain is refused before reaching the store.
        faulty.nth(Target::Txn, nth as u64, Fault::Refuse);
        let marked = store.mark_uncertain(&a, &la, "conformance").await;
        let fired = faulty.fired() > 0;
        faulty.heal();
        if marked.is_err() {
            ensure!(
                fired,
                "mark_uncertain failed without the injected fault: {marked:?}"
            );
        }
        let clean = fx.store().await?;
        let now = clean.acquire(&a, TTL).await?;
        ensure!(
            matches!(now.outcome(), Outcome::Contended | Outcome::Uncertain),
            "txn {nth} of mark_uncertain failed ({marked:?}): the key reads {now:?}"
        );
        fx.advance(PAST_TTL);
        expect_outcome(
            &clean,
            &a,
            Outcome::Uncertain,
            &format!("txn {nth} of mark_uncertain failed ({marked:?}), lease expired"),
        )
        .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------- resolve

/// Rule 28: resolve applied = true → key completed with the given result; acquire → Replayed.
pub async fn rule_28_resolve_applied(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    make_uncertain(&store, &a).await?;
    let resolved = store
        .resolve_uncertain(&a, &Resolution::applied("r1", "downstream has it"))
        .await?;
    ensure!(
        resolved
            == Execution {
                outcome: Outcome::Replayed,
                result: Some(result("r1"))
            },
        "resolution answered {resolved:?}"
    );
    expect_replayed(&fx.store().await?, &a, "r1", "after resolve(applied)").await
}

/// Rule 29: resolve applied = false → mark cleared; acquire → Applied.
pub async fn rule_29_resolve_not_applied(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let first = make_uncertain(&store, &a).await?;
    store
        .resolve_uncertain(&a, &Resolution::not_applied("downstream never saw it"))
        .await?;
    let again = granted_to_another(&fx, &a, "after resolve(not applied)").await?;
    ensure!(
        again.fence > first.fence,
        "re-grant reused {:?}",
        again.fence
    );
    Ok(())
}

/// Rule 30: the first resolution wins; a second one does not overwrite it.
pub async fn rule_30_first_resolution_wins(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r1");
    make_uncertain(&store, &a).await?;
    store
        .resolve_uncertain(&a, &Resolution::applied("one", "first"))
        .await?;
    let second = store
        .resolve_uncertain(&a, &Resolution::applied("two", "second"))
        .await?;
    ensure!(
        second.result == Some(result("one")),
        "second resolution answered {second:?}"
    );
    store
        .resolve_uncertain(&a, &Resolution::not_applied("third"))
        .await?;
    replayed_to_another(&fx, &a, "one", "after three resolutions").await?;

    let b = action("b", "r2");
    make_uncertain(&store, &b).await?;
    store
        .resolve_uncertain(&b, &Resolution::not_applied("first"))
        .await?;
    expect_err!(
        store
            .resolve_uncertain(&b, &Resolution::applied("late", "second"))
            .await,
        SideEffectError::NotUncertain,
        "second resolution after a cleared mark"
    );
    granted_to_another(&fx, &b, "the second resolution overwrote the first").await?;
    Ok(())
}

/// Rule 31: resolving a key that is not uncertain: completed → Replayed with
/// the stored result; otherwise not-uncertain, nothing changed.
pub async fn rule_31_resolve_not_uncertain(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    expect_err!(
        store
            .resolve_uncertain(&action("never", "r1"), &Resolution::applied("x", "?"))
            .await,
        SideEffectError::NotUncertain,
        "resolve of a key never seen"
    );
    let done = action("done", "r2");
    let lease = grant(&store, &done).await?;
    store.complete(&done, &lease, result("c")).await?;
    for resolution in [
        Resolution::applied("other", "?"),
        Resolution::not_applied("?"),
    ] {
        let answer = store.resolve_uncertain(&done, &resolution).await?;
        ensure!(
            answer
                == Execution {
                    outcome: Outcome::Replayed,
                    result: Some(result("c"))
                },
            "resolve of a completed key answered {answer:?}"
        );
    }
    expect_replayed(&store, &done, "c", "after resolving a completed key").await?;

    let running = action("running", "r3");
    let lease = grant(&store, &running).await?;
    expect_err!(
        store
            .resolve_uncertain(&running, &Resolution::not_applied("?"))
            .await,
        SideEffectError::NotUncertain,
        "resolve of a key in flight"
    );
    store
        .complete(&running, &lease, result("ran"))
        .await
        .map_err(|e| Failure::new(format!("the in-flight holder was disturbed: {e}")))?;
    Ok(())
}

/// Rule 32: resolving checks no fence: a reconciler needs no lease (the
/// resource may be held by someone else, the original lease long gone).
pub async fn rule_32_resolve_without_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    make_uncertain(&store, &a).await?;
    let lb = grant(&store, &b).await?;
    fx.store()
        .await?
        .resolve_uncertain(&a, &Resolution::applied("x", "found downstream"))
        .await?;
    replayed_to_another(&fx, &a, "x", "resolved while another holds the resource").await?;
    store.complete(&b, &lb, result("b")).await?;

    // An attempt whose holder died (lease expired, resource taken over).
    let (dead, c) = (action("dead", "r2"), action("c", "r2"));
    grant(&store, &dead).await?;
    fx.advance(PAST_TTL);
    let lc = grant(&store, &c).await?;
    fx.store()
        .await?
        .resolve_uncertain(&dead, &Resolution::not_applied("not downstream"))
        .await?;
    store.complete(&c, &lc, result("c")).await?;
    granted_to_another(&fx, &dead, "after resolving a dead attempt").await?;
    Ok(())
}

// ---------------------------------------------------------------- reconcile claims

/// Rule 33: at most one reconciler per key at a time; a claim expires.
pub async fn rule_33_one_reconciler(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r1");
    make_uncertain(&store, &a).await?;
    let first: Option<ReconcileClaim> = fx.store().await?.begin_reconcile(&a, TTL).await?;
    let Some(first) = first else {
        return Err(Failure::new("the first reconciler got no claim"));
    };
    let second = fx.store().await?.begin_reconcile(&a, TTL).await?;
    ensure!(
        second.is_none(),
        "a second reconciler got a claim: {second:?}"
    );
    fx.advance(PAST_TTL);
    let third = fx.store().await?.begin_reconcile(&a, TTL).await?;
    let Some(third) = third else {
        return Err(Failure::new("an expired claim still blocks the key"));
    };
    ensure!(
        third.holder != first.holder,
        "the new claim reuses the old holder"
    );

    let k = action("k", "r2");
    make_uncertain(&store, &k).await?;
    const RACERS: usize = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for _ in 0..RACERS {
        let reconciler = fx.store().await?;
        let (barrier, k) = (barrier.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            reconciler.begin_reconcile(&k, TTL).await
        }));
    }
    let mut claims = 0;
    for task in tasks {
        if join(task).await??.is_some() {
            claims += 1;
        }
    }
    ensure!(
        claims == 1,
        "{claims} of {RACERS} racing reconcilers got a claim"
    );
    Ok(())
}

/// Rule 34: an owned resolve by anyone but the current, unexpired reconciler
/// → reconcile-lost, nothing changed; the check and the resolution are one txn.
pub async fn rule_34_owned_resolve(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r1");
    make_uncertain(&store, &a).await?;
    let old = store
        .begin_reconcile(&a, TTL)
        .await?
        .ok_or_else(|| Failure::new("no claim on an uncertain key"))?;
    fx.advance(PAST_TTL);
    let current = store
        .begin_reconcile(&a, TTL)
        .await?
        .ok_or_else(|| Failure::new("no claim after the old one expired"))?;
    expect_err!(
        store
            .resolve_uncertain_owned(&a, &Resolution::applied("old", "?"), &old.holder)
            .await,
        SideEffectError::ReconcileLost,
        "owned resolve by a replaced reconciler"
    );
    expect_err!(
        store
            .resolve_uncertain_owned(&a, &Resolution::applied("nobody", "?"), "nobody")
            .await,
        SideEffectError::ReconcileLost,
        "owned resolve by a stranger"
    );
    uncertain_to_another(&fx, &a, "after refused owned resolves").await?;
    let resolved = store
        .resolve_uncertain_owned(&a, &Resolution::applied("new", "checked"), &current.holder)
        .await?;
    ensure!(
        resolved.result == Some(result("new")),
        "owned resolve answered {resolved:?}"
    );
    replayed_to_another(&fx, &a, "new", "after the owned resolve").await?;

    let b = action("b", "r2");
    make_uncertain(&store, &b).await?;
    let lapsed = store
        .begin_reconcile(&b, TTL)
        .await?
        .ok_or_else(|| Failure::new("no claim on an uncertain key"))?;
    fx.advance(PAST_TTL);
    expect_err!(
        store
            .resolve_uncertain_owned(&b, &Resolution::not_applied("?"), &lapsed.holder)
            .await,
        SideEffectError::ReconcileLost,
        "owned resolve with an expired claim"
    );
    uncertain_to_another(&fx, &b, "after the refused owned resolve").await?;

    // Race: the claim holder resolves while another reconciler (whose clock
    // sees the claim expired) claims the key: never both.
    for round in 0..8 {
        let k = action(&format!("k{round}"), &format!("rk{round}"));
        make_uncertain(&store, &k).await?;
        let claim = store
            .begin_reconcile(&k, TTL)
            .await?
            .ok_or_else(|| Failure::new("no claim on an uncertain key"))?;
        let rival = fx.store_with_clock(fx.skewed_clock(PAST_TTL)).await?;
        let owner = fx.store().await?;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let resolve = {
            let (barrier, k) = (barrier.clone(), k.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                owner
                    .resolve_uncertain_owned(&k, &Resolution::applied("owner", "?"), &claim.holder)
                    .await
            })
        };
        let claim_again = tokio::spawn(async move {
            barrier.wait().await;
            rival.begin_reconcile(&k, TTL).await
        });
        let resolved = match join(resolve).await? {
            Ok(_) => true,
            Err(SideEffectError::ReconcileLost) => false,
            Err(other) => return Err(other.into()),
        };
        let claimed = match join(claim_again).await? {
            Ok(claim) => claim.is_some(),
            Err(SideEffectError::NotUncertain) => false,
            Err(other) => return Err(other.into()),
        };
        ensure!(
            !(resolved && claimed),
            "round {round}: the owner resolved AND a rival claimed the key"
        );
    }
    Ok(())
}
