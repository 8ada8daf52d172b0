//! The fault-model suite: every adapter decision over a store whose calls
//! fail the way networked stores do (see [`crate::faults`]), checked against
//! the one rule of docs/shapes.md's fault model: after a fault, an answer is
//! either the truth or "indeterminate", never a definite answer guessed from
//! "nothing has changed yet".
//!
//! Each check wraps the store under test in a [`FaultyBackend`], so it runs
//! on every store (the faults are injected between the adapter and the
//! store's client; faults the wrapper cannot reach are tested per store).
//!
//! - [`late_commit_try_lock`]: a grant whose answer was lost and that lands
//!   after the caller's next call is recognised as the caller's own;
//! - [`late_commit_release`]: likewise for a release (never "lost");
//! - [`late_commit_try_write`]: a read-write lock's write grant that lands late is the caller's;
//! - [`late_commit_semaphore_line`]: a semaphore waiter whose place in line or grant lands late
//!   gets one permit (or indeterminate) and leaves no place behind;
//! - [`late_commit_campaign`]: an election win that lands late is the caller's, never "someone leads";
//! - [`late_commit_board_claim`]: a claim is the caller's, never "already claimed";
//! - [`late_commit_runner`]: the side effect runs once, never "contended" by itself;
//! - [`late_commit_fenced_sink`]: a landed fenced write is never "stale";
//! - [`late_commit_prune`]: retention removes every expired key once, never
//!   a key inside its window, whatever removal lands late;
//! - [`late_commit_board_prune`]: retention removes an expired task, and
//!   every task waiting on it stays claimable, whatever txn of the removal
//!   (marking waiters met, in batches, then deleting) lands late;
//! - [`late_add_across_prune`]: an add whose answer was lost and whose
//!   original txn is held back while the resend's task is claimed,
//!   completed and pruned never brings the task back when it lands;
//! - [`indeterminate_forever_ends`]: txns lost again and again end, with backoff, in "indeterminate";
//! - [`hung_writes_time_out`]: a write partition where txns hang ends in "indeterminate";
//! - [`failed_confirmation_rereads`]: a failed assert-only confirmation is answered from a fresh read.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, BoardError, TaskSpec};
use coord_adapters::cas::CasOptions;
use coord_adapters::election::{Election, ElectionError, GenericElection};
use coord_adapters::lock::{
    GenericLock, GenericSemaphore, Lock, LockError, LockOptions, Semaphore, WaitOptions,
};
use coord_adapters::retention::{PruneOptions, Pruned};
use coord_adapters::rwlock::{GenericRwLock, RwLock};
use coord_adapters::sideeffect::{
    Action, BackendFencedSink, EffectResult, Fence, FencedSink, Outcome, Runner, SideEffectAdapter,
    SideEffectError,
};
use coord_backend::{Backend, BackendExt, Mutation};

use crate::faults::{Fault, FaultyBackend, Target};
use crate::{ensure, unique_namespace, BackendFactory, CheckResult, Failure};

const TTL: Duration = Duration::from_secs(60);

/// The store under test, wrapped (seeded per check, so a failure repeats).
async fn wrapped(
    factory: &BackendFactory,
    label: &str,
    seed: u64,
) -> Result<(Arc<FaultyBackend>, Arc<dyn Backend>), Failure> {
    let store = factory(unique_namespace(label)).await?;
    Ok((Arc::new(FaultyBackend::new(store.clone(), seed)), store))
}

/// The delays after which a held-back txn lands: before the caller's next
/// call (0), right after it (1: the classic "re-read saw nothing"), later (2).
const LATE: [u32; 3] = [0, 1, 2];

/// A `try_lock` whose grant lands late: `Some(handle)` holding the record,
/// or indeterminate; never `None` (nobody else is there).
pub async fn late_commit_try_lock(factory: BackendFactory) -> CheckResult {
    late_grant(&factory, "late_try_lock", GenericLock::new).await
}

/// A lock whose free key "k" one caller takes, for [`late_grant`].
trait LateGrant {
    /// Where the record of "k" is.
    const RECORD: &'static str;
    /// The call that takes "k", as failures name it.
    const CALL: &'static str;
    /// Take "k" and give it back, so the engine then starts from a
    /// remembered record, not a guess of "missing".
    async fn warm_up(&self) -> CheckResult;
    /// Try to take "k": the grant's token, if granted.
    async fn try_grant(&self) -> Result<Option<String>, LockError>;
}

impl LateGrant for GenericLock {
    const RECORD: &'static str = "lock/k";
    const CALL: &'static str = "try_lock";
    async fn warm_up(&self) -> CheckResult {
        let h = self.try_lock("k", TTL).await.map_err(lock_failure)?;
        let h = h.ok_or_else(|| Failure::new("a free lock was not granted"))?;
        self.release(h).await.map_err(lock_failure)
    }
    async fn try_grant(&self) -> Result<Option<String>, LockError> {
        Ok(self.try_lock("k", TTL).await?.map(|h| h.token().to_owned()))
    }
}

impl LateGrant for GenericRwLock {
    const RECORD: &'static str = "rwlock/k";
    const CALL: &'static str = "try_write";
    async fn warm_up(&self) -> CheckResult {
        let h = self.try_read("k", TTL).await.map_err(lock_failure)?;
        let h = h.ok_or_else(|| Failure::new("a free key was not granted"))?;
        self.release(h).await.map_err(lock_failure)
    }
    async fn try_grant(&self) -> Result<Option<String>, LockError> {
        Ok(self
            .try_write("k", TTL)
            .await?
            .map(|h| h.lease().token().to_owned()))
    }
}

/// [`LateGrant::try_grant`] whose grant lands late (after each delay of
/// [`LATE`], from a cold and a warm engine): a token the record holds, or
/// indeterminate; never "held" (nobody else is there).
async fn late_grant<L: LateGrant>(
    factory: &BackendFactory,
    label: &str,
    make: fn(Arc<dyn Backend>) -> L,
) -> CheckResult {
    for after_calls in LATE {
        for warm in [false, true] {
            let (faulty, store) = wrapped(factory, label, u64::from(after_calls)).await?;
            let lock = make(faulty.clone());
            if warm {
                lock.warm_up().await?;
            }
            let answer = landing_late(&faulty, after_calls, lock.try_grant()).await;
            let record = store.get(L::RECORD).await?;
            let record =
                String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned();
            let what = format!("late commit ({after_calls}, warm {warm})");
            match answer {
                Ok(Some(token)) => ensure!(
                    record.contains(&token),
                    "{what}: {} granted, but the record does not hold it: {record}",
                    L::CALL
                ),
                Ok(None) => {
                    return Err(Failure::new(format!(
                        "{what}: {} said \"held by someone else\" with nobody else there; \
                         record: {record}",
                        L::CALL
                    )))
                }
                Err(LockError::Store(e)) if e.is_indeterminate() => {}
                Err(e) => return Err(Failure::new(format!("{what}: {e}"))),
            }
        }
    }
    Ok(())
}

/// `call`, with the next write it sends held back until `after_calls` more
/// calls have gone by; then every held-back write lands.
async fn landing_late<F: std::future::Future>(
    faulty: &FaultyBackend,
    after_calls: u32,
    call: F,
) -> F::Output {
    faulty.once(Target::WritingTxn, Fault::LateCommit { after_calls });
    let answer = call.await;
    faulty.flush().await;
    answer
}

/// A waiting semaphore `acquire` whose writes (its place in line, then
/// its grant) land late, one at a time: the waiter gets one permit, which
/// the record holds, and no place of it is left in line; or it answers
/// indeterminate. Never a timeout while the permit was free for it.
pub async fn late_commit_semaphore_line(factory: BackendFactory) -> CheckResult {
    for after_calls in LATE {
        for nth in [1, 2] {
            let (faulty, store) =
                wrapped(&factory, "late_sem_line", u64::from(after_calls)).await?;
            let holder = GenericSemaphore::new(store);
            let waiter = GenericSemaphore::new(faulty.clone());
            let what = format!("late commit ({after_calls}) of the waiter's write #{nth}");
            let a = holder
                .try_acquire("s", 1, TTL)
                .await
                .map_err(lock_failure)?
                .ok_or_else(|| Failure::new("a free semaphore refused its first permit"))?;
            faulty.nth(Target::WritingTxn, nth, Fault::LateCommit { after_calls });
            let waiting = tokio::spawn(async move {
                let wait = WaitOptions::with_timeout(Duration::from_secs(20))
                    .with_backoff(Duration::from_millis(2), Duration::from_millis(20));
                waiter.acquire("s", 1, TTL, &wait).await
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            holder.release(a).await.map_err(lock_failure)?;
            let answer = waiting
                .await
                .map_err(|e| Failure::new(format!("{what}: the waiter panicked: {e}")))?;
            faulty.flush().await;
            let status = holder
                .status("s")
                .await
                .map_err(lock_failure)?
                .ok_or_else(|| Failure::new("the semaphore record is gone"))?;
            match answer {
                Ok(permit) => {
                    let live: Vec<u64> = status
                        .holders
                        .iter()
                        .filter(|h| h.live)
                        .map(|h| h.fence)
                        .collect();
                    ensure!(
                        live == [permit.fence()],
                        "{what}: granted fence {}, but the record holds {live:?}",
                        permit.fence()
                    );
                    ensure!(
                        status.waiting == 0,
                        "{what}: granted, yet {} place(s) stay in line",
                        status.waiting
                    );
                }
                Err(LockError::Store(e)) if e.is_indeterminate() => {}
                Err(e) => return Err(Failure::new(format!("{what}: {e}"))),
            }
        }
    }
    Ok(())
}

fn lock_failure(e: LockError) -> Failure {
    Failure::new(format!("lock error: {e}"))
}

/// A release that lands late is the caller's release: `Ok` (the lock is
/// free afterwards) or indeterminate, never `Lost`.
pub async fn late_commit_release(factory: BackendFactory) -> CheckResult {
    for after_calls in LATE {
        let (faulty, store) = wrapped(&factory, "late_release", u64::from(after_calls)).await?;
        let lock = GenericLock::new(faulty.clone());
        let held = lock
            .try_lock("k", TTL)
            .await
            .map_err(lock_failure)?
            .ok_or_else(|| Failure::new("a free lock was not granted"))?;
        let answer = landing_late(&faulty, after_calls, lock.release(held)).await;
        match answer {
            Ok(()) => {
                let other = GenericLock::new(store.clone());
                let again = other.try_lock("k", TTL).await.map_err(lock_failure)?;
                ensure!(
                    again.is_some(),
                    "late commit ({after_calls}): release said Ok but the lock is still held"
                );
            }
            Err(LockError::Store(e)) if e.is_indeterminate() => {}
            Err(e) => {
                return Err(Failure::new(format!(
                    "late commit ({after_calls}): release of the holder's own lock: {e}"
                )))
            }
        }
    }
    Ok(())
}

/// A read-write lock's `try_write` whose grant lands late: `Some(handle)`
/// whose token is in the record, or indeterminate; never `None` (nobody
/// else is there).
pub async fn late_commit_try_write(factory: BackendFactory) -> CheckResult {
    late_grant(&factory, "late_try_write", GenericRwLock::new).await
}

/// A campaign whose win lands late: the caller leads (the store's leader
/// is it, with its term) or the answer is indeterminate; never a timeout
/// caused by its own win.
pub async fn late_commit_campaign(factory: BackendFactory) -> CheckResult {
    for after_calls in LATE {
        for warm in [false, true] {
            let (faulty, store) =
                wrapped(&factory, "late_campaign", u64::from(after_calls)).await?;
            let election = GenericElection::new(faulty.clone());
            if warm {
                let won = election
                    .try_campaign("e", "me", "v", TTL)
                    .await
                    .map_err(|e| Failure::new(format!("campaign: {e}")))?
                    .ok_or_else(|| Failure::new("an empty election was not won"))?;
                election
                    .resign(won)
                    .await
                    .map_err(|e| Failure::new(format!("resign: {e}")))?;
            }
            let answer = landing_late(
                &faulty,
                after_calls,
                election.campaign("e", "me", "v", TTL, Duration::from_millis(200)),
            )
            .await;
            let truth = GenericElection::new(store.clone());
            let leader = truth
                .leader("e")
                .await
                .map_err(|e| Failure::new(format!("leader: {e}")))?;
            match answer {
                Ok(won) => ensure!(
                    leader.as_ref().map(|l| (l.candidate.as_str(), l.term))
                        == Some(("me", won.term())),
                    "late commit ({after_calls}, warm {warm}): won term {}, but the store's \
                     leader is {leader:?}",
                    won.term()
                ),
                Err(ElectionError::Store(e)) if e.is_indeterminate() => {}
                Err(e) => {
                    return Err(Failure::new(format!(
                        "late commit ({after_calls}, warm {warm}): campaign with nobody else \
                         there: {e}"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// A board claim that lands late is the caller's claim, never "already claimed".
pub async fn late_commit_board_claim(factory: BackendFactory) -> CheckResult {
    for after_calls in LATE {
        let (faulty, store) = wrapped(&factory, "late_claim", u64::from(after_calls)).await?;
        let board = BoardAdapter::new(faulty.clone());
        board
            .add(TaskSpec::new("t", b"payload".to_vec()))
            .await
            .map_err(board_failure)?;
        let claimed = landing_late(&faulty, after_calls, board.claim("t", "agent", TTL)).await;
        match claimed {
            Ok(task) => {
                // The claim is ours: completing with its token works.
                BoardAdapter::new(store.clone())
                    .complete("t", &task.token, b"done".to_vec())
                    .await
                    .map_err(|e| {
                        Failure::new(format!(
                            "late commit ({after_calls}): claimed, but the claim is not ours: {e}"
                        ))
                    })?;
            }
            Err(BoardError::Store(e)) if e.is_indeterminate() => {}
            Err(e) => {
                return Err(Failure::new(format!(
                    "late commit ({after_calls}): claim with nobody else there: {e}"
                )))
            }
        }
    }
    Ok(())
}

fn board_failure(e: BoardError) -> Failure {
    Failure::new(format!("board error: {e}"))
}

/// `Runner::execute` with any of its writes landing late: the closure runs
/// at most once, an `Applied` answer means it ran, and a single caller is
/// never told `Contended` (nobody else is there).
pub async fn late_commit_runner(factory: BackendFactory) -> CheckResult {
    for nth in 1..=3u64 {
        for after_calls in LATE {
            let seed = nth * 10 + u64::from(after_calls);
            let (faulty, _store) = wrapped(&factory, "late_runner", seed).await?;
            let runner = Runner::new(Arc::new(SideEffectAdapter::new(faulty.clone())));
            let action = Action::new("refund/1", "payments");
            let runs = Arc::new(AtomicU32::new(0));
            faulty.nth(Target::WritingTxn, nth, Fault::LateCommit { after_calls });
            let counted = runs.clone();
            let done = runner
                .execute(&action, TTL, |_lease| async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(EffectResult::from(b"ok".as_slice()))
                })
                .await;
            faulty.flush().await;
            let ran = runs.load(Ordering::SeqCst);
            let context = format!("txn {nth} lands late ({after_calls})");
            ensure!(ran <= 1, "{context}: the closure ran {ran} times");
            match done {
                Ok(execution) => match execution.outcome {
                    Outcome::Applied => ensure!(ran == 1, "{context}: Applied without running"),
                    other => {
                        return Err(Failure::new(format!(
                            "{context}: a single caller got {other:?} (closure ran {ran} times)"
                        )))
                    }
                },
                Err(e) if e.outcome() == Some(Outcome::Uncertain) => {}
                Err(SideEffectError::Store(e)) if e.is_indeterminate() => {}
                Err(e) => return Err(Failure::new(format!("{context}: {e}"))),
            }
        }
    }
    Ok(())
}

/// A fenced write that lands late is never reported stale.
pub async fn late_commit_fenced_sink(factory: BackendFactory) -> CheckResult {
    for after_calls in LATE {
        let (faulty, store) = wrapped(&factory, "late_sink", u64::from(after_calls)).await?;
        let sink = BackendFencedSink::new(faulty.clone());
        sink.write_fenced("ledger", Fence(1), vec![Mutation::put("ledger/a", "1")])
            .await
            .map_err(|e| Failure::new(format!("first fenced write: {e}")))?;
        let answer = landing_late(
            &faulty,
            after_calls,
            sink.write_fenced("ledger", Fence(2), vec![Mutation::put("ledger/a", "2")]),
        )
        .await;
        let now = store.get("ledger/a").await?;
        match answer {
            Ok(()) => ensure!(
                now.value.as_deref() == Some(b"2".as_slice()),
                "late commit ({after_calls}): Ok, but the data reads {:?}",
                now.value
            ),
            Err(SideEffectError::Store(e)) if e.is_indeterminate() => {}
            Err(e) => {
                return Err(Failure::new(format!(
                "late commit ({after_calls}): the holder of the highest fence got {e}; data {:?}",
                now.value
            )))
            }
        }
    }
    Ok(())
}

/// What prunes by retention: the side-effect keys and the board.
trait Prunes {
    async fn prune_by(&self, options: &PruneOptions) -> Result<Pruned, String>;
}

impl Prunes for SideEffectAdapter {
    async fn prune_by(&self, options: &PruneOptions) -> Result<Pruned, String> {
        self.prune(options).await.map_err(|e| e.to_string())
    }
}

impl Prunes for BoardAdapter {
    async fn prune_by(&self, options: &PruneOptions) -> Result<Pruned, String> {
        self.prune(options).await.map_err(|e| e.to_string())
    }
}

/// With the `nth` write of pruning landing late (after `after_calls`): prune
/// passes through `faulty` (`through_faulty`) until one says nothing is left,
/// then (every late txn landed) one pass through the plain store (`plain`),
/// which settles whatever was left in doubt: the total reported removed.
async fn late_prune<P: Prunes>(
    context: &str,
    faulty: &FaultyBackend,
    (nth, after_calls): (u64, u32),
    through_faulty: &P,
    plain: &P,
    window: Duration,
) -> Result<u64, Failure> {
    let window = PruneOptions::after(window);
    faulty.nth(Target::WritingTxn, nth, Fault::LateCommit { after_calls });
    let mut removed = 0;
    for _ in 0..10 {
        let pass = through_faulty
            .prune_by(&window)
            .await
            .map_err(|e| Failure::new(format!("{context}: prune failed: {e}")))?;
        removed += pass.removed;
        if !pass.more {
            break;
        }
    }
    faulty.flush().await;
    let last = plain
        .prune_by(&window)
        .await
        .map_err(|e| Failure::new(format!("{context}: last prune failed: {e}")))?;
    Ok(removed + last.removed)
}

/// A prune pass with any of its removals landing late: across passes every
/// key past the window goes, the key inside it stays, and the passes never
/// report more removals than keys went.
pub async fn late_commit_prune(factory: BackendFactory) -> CheckResult {
    use coord_adapters::sideeffect::KeyStatus;
    use coord_backend::ManualClock;
    const WINDOW: Duration = Duration::from_secs(3600);
    for nth in 1..=3u64 {
        for after_calls in LATE {
            let seed = 100 + nth * 10 + u64::from(after_calls);
            let (faulty, store) = wrapped(&factory, "late_prune", seed).await?;
            let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
            let plain = Arc::new(SideEffectAdapter::with_clock(store.clone(), clock.clone()));
            let runner = Runner::new(plain.clone());
            let run = |key: String| {
                let runner = &runner;
                async move {
                    runner
                        .execute(&Action::new(key, "payments"), TTL, |_lease| async {
                            Ok::<_, std::io::Error>(EffectResult::from(b"ok".as_slice()))
                        })
                        .await
                }
            };
            for i in 0..4 {
                run(format!("old-{i}")).await?;
            }
            clock.advance(WINDOW * 2);
            run("new".to_owned()).await?;
            let adapter = SideEffectAdapter::with_clock(faulty.clone(), clock.clone());
            let context = format!("removal {nth} lands late ({after_calls})");
            let late = (nth, after_calls);
            let removed = late_prune(&context, &faulty, late, &adapter, &plain, WINDOW).await?;
            ensure!(
                removed <= 4,
                "{context}: passes reported {removed} removals of 4 expired keys"
            );
            for i in 0..4 {
                let status = plain.key_status(&format!("old-{i}")).await?;
                ensure!(
                    status == KeyStatus::Idle,
                    "{context}: old-{i} reads as {status:?} after its retention"
                );
            }
            ensure!(
                matches!(plain.key_status("new").await?, KeyStatus::Completed { .. }),
                "{context}: the key inside its window was pruned"
            );
        }
    }
    Ok(())
}

/// A board prune whose `nth` txn lands late (after 0, 1 or 2 more calls):
/// the expired task goes, the one inside its window stays, every task that
/// was waiting on the expired one stays claimable (more waiters than fit
/// in one txn on etcd, so the removal takes several txns), and no
/// reverse-dependency entry is left.
pub async fn late_commit_board_prune(factory: BackendFactory) -> CheckResult {
    use coord_adapters::board::BoardOptions;
    use coord_backend::ManualClock;
    const WINDOW: Duration = Duration::from_secs(3600);
    const WAITERS: usize = 25;
    for nth in 1..=3u64 {
        for after_calls in LATE {
            let seed = 200 + nth * 10 + u64::from(after_calls);
            let (faulty, store) = wrapped(&factory, "late_board_prune", seed).await?;
            let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
            let options = BoardOptions::default().with_clock(clock.clone());
            let plain = BoardAdapter::with_options(store.clone(), options.clone());
            let complete = |id: &'static str| {
                let plain = &plain;
                async move {
                    let claim = plain.claim(id, "agent", TTL).await?;
                    plain.complete(id, &claim.token, b"ok".to_vec()).await
                }
            };
            plain.add(TaskSpec::new("old", b"p".to_vec())).await?;
            for i in 0..WAITERS {
                plain
                    .add(TaskSpec::new(format!("w-{i:02}"), b"p".to_vec()).with_deps(["old"]))
                    .await?;
            }
            complete("old").await?;
            clock.advance(WINDOW * 2);
            plain.add(TaskSpec::new("new", b"p".to_vec())).await?;
            complete("new").await?;
            let adapter = BoardAdapter::with_options(faulty.clone(), options);
            let context = format!("board removal txn {nth} lands late ({after_calls})");
            let late = (nth, after_calls);
            let removed = late_prune(&context, &faulty, late, &adapter, &plain, WINDOW).await?;
            ensure!(
                removed <= 1,
                "{context}: passes reported {removed} removals of 1 expired task"
            );
            ensure!(
                matches!(plain.get("old").await, Err(BoardError::NotFound { .. })),
                "{context}: the expired task is still there"
            );
            ensure!(
                plain.get("new").await.is_ok(),
                "{context}: the task inside its window was pruned"
            );
            for i in 0..WAITERS {
                let id = format!("w-{i:02}");
                plain.claim(&id, "agent", TTL).await.map_err(|e| {
                    Failure::new(format!(
                        "{context}: {id}, waiting on the pruned task, is not claimable: {e}"
                    ))
                })?;
            }
            let entries = store.keys("board/rdep/").await?;
            ensure!(
                entries.is_empty(),
                "{context}: reverse-dependency entries left: {entries:?}"
            );
        }
    }
    Ok(())
}

/// An `add` whose answer is lost: the engine's resend applies, the task is
/// claimed, completed and pruned ("missing" holds again), and only then the
/// original txn, held back in the server, lands. It must not bring the task
/// back: the pruned task would run a second time (its new claim fences are
/// above the old ones, so a fenced downstream would accept them).
pub async fn late_add_across_prune(factory: BackendFactory) -> CheckResult {
    use coord_adapters::board::BoardOptions;
    use coord_backend::ManualClock;
    const WINDOW: Duration = Duration::from_secs(3600);
    for warm in [false, true] {
        let (faulty, store) = wrapped(&factory, "late_add_prune", 7).await?;
        let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
        let options = BoardOptions::default().with_clock(clock.clone());
        let plain = BoardAdapter::with_options(store.clone(), options.clone());
        let adder = BoardAdapter::with_options(faulty.clone(), options);
        let context = format!("late add across a prune (warm {warm})");
        if warm {
            // Another task completed and pruned first: the adder's engine
            // starts from remembered records, not from guesses.
            adder.add(TaskSpec::new("first", b"p".to_vec())).await?;
            let claim = plain.claim("first", "agent", TTL).await?;
            plain
                .complete("first", &claim.token, b"ok".to_vec())
                .await?;
            clock.advance(WINDOW * 2);
            plain.prune(&PruneOptions::after(WINDOW)).await?;
            // The adder learns the removal count the prune moved on.
            adder.add(TaskSpec::new("second", b"p".to_vec())).await?;
        }
        // Held back until flushed: the resend is the copy that applies.
        faulty.once(
            Target::WritingTxn,
            Fault::LateCommit {
                after_calls: u32::MAX,
            },
        );
        let added = adder.add(TaskSpec::new("t", b"p".to_vec())).await;
        // The resend asserts what the original asserted, and nothing moved
        // in between: it applies, so the add is answered Ok.
        ensure!(added.is_ok(), "{context}: add answered {added:?}");
        ensure!(faulty.held_back() == 1, "{context}: no txn was held back");
        let claim = plain.claim("t", "agent", TTL).await?;
        plain.complete("t", &claim.token, b"ok".to_vec()).await?;
        clock.advance(WINDOW * 2);
        let pruned = plain.prune(&PruneOptions::after(WINDOW)).await?;
        ensure!(pruned.removed == 1, "{context}: prune removed {pruned:?}");
        faulty.flush().await;
        let again = plain.get("t").await;
        ensure!(
            matches!(again, Err(BoardError::NotFound { .. })),
            "{context}: the original add landed after the prune and brought the \
             completed task back: {again:?}"
        );
    }
    Ok(())
}

/// Txns whose answers are lost again and again, never applying: the
/// decision ends (bounded, with backoff) in "indeterminate".
pub async fn indeterminate_forever_ends(factory: BackendFactory) -> CheckResult {
    let (faulty, store) = wrapped(&factory, "indeterminate_forever", 1).await?;
    let lock = GenericLock::new(faulty.clone());
    let within = Duration::from_secs(60);
    ends_indeterminate(&faulty, &lock, Fault::Drop, within, "every txn lost").await?;
    ensure!(
        faulty.fired() <= 128,
        "{} txns sent before giving up: the retries are not bounded",
        faulty.fired()
    );
    ensure!(
        !store.get("lock/k").await?.exists(),
        "nothing was applied, yet a record exists"
    );
    Ok(())
}

/// A write partition where txns never answer: with a call timeout, the
/// decision ends in "indeterminate" (a hung write may still apply).
pub async fn hung_writes_time_out(factory: BackendFactory) -> CheckResult {
    let (faulty, _store) = wrapped(&factory, "hung_writes", 2).await?;
    let mut cas = CasOptions::default();
    cas.call_timeout = Some(Duration::from_millis(200));
    cas.max_attempts = 4;
    let lock = GenericLock::with_options(faulty.clone(), LockOptions::default().with_cas(cas));
    let within = Duration::from_secs(30);
    ends_indeterminate(&faulty, &lock, Fault::Hang, within, "hung writes").await?;
    // Reads still answer during the partition.
    faulty.heal();
    let after = lock.try_lock("k", TTL).await.map_err(lock_failure)?;
    ensure!(
        after.is_some(),
        "after the partition healed the lock is not free"
    );
    Ok(())
}

/// `lock.try_lock` of a free key while every write meets `fault` (`what`):
/// it ends within `within`, in "indeterminate".
async fn ends_indeterminate(
    faulty: &FaultyBackend,
    lock: &GenericLock,
    fault: Fault,
    within: Duration,
    what: &str,
) -> CheckResult {
    faulty.always(Target::WritingTxn, fault);
    let answer = tokio::time::timeout(within, lock.try_lock("k", TTL))
        .await
        .map_err(|_| Failure::new(format!("{what}: try_lock did not end within {within:?}")))?;
    ensure!(
        matches!(&answer, Err(LockError::Store(e)) if e.is_indeterminate()),
        "{what}: expected indeterminate, got {answer:?}"
    );
    Ok(())
}

/// A remembered "held" is confirmed with an assert-only txn; when that
/// confirmation's answer is lost, nothing was written either way, so the
/// answer comes from a fresh read, not "indeterminate".
pub async fn failed_confirmation_rereads(factory: BackendFactory) -> CheckResult {
    let (faulty, store) = wrapped(&factory, "failed_confirmation", 3).await?;
    let holder = GenericLock::new(store.clone());
    let _held = holder
        .try_lock("k", TTL)
        .await
        .map_err(lock_failure)?
        .ok_or_else(|| Failure::new("a free lock was not granted"))?;
    let waiter = GenericLock::new(faulty.clone());
    // Learn "held" once (the engine remembers the record).
    ensure!(
        waiter
            .try_lock("k", TTL)
            .await
            .map_err(lock_failure)?
            .is_none(),
        "a held lock was granted"
    );
    for fault in [Fault::Drop, Fault::LoseReply, Fault::Refuse] {
        faulty.once(Target::Txn, fault);
        let answer = waiter.try_lock("k", TTL).await;
        ensure!(
            matches!(answer, Ok(None)),
            "{fault:?} on the assert-only confirmation of \"held\": got {answer:?}"
        );
        ensure!(faulty.fired() > 0, "the fault did not fire");
    }
    Ok(())
}

crate::__define_suite! {$
    /// The fault model suite's one list of cases (see [`crate::__define_suite!`]).
    __fault_model_suite "fault_model";
    /// Every case of the fault-model suite.
    cases;
    /// Expand every case of the fault-model suite into `#[tokio::test]`s.
    fault_model_tests(fault_model);
    late_commit_try_lock,
    late_commit_release,
    late_commit_try_write,
    late_commit_semaphore_line,
    late_commit_campaign,
    late_commit_board_claim,
    late_commit_runner,
    late_commit_fenced_sink,
    late_commit_prune,
    late_commit_board_prune,
    late_add_across_prune,
    indeterminate_forever_ends,
    hung_writes_time_out,
    failed_confirmation_rereads,
}
