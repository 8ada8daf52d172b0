use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Backend, BackendExt, Error, ManualClock, Mutation};
use coord_memory::SingleProcessMemoryBackend;

use super::*;

fn memory(ns: &str) -> Arc<dyn Backend> {
    Arc::new(SingleProcessMemoryBackend::new(ns).unwrap())
}

async fn ok_apply(lease: Lease) -> Result<EffectResult, std::io::Error> {
    Ok(EffectResult::from(
        format!("done@{}", lease.fence.0).as_bytes(),
    ))
}

const TTL: Duration = Duration::from_secs(30);

/// The lease of a grant of `action` for [`TTL`] (panics when not granted).
async fn granted(adapter: &SideEffectAdapter, action: &Action) -> Lease {
    let acquired = adapter.acquire(action, TTL).await.unwrap();
    acquired.into_lease().expect("a grant")
}

#[tokio::test]
async fn uncontended_execute_costs_three_round_trips() {
    let backend = memory("se-rt");
    let clock = Arc::new(ManualClock::at_millis(1_000_000));
    let adapter = Arc::new(SideEffectAdapter::with_clock(backend, clock));
    let runner = Runner::new(adapter.clone());

    // Cold: keys never seen are guessed missing, which is right for fresh keys.
    let first = runner
        .execute(&Action::new("k1", "r"), TTL, ok_apply)
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Applied);
    let cold = adapter.engine().stats();
    assert_eq!(cold.round_trips(), 3, "cold run: {cold:?}");
    assert_eq!(cold.rejections, 0);

    // Warm: the resource record is cached from the previous run.
    for i in 2..=5 {
        let before = adapter.engine().stats();
        let run = runner
            .execute(&Action::new(format!("k{i}"), "r"), TTL, ok_apply)
            .await
            .unwrap();
        assert_eq!(run.outcome, Outcome::Applied);
        assert_eq!(
            run.result.unwrap().as_bytes(),
            format!("done@{i}").as_bytes()
        );
        let after = adapter.engine().stats();
        assert_eq!(after.round_trips() - before.round_trips(), 3, "{after:?}");
        assert_eq!(after.rejections, 0);
    }

    // A replay is one confirmation txn.
    let before = adapter.engine().stats();
    let replay = runner
        .execute(&Action::new("k1", "r"), TTL, ok_apply)
        .await
        .unwrap();
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(
        adapter.engine().stats().round_trips() - before.round_trips(),
        1
    );
}

#[tokio::test]
async fn a_foreign_record_is_malformed_not_a_decision() {
    let backend = memory("se-malformed");
    backend
        .txn(&[], &[Mutation::put("se/act/k", b"not json".to_vec())])
        .await
        .unwrap();
    let adapter = SideEffectAdapter::new(backend.clone());
    let err = adapter
        .acquire(&Action::new("k", "r"), TTL)
        .await
        .unwrap_err();
    assert!(
        matches!(err, SideEffectError::Store(Error::MalformedRecord { ref key, .. }) if key == "se/act/k"),
        "{err:?}"
    );
    // Nothing else was written.
    assert!(!backend.get("se/res/r").await.unwrap().exists());
}

#[tokio::test]
async fn invalid_actions_touch_nothing() {
    let backend = memory("se-invalid");
    let adapter = SideEffectAdapter::new(backend.clone());
    for (action, ttl) in [
        (Action::new("", "r"), TTL),
        (Action::new("k", ""), TTL),
        (Action::new("k", "r"), Duration::ZERO),
        (Action::new("k\0", "r"), TTL),
        (Action::new("k".repeat(2000), "r"), TTL),
    ] {
        let err = adapter.acquire(&action, ttl).await.unwrap_err();
        assert!(matches!(err, SideEffectError::InvalidAction(_)), "{err:?}");
    }
    assert!(backend.keys("").await.unwrap().is_empty());
}

#[tokio::test]
async fn status_reports_each_state() {
    let clock = Arc::new(ManualClock::at_millis(5_000));
    let adapter = SideEffectAdapter::with_clock(memory("se-status"), clock.clone());
    let action = Action::new("k", "r");
    let status = || async { adapter.key_status("k").await.unwrap() };
    assert_eq!(status().await, KeyStatus::Idle);
    let lease = granted(&adapter, &action).await;
    assert_eq!(
        status().await,
        KeyStatus::InFlight {
            resource: "r".into(),
            fence: Fence(1),
            live: true
        }
    );
    let res = adapter.resource_status("r").await.unwrap();
    assert_eq!(res.highest_fence, Fence(1));
    assert_eq!(res.holder.as_deref(), Some("k"));
    assert!(res.live);
    clock.advance(TTL);
    assert!(matches!(
        status().await,
        KeyStatus::InFlight { live: false, .. }
    ));
    adapter
        .mark_uncertain(&action, &lease, "test")
        .await
        .unwrap();
    assert_eq!(
        status().await,
        KeyStatus::Uncertain {
            reason: "test".into()
        }
    );
    adapter
        .resolve_uncertain(&action, &Resolution::applied("r1", "checked"))
        .await
        .unwrap();
    assert_eq!(
        status().await,
        KeyStatus::Completed {
            result: "r1".into()
        }
    );
}

#[tokio::test]
async fn results_survive_binary_bytes() {
    let adapter = SideEffectAdapter::new(memory("se-bytes"));
    let action = Action::new("k", "r");
    let lease = granted(&adapter, &action).await;
    let bytes: Vec<u8> = (0..=255).collect();
    adapter
        .complete(&action, &lease, EffectResult(bytes.clone()))
        .await
        .unwrap();
    let fresh = SideEffectAdapter::new(adapter.engine().backend().clone());
    let again = fresh.acquire(&action, TTL).await.unwrap();
    assert_eq!(again.result().cloned(), Some(EffectResult(bytes)));
}

#[tokio::test]
async fn runner_without_store_fails_loudly() {
    let runner = Runner::from_option(None);
    let err = runner
        .execute(&Action::new("k", "r"), TTL, ok_apply)
        .await
        .unwrap_err();
    assert!(matches!(err, SideEffectError::NoStore));
}

#[tokio::test]
async fn an_intent_on_another_resource_is_judged_by_that_resource() {
    let clock = Arc::new(ManualClock::at_millis(5_000));
    let backend = memory("se-expand");
    let adapter = SideEffectAdapter::with_clock(backend.clone(), clock.clone());
    let on_r1 = Action::new("k", "r1");
    let on_r2 = Action::new("k", "r2");
    granted(&adapter, &on_r1).await;
    // Same key, other resource: still in flight on r1 (read through an expansion).
    let fresh = SideEffectAdapter::with_clock(backend.clone(), clock.clone());
    assert_eq!(
        fresh.acquire(&on_r2, TTL).await.unwrap().outcome(),
        Outcome::Contended
    );
    clock.advance(TTL);
    let fresh = SideEffectAdapter::with_clock(backend, clock);
    assert_eq!(
        fresh.acquire(&on_r2, TTL).await.unwrap().outcome(),
        Outcome::Uncertain
    );
    // Nothing was granted on r2.
    assert_eq!(
        fresh.resource_status("r2").await.unwrap().highest_fence,
        Fence(0)
    );
}
