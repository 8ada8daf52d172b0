//! Rules 11–23: what a lease holder can do with its lease: `complete`,
//! `release`, `renew` and `abandon`, and how each refuses a stale fence,
//! a released or expired lease, or another resource.

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::sideeffect::{Lease, Outcome, SideEffectError};
use coord_backend::Clock;

use super::helpers::{
    action, contended_to_another, expect_err, expect_replayed, grant, granted_to_another, join,
    newer_holder_intact, replayed_to_another, result, taken_over, uncertain_to_another,
};
use super::{Fixture, PAST_TTL, TTL};
use crate::{ensure, CheckResult, Failure};

// ---------------------------------------------------------------- complete

/// Rule 11: complete with the current fence records the result; the key is
/// completed (later acquires replay it). This adapter's `complete` also frees
/// the resource (documented; the runner relies on it).
pub async fn rule_11_complete_records_result(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    let stored = store.complete(&a, &la, result("r1")).await?;
    ensure!(stored == result("r1"), "complete returned {stored:?}");
    replayed_to_another(&fx, &a, "r1", "after complete").await?;
    fx.advance(PAST_TTL);
    replayed_to_another(&fx, &a, "r1", "after complete, past the lease").await?;
    let lb = grant(&fx.store().await?, &b).await?;
    ensure!(
        lb.fence > la.fence,
        "fence {:?} after {:?}",
        lb.fence,
        la.fence
    );
    Ok(())
}

/// Rule 12: a second complete returns the FIRST result.
pub async fn rule_12_complete_first_result_wins(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let la = grant(&store, &a).await?;
    store.complete(&a, &la, result("first")).await?;
    let second = store.complete(&a, &la, result("second")).await?;
    ensure!(
        second == result("first"),
        "second complete returned {second:?}, expected the first result"
    );
    expect_replayed(&fx.store().await?, &a, "first", "after two completes").await
}

/// Rule 13: complete with a stale fence (resource taken over) → fence-stale,
/// nothing recorded.
pub async fn rule_13_complete_stale_fence(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let (la, lb) = taken_over(&fx, &store, &a, &b).await?;
    expect_err!(
        store.complete(&a, &la, result("late")).await,
        SideEffectError::FenceStale,
        "complete after a takeover"
    );
    let seen = store.acquire(&a, TTL).await?;
    ensure!(
        seen.outcome() != Outcome::Replayed && seen.outcome() != Outcome::Applied,
        "the stale complete was recorded: acquire → {seen:?}"
    );
    store.complete(&b, &lb, result("b")).await?;
    expect_replayed(&store, &b, "b", "the new holder's complete").await?;
    let seen = fx.store().await?.acquire(&a, TTL).await?;
    ensure!(
        seen.outcome() == Outcome::Uncertain,
        "the taken-over key reads {seen:?}, expected Uncertain"
    );
    Ok(())
}

/// Rule 14: a released lease (same generation, no holder), a forged token
/// or another key's lease → fence-stale: all three parts are checked together.
pub async fn rule_14_complete_released_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r2"));
    let la = grant(&store, &a).await?;
    let forged = Lease {
        token: "forged".into(),
        ..la.clone()
    };
    expect_err!(
        store.complete(&a, &forged, result("x")).await,
        SideEffectError::FenceStale,
        "complete with the current fence but a forged token"
    );
    let lb = grant(&store, &b).await?;
    let a_on_r2 = action("a", "r2");
    expect_err!(
        store.complete(&a_on_r2, &lb, result("x")).await,
        SideEffectError::FenceStale,
        "complete with another key's lease"
    );
    store.release(&a, &la).await?;
    expect_err!(
        store.complete(&a, &la, result("x")).await,
        SideEffectError::FenceStale,
        "complete with a released lease"
    );
    uncertain_to_another(&fx, &a, "after the refused completes").await?;
    store.complete(&b, &lb, result("b")).await?;
    expect_replayed(&store, &b, "b", "the other key").await
}

/// Rule 15: a lease for another resource than the action's → refused.
pub async fn rule_15_complete_other_resource(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r1"), action("b", "r2"));
    let la = grant(&store, &a).await?;
    let lb = grant(&store, &b).await?;
    expect_err!(
        store.complete(&a, &lb, result("x")).await,
        SideEffectError::FenceStale,
        "complete of a (on r1) with b's lease on r2"
    );
    let relabeled = Lease {
        resource: "r2".into(),
        ..la.clone()
    };
    expect_err!(
        store.complete(&a, &relabeled, result("x")).await,
        SideEffectError::FenceStale,
        "complete with a lease naming another resource"
    );
    contended_to_another(&fx, &a, "after the refused completes").await?;
    store.complete(&a, &la, result("a")).await?;
    expect_replayed(&store, &a, "a", "the right lease still completes").await
}

// ---------------------------------------------------------------- release

/// Rule 16: release frees the resource only: the key is not done and its
/// intent stays (the key reads Uncertain until abandoned or reconciled).
pub async fn rule_16_release_frees_resource_only(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    store.release(&a, &la).await?;
    let lb = granted_to_another(&fx, &b, "release did not free the resource").await?;
    uncertain_to_another(&fx, &a, "released key, resource held by another").await?;
    store.complete(&b, &lb, result("b")).await?;
    uncertain_to_another(&fx, &a, "released key, resource free").await?;
    Ok(())
}

/// Rule 17: a stale release changes nothing of the newer holder; fence-stale.
pub async fn rule_17_stale_release(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let (la, lb) = taken_over(&fx, &store, &a, &b).await?;
    expect_err!(
        store.release(&a, &la).await,
        SideEffectError::FenceStale,
        "release with a taken-over lease"
    );
    newer_holder_intact(&fx, &store, (&b, &lb), &c, "after the stale release").await?;
    Ok(())
}

// ---------------------------------------------------------------- renew

/// Rule 18: renew with the current fence and an unexpired lease pushes the
/// expiry to now + TTL.
pub async fn rule_18_renew_extends(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let t0 = fx.clock().now();
    let la = grant(&store, &a).await?;
    fx.advance(Duration::from_secs(8));
    let renewed = store.renew(&a, &la, TTL).await?;
    let expected = t0 + Duration::from_secs(8) + TTL;
    ensure!(
        renewed.expires_at == expected,
        "renewed lease expires at {:?}, expected {expected:?}",
        renewed.expires_at
    );
    ensure!(renewed.fence == la.fence, "renew changed the fence");
    fx.advance(Duration::from_secs(5));
    contended_to_another(&fx, &b, "past the original expiry, within the renewal").await?;
    fx.advance(Duration::from_secs(6));
    granted_to_another(&fx, &b, "after the renewed expiry").await?;
    Ok(())
}

/// Rule 19: renew after a takeover → lease-lost, nothing changed.
pub async fn rule_19_renew_after_takeover(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let (la, lb) = taken_over(&fx, &store, &a, &b).await?;
    expect_err!(
        store.renew(&a, &la, TTL).await,
        SideEffectError::LeaseLost,
        "renew after a takeover"
    );
    newer_holder_intact(&fx, &store, (&b, &lb), &c, "after the refused renew").await?;
    Ok(())
}

/// Rule 20: renew after expiry is refused even if nobody took over.
pub async fn rule_20_renew_after_expiry(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b) = (action("a", "r"), action("b", "r"));
    let la = grant(&store, &a).await?;
    fx.advance(PAST_TTL);
    expect_err!(
        store.renew(&a, &la, TTL).await,
        SideEffectError::LeaseLost,
        "renew of an expired lease nobody took over"
    );
    granted_to_another(&fx, &b, "the refused renew extended the lease").await?;
    Ok(())
}

/// Rule 21: renew's check and extension are one atomic step: a renew racing a
/// takeover (by a client whose clock already sees the lease expired) never
/// lets both succeed.
pub async fn rule_21_renew_atomic(fx: Fixture) -> CheckResult {
    for round in 0..12 {
        let resource = format!("r{round}");
        let (a, b) = (
            action(&format!("a{round}"), &resource),
            action(&format!("b{round}"), &resource),
        );
        let holder = fx.store().await?;
        let la = grant(&holder, &a).await?;
        let taker = fx.store_with_clock(fx.skewed_clock(PAST_TTL)).await?;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let renew = {
            let barrier = barrier.clone();
            let (a, la) = (a.clone(), la.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                holder.renew(&a, &la, TTL * 2).await
            })
        };
        let take = tokio::spawn(async move {
            barrier.wait().await;
            taker.acquire(&b, TTL).await
        });
        let renewed = join(renew).await?;
        let taken = join(take).await??;
        let renew_ok = match renewed {
            Ok(_) => true,
            Err(SideEffectError::LeaseLost) => false,
            Err(other) => return Err(other.into()),
        };
        let took_over = taken.outcome() == Outcome::Applied;
        ensure!(
            !(renew_ok && took_over),
            "round {round}: the renew succeeded AND another client took the resource over (two live holders)"
        );
        ensure!(
            renew_ok || took_over,
            "round {round}: neither the renew nor the takeover succeeded ({taken:?})"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- abandon

/// Rule 22: abandon drops the intent and releases the own lease; the key can
/// be acquired again (Applied, higher fence).
pub async fn rule_22_abandon_allows_rerun(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let a = action("a", "r");
    let first = grant(&store, &a).await?;
    store.abandon(&a, &first, "nothing applied").await?;
    let again = granted_to_another(&fx, &a, "after abandon").await?;
    ensure!(
        again.fence > first.fence,
        "re-grant reused {:?}",
        again.fence
    );
    Ok(())
}

/// Rule 23: abandon with a stale lease drops nothing of the newer holder's lease.
pub async fn rule_23_abandon_stale_lease(fx: Fixture) -> CheckResult {
    let store = fx.store().await?;
    let (a, b, c) = (action("a", "r"), action("b", "r"), action("c", "r"));
    let (la, lb) = taken_over(&fx, &store, &a, &b).await?;
    match store.abandon(&a, &la, "late").await {
        Ok(()) | Err(SideEffectError::FenceStale) => {}
        Err(other) => return Err(other.into()),
    }
    newer_holder_intact(&fx, &store, (&b, &lb), &c, "after the stale abandon").await?;
    store.complete(&b, &lb, result("b")).await?;
    Ok(())
}
