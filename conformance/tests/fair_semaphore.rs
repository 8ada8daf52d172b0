//! The fair lock and semaphore suites on the in-process memory store, and
//! proof that each goes red on deliberately broken doubles (a check that
//! cannot fail is a defect).
//!
//! The doubles keep their state in one process, with one bug switched on at
//! a time; without bugs they pass every check, so each red below comes from
//! its bug.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::lock::{
    async_trait, validate_lock_input, Lock, LockError, LockHandle, LostReason, Permit, Semaphore,
    WaitOptions,
};
use coord_adapters::mint_token;
use coord_backend::{Backend, Clock, InvalidInput, ManualClock};
use coord_conformance::fair_lock::{self as fair_suite, queue_probe, FairEnv};
use coord_conformance::semaphore::{self as sem_suite, SemEnv};
use coord_memory::SingleProcessMemoryBackend;

mod common;

use common::{all_pass, every_client, handle, lost, manual_clock, red_on_each_bug, Red};

// ---------------------------------------------------------------------------
// A fair lock double

#[derive(Clone, Copy, Debug, Default)]
struct FairBugs {
    /// The newest live ticket gets the lock, not the oldest.
    lifo: bool,
    /// Tickets never expire (a dead waiter blocks the queue for ever).
    tickets_never_expire: bool,
    /// A waiter that times out leaves its ticket in the queue.
    keeps_ticket_on_timeout: bool,
    /// `try_lock` ignores the queue.
    try_lock_jumps_queue: bool,
    /// Grants reuse the last fence.
    fence_not_bumped: bool,
    /// A release wakes nobody: waiters learn of it at their fallback poll.
    wakes_nobody: bool,
}

#[derive(Default)]
struct FairSlot {
    fence: u64,
    next: u64,
    holder: Option<(String, u64)>,
    /// (seq, expires_ms)
    queue: Vec<(u64, u64)>,
}

#[derive(Debug)]
struct BuggyFairLock {
    slots: Arc<Mutex<HashMap<String, FairSlot>>>,
    clock: Arc<ManualClock>,
    bugs: FairBugs,
}

impl std::fmt::Debug for FairSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairSlot").finish_non_exhaustive()
    }
}

impl BuggyFairLock {
    fn env(bugs: FairBugs) -> FairEnv {
        let clock = manual_clock();
        let lock = Arc::new(BuggyFairLock {
            slots: Arc::default(),
            clock: clock.clone(),
            bugs,
        });
        let probe = lock.clone();
        FairEnv::new(
            every_client(lock as Arc<dyn Lock>),
            queue_probe(move |key| {
                let probe = probe.clone();
                async move {
                    let slots = probe.slots.lock().unwrap();
                    Ok(slots.get(&key).map_or(0, |s| s.queue.len()))
                }
            }),
            clock,
        )
    }

    fn grant(&self, slot: &mut FairSlot, key: &str, ttl: Duration, now: u64) -> LockHandle {
        if !self.bugs.fence_not_bumped || slot.fence == 0 {
            slot.fence += 1;
        }
        let token = mint_token();
        let expires = now + ttl.as_millis() as u64;
        slot.holder = Some((token.clone(), expires));
        handle(key, &token, slot.fence, ttl, expires)
    }

    fn live(&self, expires: u64, now: u64) -> bool {
        self.bugs.tickets_never_expire || expires > now
    }
}

#[async_trait]
impl Lock for BuggyFairLock {
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        validate_lock_input(key, ttl)?;
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(key.to_owned()).or_default();
        if slot.holder.as_ref().is_some_and(|(_, e)| *e > now) {
            return Ok(None);
        }
        let waiting = slot.queue.iter().any(|&(_, e)| self.live(e, now));
        if waiting && !self.bugs.try_lock_jumps_queue {
            return Ok(None);
        }
        Ok(Some(self.grant(slot, key, ttl, now)))
    }

    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(handle.key().to_owned()).or_default();
        match &mut slot.holder {
            Some((token, expires)) if token == handle.token() && *expires > now => {
                *expires = now + handle.ttl().as_millis() as u64;
                Ok(())
            }
            _ => Err(lost(handle.key(), LostReason::NotHeld)),
        }
    }

    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(handle.key().to_owned()).or_default();
        match &slot.holder {
            Some((token, expires)) if token == handle.token() && *expires > now => {
                slot.holder = None;
                Ok(())
            }
            _ => Err(lost(handle.key(), LostReason::NotHeld)),
        }
    }

    async fn wait_lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<LockHandle, LockError> {
        validate_lock_input(key, ttl)?;
        let deadline = tokio::time::Instant::now() + wait.timeout;
        let seq = {
            let now = self.clock.now_millis();
            let mut slots = self.slots.lock().unwrap();
            let slot = slots.entry(key.to_owned()).or_default();
            slot.next += 1;
            let seq = slot.next;
            slot.queue.push((seq, now + ttl.as_millis() as u64));
            seq
        };
        loop {
            {
                let now = self.clock.now_millis();
                let mut slots = self.slots.lock().unwrap();
                let slot = slots.entry(key.to_owned()).or_default();
                let held = slot.holder.as_ref().is_some_and(|(_, e)| *e > now);
                if !held {
                    let live: Vec<u64> = slot
                        .queue
                        .iter()
                        .filter(|&&(_, e)| self.live(e, now))
                        .map(|&(s, _)| s)
                        .collect();
                    let next = if self.bugs.lifo {
                        live.last()
                    } else {
                        live.first()
                    };
                    if next == Some(&seq) {
                        slot.queue.retain(|&(s, e)| s != seq && self.live(e, now));
                        return Ok(self.grant(slot, key, ttl, now));
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    if !self.bugs.keeps_ticket_on_timeout {
                        slot.queue.retain(|&(s, _)| s != seq);
                    }
                    return Err(LockError::Timeout {
                        key: key.to_owned(),
                        waited: wait.timeout,
                    });
                }
            }
            let poll = if self.bugs.wakes_nobody {
                wait.base_backoff
            } else {
                Duration::from_millis(2)
            };
            tokio::time::sleep_until((tokio::time::Instant::now() + poll).min(deadline)).await;
        }
    }
}

// ---------------------------------------------------------------------------
// A semaphore double

#[derive(Clone, Copy, Debug, Default)]
struct SemBugs {
    /// Grants one permit more than asked for.
    off_by_one: bool,
    /// Expired permits still count as held (they never come back).
    expired_still_counted: bool,
    /// Permits reuse the last fence.
    fence_not_bumped: bool,
    /// Waiting is not fair: no line (the trait's provided `acquire`).
    no_line: bool,
    /// Waiters stand in line, but `try_acquire` ignores them.
    try_jumps_the_line: bool,
}

#[derive(Default)]
struct SemSlot {
    fence: u64,
    permits: u32,
    /// (token, expires_ms)
    holders: Vec<(String, u64)>,
    /// Waiting calls' ids, first come first.
    line: Vec<String>,
}

struct BuggySemaphore {
    slots: Mutex<HashMap<String, SemSlot>>,
    clock: Arc<ManualClock>,
    bugs: SemBugs,
}

impl std::fmt::Debug for BuggySemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuggySemaphore").finish_non_exhaustive()
    }
}

impl BuggySemaphore {
    fn env(bugs: SemBugs) -> SemEnv {
        let clock = manual_clock();
        let sem: Arc<dyn Semaphore> = Arc::new(BuggySemaphore {
            slots: Mutex::default(),
            clock: clock.clone(),
            bugs,
        });
        SemEnv::new(every_client(sem), clock)
    }

    fn counts(&self, expires: u64, now: u64) -> bool {
        self.bugs.expired_still_counted || expires > now
    }

    /// A permit of `slot` for the waiting call `waiter` (None: `try_acquire`)
    /// if one is free for it.
    fn take(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        waiter: Option<&str>,
    ) -> Result<Option<Permit>, LockError> {
        validate_lock_input(key, ttl)?;
        if permits == 0 {
            return Err(LockError::Invalid(InvalidInput::Argument(
                "0 permits".into(),
            )));
        }
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(key.to_owned()).or_default();
        slot.holders.retain(|&(_, e)| self.counts(e, now));
        if !slot.holders.is_empty() && slot.permits != permits {
            return Err(LockError::Invalid(InvalidInput::Argument(
                "other permits".into(),
            )));
        }
        let limit = permits as usize + usize::from(self.bugs.off_by_one);
        let ahead = match waiter {
            Some(id) => slot
                .line
                .iter()
                .position(|w| w == id)
                .unwrap_or(slot.line.len()),
            None if self.bugs.try_jumps_the_line => 0,
            None => slot.line.len(),
        };
        if slot.holders.len() + ahead >= limit {
            return Ok(None);
        }
        if let Some(id) = waiter {
            slot.line.retain(|w| w != id);
        }
        if !self.bugs.fence_not_bumped || slot.fence == 0 {
            slot.fence += 1;
        }
        slot.permits = permits;
        let token = mint_token();
        let expires = now + ttl.as_millis() as u64;
        slot.holders.push((token.clone(), expires));
        Ok(Some(handle(key, &token, slot.fence, ttl, expires)))
    }

    fn line(&self, key: &str, change: impl FnOnce(&mut Vec<String>)) {
        let mut slots = self.slots.lock().unwrap();
        change(&mut slots.entry(key.to_owned()).or_default().line);
    }
}

#[async_trait]
impl Semaphore for BuggySemaphore {
    async fn try_acquire(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>, LockError> {
        self.take(key, permits, ttl, None)
    }

    async fn queued(&self, key: &str) -> Result<Option<usize>, LockError> {
        if self.bugs.no_line {
            return Ok(None);
        }
        let slots = self.slots.lock().unwrap();
        Ok(Some(slots.get(key).map_or(0, |slot| slot.line.len())))
    }

    async fn acquire(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<Permit, LockError> {
        let started = tokio::time::Instant::now();
        let id = mint_token();
        let waiter = (!self.bugs.no_line).then_some(id.as_str());
        if let Some(id) = waiter {
            self.line(key, |line| line.push(id.to_owned()));
        }
        loop {
            if let Some(permit) = self.take(key, permits, ttl, waiter)? {
                return Ok(permit);
            }
            if started.elapsed() >= wait.timeout {
                self.line(key, |line| line.retain(|w| *w != id));
                return Err(LockError::Timeout {
                    key: key.to_owned(),
                    waited: started.elapsed(),
                });
            }
            // Slow, so that the red of `try_jumps_the_line` does not depend
            // on who is first after a release.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn renew(&self, permit: &Permit) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(permit.key().to_owned()).or_default();
        match slot
            .holders
            .iter_mut()
            .find(|(t, e)| t == permit.token() && *e > now)
        {
            Some((_, expires)) => {
                *expires = now + permit.ttl().as_millis() as u64;
                Ok(())
            }
            None => Err(lost(permit.key(), LostReason::NotHeld)),
        }
    }

    async fn release(&self, permit: Permit) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(permit.key().to_owned()).or_default();
        let before = slot.holders.len();
        slot.holders
            .retain(|(t, e)| !(t == permit.token() && *e > now));
        if slot.holders.len() == before {
            return Err(lost(permit.key(), LostReason::NotHeld));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The doubles without bugs pass: the reds below come from the bugs.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bug_free_doubles_pass_every_check() {
    let fair = fair_suite::checks();
    assert_eq!(
        fair.len(),
        fair_suite::cases().len(),
        "every fair_lock check"
    );
    let bug_free = || BuggyFairLock::env(FairBugs::default());
    all_pass(fair, bug_free, "bug-free BuggyFairLock, fair_lock").await;
    let sem = sem_suite::checks();
    assert_eq!(sem.len(), sem_suite::cases().len(), "every semaphore check");
    let bug_free = || BuggySemaphore::env(SemBugs::default());
    all_pass(sem, bug_free, "bug-free BuggySemaphore, semaphore").await;
}

// ---------------------------------------------------------------------------
// Each suite goes red on each bug of its double.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_lock_suite_red_on_each_bug() {
    let reds: &[Red<'_, FairBugs>] = &[
        (|b| b.lifo = true, &["fifo_order"]),
        (
            |b| b.tickets_never_expire = true,
            &["dead_holder_and_ticket_expire"],
        ),
        (
            |b| b.keeps_ticket_on_timeout = true,
            &["timed_out_waiter_leaves_no_hole"],
        ),
        (
            |b| b.try_lock_jumps_queue = true,
            &["try_lock_never_jumps_the_queue"],
        ),
        (
            |b| b.fence_not_bumped = true,
            &["fair_fences_increase", "fair_mutual_exclusion"],
        ),
        (
            |b| b.wakes_nobody = true,
            &[
                "hand_over_wakes_the_next_waiter",
                "release_reaches_a_live_waiter_behind_many_dead",
            ],
        ),
    ];
    red_on_each_bug(&fair_suite::checks(), BuggyFairLock::env, reds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_suite_red_on_each_bug() {
    let in_line = [
        "waiters_are_served_in_order",
        "try_acquire_never_jumps_the_line",
    ];
    let reds: &[Red<'_, SemBugs>] = &[
        (
            |b| b.off_by_one = true,
            &["permit_race", "release_frees_one"],
        ),
        (
            |b| b.expired_still_counted = true,
            &["permits_come_back_after_ttl"],
        ),
        (|b| b.no_line = true, &in_line),
        (
            |b| b.try_jumps_the_line = true,
            &["try_acquire_never_jumps_the_line"],
        ),
        (
            |b| b.fence_not_bumped = true,
            &["permit_fences_increase", "permit_race"],
        ),
    ];
    red_on_each_bug(&sem_suite::checks(), BuggySemaphore::env, reds).await;
}

// ---------------------------------------------------------------------------
// A fair lock's enqueue whose answer is lost and whose txn lands later.

/// The enqueue txn of a waiter commits late (after `after_calls` further
/// calls): the waiter answers Timeout or Indeterminate, never a grant it
/// does not hold; at most one ticket of it is ever in line; and once the
/// leases run out, nothing it left behind blocks the next caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_enqueue_committed_late_leaves_no_lasting_hole() {
    use coord_adapters::lock::{FairLock, FairLockOptions, LockExt};
    use coord_conformance::faults::{Fault, FaultyBackend, Target};
    for after_calls in 0u32..3 {
        let store: Arc<dyn Backend> = Arc::new(
            SingleProcessMemoryBackend::new(&format!("late-enqueue-{after_calls}")).unwrap(),
        );
        let faulty = Arc::new(FaultyBackend::new(store.clone(), u64::from(after_calls)));
        let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
        let options = || FairLockOptions::default().with_clock(clock.clone());
        let holder = FairLock::with_options(store.clone(), options());
        let waiter = FairLock::with_options(faulty.clone(), options());
        let ttl = Duration::from_secs(10);
        let held = holder.try_lock("k", ttl).await.unwrap().unwrap();
        faulty.once(Target::WritingTxn, Fault::LateCommit { after_calls });
        let answer = waiter
            .lock_with(
                "k",
                ttl,
                &WaitOptions::with_timeout(Duration::from_millis(100)),
            )
            .await;
        faulty.flush().await;
        match &answer {
            Err(LockError::Timeout { .. }) => {}
            Err(LockError::Store(e)) if e.is_indeterminate() => {}
            other => panic!(
                "late enqueue ({after_calls}): expected Timeout or Indeterminate, got {other:?}"
            ),
        }
        let status = holder.status("k").await.unwrap().unwrap();
        assert!(
            status.waiting.len() <= 1,
            "late enqueue ({after_calls}): {status:?}"
        );
        assert!(
            status.live,
            "the holder lost the lock to a waiter: {status:?}"
        );
        // Whatever the waiter left behind is dead once its lease ran out.
        clock.advance(ttl + Duration::from_millis(1));
        let _ = holder.release(held).await;
        let next = FairLock::with_options(store.clone(), options());
        let got = next.try_lock("k", ttl).await.unwrap();
        assert!(
            got.is_some(),
            "late enqueue ({after_calls}): a dead ticket still blocks the lock"
        );
        assert_eq!(
            store.keys("fairlock/k/q/").await.unwrap(),
            Vec::<String>::new(),
            "late enqueue ({after_calls}): a ticket stayed behind"
        );
    }
}
