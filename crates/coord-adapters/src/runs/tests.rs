//! Unit checks of [`RunStore`] that need its internals or a precise clock:
//! pruning and its floor, input refused before any round trip, and the
//! history bound. The store-independent contract is the conformance suite's.

use std::sync::Arc;
use std::time::Duration;

use coord_backend::Backend;
use coord_backend::ManualClock;
use coord_memory::SingleProcessMemoryBackend;

use super::*;

fn store(clock: Arc<ManualClock>, options: RunStoreOptions) -> RunStore {
    let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("unit").unwrap());
    RunStore::new(backend, clock, options).unwrap()
}

#[tokio::test]
async fn prune_forgets_only_old_finished_claims() {
    let clock = Arc::new(ManualClock::at_millis(1_000_000));
    let s = store(
        clock.clone(),
        RunStoreOptions::default().with_forget_claims_after(Some(Duration::from_secs(60))),
    );
    let ttl = Duration::from_secs(30);
    for slot in [1_000_000u64, 1_001_000] {
        let req =
            ClaimRequest::new("j", slot, format!("t{slot}"), "a", ttl).with_allow_overlap(true);
        assert!(s.claim(&req).await.unwrap().won);
    }
    s.finish("j", 1_000_000, "t1000000", FinalStatus::Succeeded)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(59));
    assert_eq!(s.prune("j").await.unwrap(), 0, "inside the window");
    clock.advance(Duration::from_secs(2));
    assert_eq!(s.prune("j").await.unwrap(), 1, "the running claim stays");
    // Forgotten, yet never claimable again: the floor kept in the store
    // refuses it whatever the claimer's clock says.
    let again = ClaimRequest::new("j", 1_000_000, "late", "b", ttl).with_allow_overlap(true);
    let refused = s.claim(&again).await.unwrap();
    assert!(
        !refused.won && refused.outcome == ClaimOutcome::Done,
        "{refused:?}"
    );
    // A later slot than the forgotten ones is claimable as usual.
    let later = ClaimRequest::new("j", 1_002_000, "next", "b", ttl).with_allow_overlap(true);
    assert!(s.claim(&later).await.unwrap().won);
}

#[tokio::test]
async fn bad_input_is_refused_before_the_store() {
    let s = store(
        Arc::new(ManualClock::at_millis(0)),
        RunStoreOptions::default(),
    );
    let ttl = Duration::from_secs(1);
    for job in ["", "a/b", "ünïcode", &"x".repeat(129)] {
        let req = ClaimRequest::new(job, 1, "t", "a", ttl);
        assert!(
            matches!(s.claim(&req).await, Err(RunError::InvalidJobName(_))),
            "{job:?}"
        );
    }
    let req = ClaimRequest::new("j", 1, "", "a", ttl);
    assert!(matches!(
        s.claim(&req).await,
        Err(RunError::InvalidArgument(_))
    ));
    let req = ClaimRequest::new("j", 1, "t", "a", Duration::ZERO);
    assert!(matches!(
        s.claim(&req).await,
        Err(RunError::InvalidArgument(_))
    ));
    assert!(s.engine().stats().round_trips() == 0);
    let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("unit").unwrap());
    let clock = Arc::new(ManualClock::at_millis(0));
    assert!(RunStore::new(
        backend.clone(),
        clock.clone(),
        RunStoreOptions::default().with_history_size(0)
    )
    .is_err());
    assert!(RunStore::new(
        backend,
        clock,
        RunStoreOptions::default().with_forget_claims_after(Some(Duration::ZERO))
    )
    .is_err());
}

#[tokio::test]
async fn history_is_bounded_and_skips_do_not_block_claims() {
    let clock = Arc::new(ManualClock::at_millis(10_000));
    let s = store(clock, RunStoreOptions::default().with_history_size(3));
    let ttl = Duration::from_secs(30);
    for slot in 1..=5u64 {
        assert!(s
            .record_skip("j", slot, "a", SkipReason::Late)
            .await
            .unwrap());
    }
    assert!(
        !s.record_skip("j", 5, "b", SkipReason::Late).await.unwrap(),
        "recorded once"
    );
    assert!(
        !s.record_skip("j", 1, "b", SkipReason::Late).await.unwrap(),
        "older than kept"
    );
    let h = s.history("j", 10).await.unwrap();
    assert_eq!(h.iter().map(|r| r.slot).collect::<Vec<_>>(), vec![5, 4, 3]);
    let req = ClaimRequest::new("j", 4, "t", "b", ttl);
    assert!(
        s.claim(&req).await.unwrap().won,
        "a skip record does not block an on-time claim"
    );
    let h = s.history("j", 10).await.unwrap();
    assert_eq!(h[1].status, RunStatus::Running);
    assert_eq!(h[1].instance, "b");
    assert!(!s.record_skip("j", 4, "c", SkipReason::Late).await.unwrap());
}
