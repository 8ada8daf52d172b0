//! Unit checks of [`RunStore`] that need its internals or a precise clock:
//! pruning and its floor, input refused before any round trip, and the
//! history bound. The store-independent contract is the conformance suite's.

use std::sync::Arc;
use std::time::Duration;

use coord_backend::Backend;
use coord_backend::ManualClock;
use coord_conformance::faults::{Fault, FaultyBackend, Target};
use coord_conformance::unique_namespace;
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

/// Two clients of one fresh namespace, the first through a [`FaultyBackend`]
/// (returned), forgetting claims after a minute, their engines giving up
/// after six attempts (a lost txn's resends included).
fn forgetful_pair(clock: &Arc<ManualClock>) -> (Arc<FaultyBackend>, RunStore, RunStore) {
    let ns = unique_namespace("unit_abandoned");
    let client =
        || -> Arc<dyn Backend> { Arc::new(SingleProcessMemoryBackend::shared(&ns).unwrap()) };
    let mut options =
        RunStoreOptions::default().with_forget_claims_after(Some(Duration::from_secs(60)));
    options.cas.max_attempts = 6;
    let faulty = Arc::new(FaultyBackend::new(client(), 7));
    let first = RunStore::new(faulty.clone(), clock.clone(), options.clone()).unwrap();
    let second = RunStore::new(client(), clock.clone(), options).unwrap();
    (faulty, first, second)
}

/// A run whose owner died (lease ended more than the window ago, nobody took
/// it over) is forgotten like a finished one: its claim and running entry
/// go, the floor passes it. What its owner sent before the prune and the
/// store applies only after it (a heartbeat, a finish, a retried claim, held
/// back in the server) changes nothing: each asserts versions the prune moved.
#[tokio::test]
async fn prune_forgets_an_abandoned_run_and_its_late_owner_changes_nothing() {
    let clock = Arc::new(ManualClock::at_millis(1_000_000));
    let (held, owner, pruner) = forgetful_pair(&clock);
    let ttl = Duration::from_secs(30);
    let dead = ClaimRequest::new("j", 1_000_000, "td", "a", ttl).with_allow_overlap(true);
    assert!(owner.claim(&dead).await.unwrap().won);
    // Its lease ended at 1_030_000; the horizon is now 1_031_000.
    clock.advance(ttl + Duration::from_secs(61));
    held.always(
        Target::WritingTxn,
        Fault::LateCommit {
            after_calls: 1_000_000,
        },
    );
    assert!(owner.heartbeat("j", 1_000_000, "td", ttl).await.is_err());
    assert!(owner
        .finish("j", 1_000_000, "td", FinalStatus::Succeeded)
        .await
        .is_err());
    assert!(owner.claim(&dead).await.is_err());
    held.heal();
    assert!(held.held_back() >= 3, "{:?}", held.events());
    assert_eq!(
        pruner.prune("j").await.unwrap(),
        1,
        "the abandoned run is forgotten"
    );
    held.flush().await;
    let backend = pruner.engine().backend();
    assert_eq!(
        backend.keys("sched/j/slot/").await.unwrap(),
        Vec::<String>::new(),
        "no claim left"
    );
    assert!(
        pruner.active("j").await.unwrap().is_empty(),
        "no running entry left"
    );
    let history = pruner.history("j", 10).await.unwrap();
    assert!(
        history.iter().all(|r| r.status != RunStatus::Running),
        "{history:?}"
    );
    for token in ["td", "other"] {
        let again = ClaimRequest::new("j", 1_000_000, token, "b", ttl).with_allow_overlap(true);
        let refused = pruner.claim(&again).await.unwrap();
        assert!(
            !refused.won && refused.outcome == ClaimOutcome::Done,
            "{refused:?}"
        );
    }
    assert!(matches!(
        owner.heartbeat("j", 1_000_000, "td", ttl).await,
        Err(RunError::NotOwner { .. })
    ));
}

/// A heartbeat that lands between a prune's read and its txn keeps the run:
/// the prune asserts the running set it judged the lease by, so its txn is
/// rejected and the run decided again, live.
#[tokio::test]
async fn a_heartbeat_inside_a_prune_keeps_the_run() {
    let clock = Arc::new(ManualClock::at_millis(1_000_000));
    let (paused, pruner, owner) = forgetful_pair(&clock);
    let ttl = Duration::from_secs(30);
    let run = ClaimRequest::new("j", 1_000_000, "t", "a", ttl);
    assert!(owner.claim(&run).await.unwrap().won);
    clock.advance(ttl + Duration::from_secs(61));
    paused.once(Target::WritingTxn, Fault::Pause);
    let prune = tokio::spawn(async move { pruner.prune("j").await });
    while !paused.is_paused() && !prune.is_finished() {
        tokio::task::yield_now().await;
    }
    assert!(
        paused.is_paused(),
        "the prune did not try to forget the run"
    );
    // The owner was only slow: its heartbeat lands inside the prune.
    owner.heartbeat("j", 1_000_000, "t", ttl).await.unwrap();
    paused.resume();
    assert_eq!(prune.await.unwrap().unwrap(), 0, "a renewed run is kept");
    let active = owner.active("j").await.unwrap();
    assert!(active.len() == 1 && active[0].live, "{active:?}");
    owner
        .finish("j", 1_000_000, "t", FinalStatus::Succeeded)
        .await
        .unwrap();
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

/// A retry recorded through a txn whose reply was lost (and that commits
/// only later) is not guessed: the call fails, and the owner asking again
/// for the same attempt is answered without counting it twice, whether the
/// late copy landed first or not. A late copy that lands after the owner's
/// own retry wrote is refused by its asserts.
#[tokio::test]
async fn a_lost_reply_on_an_attempt_is_asked_again_never_counted_twice() {
    let clock = Arc::new(ManualClock::at_millis(1_000_000));
    let ttl = Duration::from_secs(30);
    for landed_first in [true, false] {
        let (held, owner, reader) = forgetful_pair(&clock);
        let job = format!("j{landed_first}");
        let run = ClaimRequest::new(&job, 1_000_000, "t", "a", ttl);
        assert!(owner.claim(&run).await.unwrap().won);
        held.always(
            Target::WritingTxn,
            Fault::LateCommit {
                after_calls: 1_000_000,
            },
        );
        let lost = owner.record_attempt(&job, 1_000_000, "t", 2, "boom").await;
        assert!(
            matches!(lost, Err(RunError::Store(_))),
            "a lost reply must not read as an answer: {lost:?}"
        );
        held.heal();
        if landed_first {
            held.flush().await;
        }
        owner
            .record_attempt(&job, 1_000_000, "t", 2, "boom")
            .await
            .unwrap();
        held.flush().await;
        let shown = reader.history(&job, 10).await.unwrap();
        assert_eq!(shown[0].attempts, 2, "landed first: {landed_first}");
        owner
            .record_attempt(&job, 1_000_000, "t", 3, "boom again")
            .await
            .unwrap();
        assert_eq!(reader.history(&job, 10).await.unwrap()[0].attempts, 3);
    }
}
