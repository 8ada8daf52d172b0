//! Grants made in doubt are not left behind: when the txn of a semaphore
//! permit, a read-write lock grant or an election win is sent and its
//! outcome stays unknown (`Indeterminate`), the call withdraws what it
//! offered before it returns the error, so another client can take the
//! grant at once, not after its TTL. Both shapes of doubt, over
//! `FaultyBackend`: the grant applied and every answer was lost, and the
//! grant held back to land after the call gave up (a late commit).
//!
//! Time is a `ManualClock` that never moves: a grant left behind would stay
//! live for the whole test.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::election::{Election, ElectionError, ElectionOptions, GenericElection};
use coord_adapters::lock::{GenericSemaphore, LockError, Semaphore, SemaphoreOptions, WaitOptions};
use coord_adapters::rwlock::{GenericRwLock, RwLock, RwLockOptions};
use coord_adapters::CasOptions;
use coord_backend::{Backend, Clock, ManualClock};
use coord_conformance::faults::{Fault, FaultyBackend, Target};
use coord_memory::SingleProcessMemoryBackend;

const TTL: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(30);

/// How the grant's txn goes into doubt.
#[derive(Clone, Copy, Debug)]
enum Doubt {
    /// The grant applies; its answer and the engine's resends' are lost.
    Landed,
    /// The grant is held back until after the call; the resends are dropped.
    LandsLate,
}

/// A store, a faulty client of it whose next grant goes into doubt as
/// `doubt` says, and the options every adapter here uses: the clock, and an
/// engine that settles a lost txn with two resends.
fn setup(
    doubt: Doubt,
) -> (
    Arc<dyn Backend>,
    Arc<FaultyBackend>,
    Arc<dyn Clock>,
    CasOptions,
) {
    let store: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("doubt").unwrap());
    let faulty = Arc::new(FaultyBackend::new(store.clone(), 7));
    let first = match doubt {
        Doubt::Landed => Fault::LoseReply,
        Doubt::LandsLate => Fault::LateCommit { after_calls: 1_000 },
    };
    let resend = match doubt {
        Doubt::Landed => Fault::LoseReply,
        Doubt::LandsLate => Fault::Drop,
    };
    // One rule fires per call, the first due: these are the next three writes.
    faulty.once(Target::WritingTxn, first);
    faulty.once(Target::WritingTxn, resend);
    faulty.once(Target::WritingTxn, resend);
    let mut cas = CasOptions::default();
    cas.max_attempts = 2;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_millis(1_000_000));
    (store, faulty, clock, cas)
}

/// Run `call` (over the faulty client); it must answer indeterminate
/// (else the doubt did not happen and the test would prove nothing); then
/// let every held-back txn land.
async fn in_doubt<T: std::fmt::Debug, E: std::fmt::Display>(
    what: &str,
    faulty: &FaultyBackend,
    call: impl Future<Output = Result<T, E>>,
    indeterminate: impl Fn(&E) -> bool,
) {
    let answer = call.await;
    match &answer {
        Err(error) if indeterminate(error) => {}
        Err(error) => panic!("{what}: expected an indeterminate answer, got {error}"),
        Ok(answer) => panic!("{what}: expected an indeterminate answer, got {answer:?}"),
    }
    faulty.flush().await;
    assert_eq!(faulty.held_back(), 0);
}

fn lock_doubt(e: &LockError) -> bool {
    matches!(e, LockError::Store(e) if e.is_indeterminate())
}

fn election_doubt(e: &ElectionError) -> bool {
    matches!(e, ElectionError::Store(e) if e.is_indeterminate())
}

#[tokio::test]
async fn a_permit_granted_in_doubt_is_not_left_held() {
    let mut left = Vec::new();
    for doubt in [Doubt::Landed, Doubt::LandsLate] {
        for waiting in [true, false] {
            let (store, faulty, clock, cas) = setup(doubt);
            let options = SemaphoreOptions::default().with_clock(clock).with_cas(cas);
            let sem = GenericSemaphore::with_options(faulty.clone(), options.clone());
            let what = format!("semaphore, {doubt:?}, waiting: {waiting}");
            if waiting {
                let wait = WaitOptions::with_timeout(WAIT);
                in_doubt(&what, &faulty, sem.acquire("s", 1, TTL, &wait), lock_doubt).await;
            } else {
                in_doubt(&what, &faulty, sem.try_acquire("s", 1, TTL), lock_doubt).await;
            }
            let other = GenericSemaphore::with_options(store, options);
            if other.try_acquire("s", 1, TTL).await.unwrap().is_none() {
                left.push(what);
                continue;
            }
            let status = other.status("s").await.unwrap().unwrap();
            assert_eq!((status.holders.len(), status.waiting), (1, 0), "{what}");
        }
    }
    assert!(left.is_empty(), "permits left held: {left:#?}");
}

#[tokio::test]
async fn a_read_write_grant_in_doubt_is_not_left_held() {
    let mut left = Vec::new();
    for doubt in [Doubt::Landed, Doubt::LandsLate] {
        for (waiting, write) in [(true, true), (true, false), (false, true), (false, false)] {
            let (store, faulty, clock, cas) = setup(doubt);
            let options = RwLockOptions::default().with_clock(clock).with_cas(cas);
            let rw = GenericRwLock::with_options(faulty.clone(), options.clone());
            let what = format!("rwlock, {doubt:?}, waiting: {waiting}, write: {write}");
            match (waiting, write) {
                (true, true) => {
                    in_doubt(&what, &faulty, rw.write("k", TTL, WAIT), lock_doubt).await
                }
                (true, false) => {
                    in_doubt(&what, &faulty, rw.read("k", TTL, WAIT), lock_doubt).await
                }
                (false, true) => in_doubt(&what, &faulty, rw.try_write("k", TTL), lock_doubt).await,
                (false, false) => in_doubt(&what, &faulty, rw.try_read("k", TTL), lock_doubt).await,
            }
            let other = GenericRwLock::with_options(store, options);
            if other.try_write("k", TTL).await.unwrap().is_none() {
                left.push(what);
                continue;
            }
            let status = other.status("k").await.unwrap().unwrap();
            assert_eq!(
                (status.holders.len(), status.queued_writers),
                (1, 0),
                "{what}"
            );
        }
    }
    assert!(left.is_empty(), "grants left held: {left:#?}");
}

#[tokio::test]
async fn a_win_in_doubt_is_not_left_leading() {
    let mut left = Vec::new();
    for doubt in [Doubt::Landed, Doubt::LandsLate] {
        for waiting in [true, false] {
            let (store, faulty, clock, cas) = setup(doubt);
            let options = ElectionOptions::default().with_clock(clock).with_cas(cas);
            let election = GenericElection::with_options(faulty.clone(), options.clone());
            let what = format!("election, {doubt:?}, waiting: {waiting}");
            if waiting {
                let call = election.campaign("e", "a", "x", TTL, WAIT);
                in_doubt(&what, &faulty, call, election_doubt).await;
            } else {
                let call = election.try_campaign("e", "a", "x", TTL);
                in_doubt(&what, &faulty, call, election_doubt).await;
            }
            let other = GenericElection::with_options(store, options);
            let Some(won) = other.try_campaign("e", "b", "y", TTL).await.unwrap() else {
                left.push(what);
                continue;
            };
            // The doubtful win may have taken a term; terms never go back.
            assert!(won.term() >= 1, "{what}");
        }
    }
    assert!(left.is_empty(), "leaders nobody knows of left: {left:#?}");
}
