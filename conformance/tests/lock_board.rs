//! The lock and board suites on the in-process memory store, and proof that
//! each suite goes red on deliberately broken adapters (a check that cannot
//! fail is a defect).
//!
//! The broken adapters are small in-process doubles with one bug switched on
//! at a time. Each double with no bug switched on passes every check, so a
//! red check below is caused by the bug, not by the double.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use coord_adapters::board::{
    validate_claim, validate_task_id, Board, BoardError, ClaimedTask, DeadTasks, QueueDepth,
    QueueNames, Task, TaskSpec, TaskState,
};
use coord_adapters::lock::{
    async_trait, validate_lock_input, GenericLock, Lock, LockError, LockHandle, LockOptions,
    LostReason,
};
use coord_adapters::mint_token;
use coord_backend::{Backend, Clock, ManualClock, Mutation, SystemClock};
use coord_conformance::board::{self as board_suite, BoardEnv};
use coord_conformance::lock::{self as lock_suite, lock_factory, LockEnv, TimeControl};
use coord_conformance::unique_namespace;
use coord_memory::SingleProcessMemoryBackend;

mod common;

use common::{
    all_pass, each_fails, every_client, handle, manual_clock, red_on_each_bug, Checks, Red,
};

/// A guard's own estimate of its lease counts from when `try_lock` was
/// sent: a slow grant cannot stretch it past what the store granted.
#[tokio::test(start_paused = true)]
async fn guard_deadline_counts_from_the_request() {
    use coord_adapters::lock::{GuardOptions, LockGuard};
    use coord_conformance::faults::{Fault, FaultyBackend, Target};

    let store = Arc::new(SingleProcessMemoryBackend::new("guard_deadline").unwrap());
    let faulty = Arc::new(FaultyBackend::new(store, 6));
    let lock: Arc<dyn Lock> = Arc::new(GenericLock::new(faulty.clone()));
    let ttl = Duration::from_secs(3);
    faulty.once(Target::WritingTxn, Fault::Delay(Duration::from_secs(2)));
    let started = tokio::time::Instant::now();
    let handle = lock.try_lock("k", ttl).await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    // From now on no renewal answers: the guard must give up when the lease surely ended.
    faulty.always(Target::Txn, Fault::Hang);
    let guard = LockGuard::new(lock.clone(), handle, GuardOptions::default());
    let lost = guard.lost().await;
    assert!(
        started.elapsed() <= ttl,
        "lost ({lost}) signalled {:?} after the request; the lease ended {ttl:?} after it",
        started.elapsed()
    );
}

/// The generic lock again, judging time with the system clock: runs the
/// real-time paths of the suite that native locks (Redis, ...) will use.
mod real_time_lock {
    use super::*;

    fn env() -> LockEnv {
        let namespace = unique_namespace("real_time_lock");
        LockEnv::new(
            lock_factory(move || {
                let namespace = namespace.clone();
                async move {
                    let backend = Arc::new(SingleProcessMemoryBackend::shared(&namespace)?);
                    let options = LockOptions::default().with_clock(Arc::new(SystemClock));
                    Ok(Arc::new(GenericLock::with_options(backend, options)) as Arc<dyn Lock>)
                }
            }),
            TimeControl::Real {
                ttl: Duration::from_millis(500),
            },
        )
    }

    coord_conformance::native_lock_tests!(env());
}

// ---------------------------------------------------------------------------
// Broken locks

#[derive(Clone, Copy, Debug, Default)]
struct LockBugs {
    /// release frees the key whatever the handle.
    release_ignores_token: bool,
    /// renew extends whoever holds the key.
    renew_ignores_token: bool,
    /// every grant gets fence 1.
    fence_not_bumped: bool,
}

#[derive(Debug, Default)]
struct Slot {
    fence: u64,
    holder: Option<(String, u64)>,
}

/// A mutex-backed lock with switchable bugs (one process; a test double).
#[derive(Debug)]
struct BuggyLock {
    slots: Mutex<HashMap<String, Slot>>,
    clock: Arc<ManualClock>,
    bugs: LockBugs,
}

impl BuggyLock {
    fn env(bugs: LockBugs) -> LockEnv {
        let clock = manual_clock();
        let lock: Arc<dyn Lock> = Arc::new(BuggyLock {
            slots: Mutex::default(),
            clock: clock.clone(),
            bugs,
        });
        LockEnv::new(every_client(lock), TimeControl::Manual(clock))
    }

    fn lost(handle: &LockHandle) -> LockError {
        LockError::Lost {
            key: handle.key().to_owned(),
            reason: LostReason::NotHeld,
        }
    }
}

#[async_trait]
impl Lock for BuggyLock {
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        validate_lock_input(key, ttl)?;
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(key.to_owned()).or_default();
        if slot.holder.as_ref().is_some_and(|(_, exp)| *exp > now) {
            return Ok(None);
        }
        slot.fence = if self.bugs.fence_not_bumped {
            1
        } else {
            slot.fence + 1
        };
        let token = mint_token();
        let expires = now + ttl.as_millis() as u64;
        slot.holder = Some((token.clone(), expires));
        Ok(Some(handle(key, &token, slot.fence, ttl, expires)))
    }

    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(handle.key().to_owned()).or_default();
        match &mut slot.holder {
            Some((token, exp))
                if *exp > now && (self.bugs.renew_ignores_token || token == handle.token()) =>
            {
                *exp = now + handle.ttl().as_millis() as u64;
                Ok(())
            }
            _ => Err(Self::lost(handle)),
        }
    }

    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(handle.key().to_owned()).or_default();
        let holds = slot
            .holder
            .as_ref()
            .is_some_and(|(token, exp)| *exp > now && token == handle.token());
        if holds || self.bugs.release_ignores_token {
            slot.holder = None;
            Ok(())
        } else {
            Err(Self::lost(&handle))
        }
    }
}

/// A lock over the store that reads, decides, then writes WITHOUT asserting
/// what it read (the "read-decide-write in three calls" anti-pattern).
#[derive(Debug)]
struct CheckThenWriteLock {
    backend: Arc<dyn Backend>,
    clock: Arc<ManualClock>,
}

impl CheckThenWriteLock {
    fn env() -> LockEnv {
        let clock = manual_clock();
        let namespace = unique_namespace("check_then_write");
        let lock_clock = clock.clone();
        LockEnv::new(
            lock_factory(move || {
                let namespace = namespace.clone();
                let clock = lock_clock.clone();
                async move {
                    let backend = Arc::new(SingleProcessMemoryBackend::shared(&namespace)?);
                    Ok(Arc::new(CheckThenWriteLock { backend, clock }) as Arc<dyn Lock>)
                }
            }),
            TimeControl::Manual(clock),
        )
    }

    /// `(fence, token, expires_ms)`; token empty = free.
    async fn read(&self, key: &str) -> Result<(u64, String, u64), LockError> {
        let entry = self.backend.snapshot(&[key.to_owned()]).await?.remove(0);
        let Some(value) = entry.value else {
            return Ok((0, String::new(), 0));
        };
        let text = String::from_utf8(value).unwrap();
        let mut parts = text.split(' ');
        let fence = parts.next().unwrap().parse().unwrap();
        let token = parts.next().unwrap().to_owned();
        let expires = parts.next().unwrap().parse().unwrap();
        Ok((fence, token, expires))
    }

    async fn write(
        &self,
        key: &str,
        fence: u64,
        token: &str,
        expires: u64,
    ) -> Result<(), LockError> {
        let value = format!("{fence} {token} {expires}");
        self.backend.txn(&[], &[Mutation::put(key, value)]).await?;
        Ok(())
    }
}

#[async_trait]
impl Lock for CheckThenWriteLock {
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        validate_lock_input(key, ttl)?;
        let now = self.clock.now_millis();
        let (fence, token, expires) = self.read(key).await?;
        if !token.is_empty() && expires > now {
            return Ok(None);
        }
        // The bug: the decision is not asserted at write time. The pause only
        // widens the window every such implementation has.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let token = mint_token();
        let expires = now + ttl.as_millis() as u64;
        self.write(key, fence + 1, &token, expires).await?;
        Ok(Some(handle(key, &token, fence + 1, ttl, expires)))
    }

    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let (fence, token, expires) = self.read(handle.key()).await?;
        if token != handle.token() || expires <= now {
            return Err(BuggyLock::lost(handle));
        }
        let expires = now + handle.ttl().as_millis() as u64;
        self.write(handle.key(), fence, &token, expires).await
    }

    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        let now = self.clock.now_millis();
        let (fence, token, expires) = self.read(handle.key()).await?;
        if token != handle.token() || expires <= now {
            return Err(BuggyLock::lost(&handle));
        }
        self.write(handle.key(), fence, "", 0).await
    }
}

// ---------------------------------------------------------------------------
// Broken boards

#[derive(Clone, Copy, Debug, Default)]
struct BoardBugs {
    claim_ignores_deps: bool,
    renew_ignores_token: bool,
    release_ignores_token: bool,
    fence_not_bumped: bool,
    /// claim checks, pauses, then writes: not atomic.
    racy_claim: bool,
}

#[derive(Clone, Debug)]
struct Rec {
    spec: TaskSpec,
    fence: u64,
    /// (agent, token, expires_ms)
    claim: Option<(String, String, u64)>,
    /// (agent, result)
    done: Option<(String, Vec<u8>)>,
}

/// A mutex-backed board with switchable bugs (one process; a test double).
#[derive(Debug)]
struct BuggyBoard {
    tasks: Mutex<BTreeMap<String, Rec>>,
    clock: Arc<ManualClock>,
    bugs: BoardBugs,
}

impl BuggyBoard {
    fn env(bugs: BoardBugs) -> BoardEnv {
        let clock = manual_clock();
        let board: Arc<dyn Board> = Arc::new(BuggyBoard {
            tasks: Mutex::default(),
            clock: clock.clone(),
            bugs,
        });
        BoardEnv::new(every_client(board), clock)
    }

    fn task(rec: &Rec, now: u64) -> Task {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        let state = match (&rec.done, &rec.claim) {
            (Some((agent, result)), _) => TaskState::Completed {
                agent: agent.clone(),
                result: result.clone(),
            },
            (None, Some((agent, _, exp))) if *exp > now => TaskState::Claimed {
                agent: agent.clone(),
                expires_at: at(*exp),
            },
            (None, Some((agent, _, exp))) => TaskState::Expired {
                agent: agent.clone(),
                expired_at: at(*exp),
            },
            (None, None) => TaskState::Open,
        };
        Task {
            id: rec.spec.id.clone(),
            payload: rec.spec.payload.clone(),
            deps: rec.spec.deps.clone(),
            fence: rec.fence,
            state,
            queue: None,
            priority: 0,
            attempts: 0,
            max_attempts: None,
            last_error: None,
            not_before: None,
        }
    }

    /// The live claim's token must match (unless `ignore`), else LeaseLost.
    fn holder<'a>(
        tasks: &'a mut BTreeMap<String, Rec>,
        id: &str,
        token: &str,
        now: u64,
        ignore: bool,
    ) -> Result<&'a mut Rec, BoardError> {
        let rec = tasks
            .get_mut(id)
            .ok_or_else(|| BoardError::NotFound { id: id.to_owned() })?;
        if rec.done.is_some() {
            return Err(BoardError::Completed { id: id.to_owned() });
        }
        match &rec.claim {
            Some((_, t, exp)) if *exp > now && (ignore || t == token) => Ok(rec),
            _ => Err(BoardError::LeaseLost { id: id.to_owned() }),
        }
    }
}

#[async_trait]
impl Board for BuggyBoard {
    async fn add(&self, task: TaskSpec) -> Result<(), BoardError> {
        validate_task_id(&task.id)?;
        for dep in &task.deps {
            validate_task_id(dep)?;
            if *dep == task.id {
                return Err(BoardError::Invalid(coord_backend::InvalidInput::Argument(
                    "self dependency".into(),
                )));
            }
        }
        let mut tasks = self.tasks.lock().unwrap();
        match tasks.get(&task.id) {
            Some(rec) if rec.spec == task => Ok(()),
            Some(_) => Err(BoardError::AlreadyExists { id: task.id }),
            None => {
                let rec = Rec {
                    spec: task,
                    fence: 0,
                    claim: None,
                    done: None,
                };
                tasks.insert(rec.spec.id.clone(), rec);
                Ok(())
            }
        }
    }

    async fn claim(&self, id: &str, agent: &str, ttl: Duration) -> Result<ClaimedTask, BoardError> {
        validate_claim(id, agent, ttl)?;
        let now = self.clock.now_millis();
        let decide = |tasks: &BTreeMap<String, Rec>| -> Result<Rec, BoardError> {
            let rec = tasks
                .get(id)
                .ok_or_else(|| BoardError::NotFound { id: id.to_owned() })?;
            if rec.done.is_some() {
                return Err(BoardError::Completed { id: id.to_owned() });
            }
            if let Some((holder, _, exp)) = &rec.claim {
                if *exp > now {
                    return Err(BoardError::AlreadyClaimed {
                        id: id.to_owned(),
                        agent: holder.clone(),
                        expires_at: UNIX_EPOCH + Duration::from_millis(*exp),
                    });
                }
            }
            let pending: Vec<String> = rec
                .spec
                .deps
                .iter()
                .filter(|d| tasks.get(*d).is_none_or(|r| r.done.is_none()))
                .cloned()
                .collect();
            if !pending.is_empty() && !self.bugs.claim_ignores_deps {
                return Err(BoardError::DependenciesNotMet {
                    id: id.to_owned(),
                    pending,
                });
            }
            Ok(rec.clone())
        };
        let mut rec = if self.bugs.racy_claim {
            let rec = decide(&self.tasks.lock().unwrap())?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            rec
        } else {
            decide(&self.tasks.lock().unwrap())?
        };
        let mut tasks = self.tasks.lock().unwrap();
        if !self.bugs.racy_claim {
            // Decide again under the same lock hold as the write.
            rec = decide(&tasks)?;
        }
        let token = mint_token();
        let expires = now + ttl.as_millis() as u64;
        if !self.bugs.fence_not_bumped || rec.fence == 0 {
            rec.fence += 1;
        }
        rec.claim = Some((agent.to_owned(), token.clone(), expires));
        tasks.insert(id.to_owned(), rec.clone());
        Ok(ClaimedTask {
            id: id.to_owned(),
            payload: rec.spec.payload,
            deps: rec.spec.deps,
            agent: agent.to_owned(),
            token,
            fence: rec.fence,
            expires_at: UNIX_EPOCH + Duration::from_millis(expires),
        })
    }

    async fn renew(&self, id: &str, token: &str, ttl: Duration) -> Result<ClaimedTask, BoardError> {
        validate_claim(id, "renewer", ttl)?;
        let now = self.clock.now_millis();
        let mut tasks = self.tasks.lock().unwrap();
        let rec = Self::holder(&mut tasks, id, token, now, self.bugs.renew_ignores_token)?;
        let (agent, held_token, _) = rec.claim.clone().unwrap();
        let expires = now + ttl.as_millis() as u64;
        rec.claim = Some((agent.clone(), held_token, expires));
        Ok(ClaimedTask {
            id: id.to_owned(),
            payload: rec.spec.payload.clone(),
            deps: rec.spec.deps.clone(),
            agent,
            token: token.to_owned(),
            fence: rec.fence,
            expires_at: UNIX_EPOCH + Duration::from_millis(expires),
        })
    }

    async fn release(&self, id: &str, token: &str) -> Result<(), BoardError> {
        let now = self.clock.now_millis();
        let mut tasks = self.tasks.lock().unwrap();
        let rec = Self::holder(&mut tasks, id, token, now, self.bugs.release_ignores_token)?;
        rec.claim = None;
        Ok(())
    }

    async fn complete(&self, id: &str, token: &str, result: Vec<u8>) -> Result<(), BoardError> {
        let now = self.clock.now_millis();
        let mut tasks = self.tasks.lock().unwrap();
        let rec = Self::holder(&mut tasks, id, token, now, false)?;
        let agent = rec.claim.take().unwrap().0;
        rec.done = Some((agent, result));
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Task, BoardError> {
        validate_task_id(id)?;
        let now = self.clock.now_millis();
        let tasks = self.tasks.lock().unwrap();
        tasks
            .get(id)
            .map(|rec| Self::task(rec, now))
            .ok_or_else(|| BoardError::NotFound { id: id.to_owned() })
    }

    async fn list(&self) -> Result<Vec<Task>, BoardError> {
        let now = self.clock.now_millis();
        let tasks = self.tasks.lock().unwrap();
        Ok(tasks.values().map(|rec| Self::task(rec, now)).collect())
    }
}

/// The lock suite's checks, by name.
fn lock_checks() -> Checks<LockEnv> {
    let cases = lock_suite::native_cases().into_iter();
    cases.map(|case| (case.name, case.run)).collect()
}

// ---------------------------------------------------------------------------
// The doubles without bugs pass: the reds below come from the bugs.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bug_free_doubles_pass_every_check() {
    let bug_free = || BuggyLock::env(LockBugs::default());
    all_pass(lock_checks(), bug_free, "bug-free BuggyLock, lock").await;
    let bug_free = || BuggyBoard::env(BoardBugs::default());
    all_pass(
        board_suite::checks(),
        bug_free,
        "bug-free BuggyBoard, board",
    )
    .await;
}

// ---------------------------------------------------------------------------
// Each suite goes red on each bug of its double.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_suite_red_on_each_bug() {
    let checks = lock_checks();
    let released = ["stale_handle_refused", "release_then_relock"];
    let fences = ["fence_increases", "waiting_lock_acquires_after_release"];
    let reds: &[Red<'_, LockBugs>] = &[
        (|b| b.release_ignores_token = true, &released),
        (|b| b.renew_ignores_token = true, &["stale_handle_refused"]),
        (|b| b.fence_not_bumped = true, &fences),
    ];
    red_on_each_bug(&checks, BuggyLock::env, reds).await;
    let racy = ["try_lock_race", "mutual_exclusion"];
    each_fails(&checks, &racy, CheckThenWriteLock::env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn board_suite_red_on_each_bug() {
    let deps = [
        "unmet_dependencies_refused",
        "claim_after_dependencies_complete",
    ];
    let reds: &[Red<'_, BoardBugs>] = &[
        (|b| b.claim_ignores_deps = true, &deps),
        (
            |b| b.renew_ignores_token = true,
            &["renew_checks_ownership"],
        ),
        (
            |b| b.release_ignores_token = true,
            &["release_and_complete_by_token"],
        ),
        (
            |b| b.fence_not_bumped = true,
            &["fence_increases_on_takeover"],
        ),
        (|b| b.racy_claim = true, &["claim_race"]),
    ];
    red_on_each_bug(&board_suite::checks(), BuggyBoard::env, reds).await;
}

// ---------------------------------------------------------------------------
// Broken queues: a real BoardAdapter (memory store) behind a wrapper whose
// switchable bugs change what the queue calls do.

#[derive(Clone, Copy, Debug, Default)]
struct QueueBugs {
    /// `claim_next` hands the task it just handed out to the next caller too.
    hands_out_twice: bool,
    /// `claim_next` takes the first open task by id, whatever its priority,
    /// run-at or age.
    by_id_order: bool,
    /// `add` forgets the run-at.
    drops_run_at: bool,
    /// `add` forgets the retry policy (unlimited attempts, default backoff).
    drops_retry_policy: bool,
    /// `fail` gives the task back instead (no backoff, no attempt counted).
    fail_releases: bool,
    /// A task with dependencies is added outside its queue.
    dependents_unqueued: bool,
    /// `add_many` adds one task after the other.
    add_many_one_by_one: bool,
    /// `cancel` does nothing.
    cancel_ignored: bool,
    /// `add` forgets that a task runs at most once.
    drops_at_most_once: bool,
    /// `mark_uncertain` fails the attempt instead (retried later).
    uncertain_fails: bool,
    /// `add` of an id that exists with other content overwrites nothing
    /// but says it added it.
    add_swallows_conflicts: bool,
    /// The dead index is not maintained: the store drops every write that
    /// would create a queue's dead entry (see [`DeadIndexDropped`]).
    dead_entries_not_written: bool,
    /// The dead index is not maintained: the store drops every delete of a
    /// queue's dead entry (`retry_dead`, `cancel`, a prune leave it behind).
    dead_entries_not_removed: bool,
}

/// A store that loses the writes of the queues' dead index
/// (`board/queue/<q>/d/...`) of one kind: what an adapter that forgets to
/// maintain that index leaves behind. Everything else goes to the inner
/// store unchanged.
#[derive(Debug)]
struct DeadIndexDropped {
    inner: Arc<dyn Backend>,
    /// Drop puts (the entry never appears) or deletes (it never goes).
    puts: bool,
}

impl DeadIndexDropped {
    fn dropped(&self, mutation: &Mutation) -> bool {
        let dead_entry = mutation
            .key()
            .strip_prefix("board/queue/")
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(_, rest)| rest.starts_with("d/"));
        dead_entry && matches!(mutation, Mutation::Put { .. }) == self.puts
    }
}

#[async_trait]
impl Backend for DeadIndexDropped {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn limits(&self) -> coord_backend::Limits {
        self.inner.limits()
    }

    async fn raw_snapshot(
        &self,
        keys: &[&str],
    ) -> coord_backend::Result<Vec<coord_backend::Entry>> {
        self.inner.raw_snapshot(keys).await
    }

    async fn raw_txn(
        &self,
        asserts: &[coord_backend::Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<coord_backend::TxnOutcome> {
        let kept: Vec<Mutation> = mutations
            .iter()
            .filter(|m| !self.dropped(m))
            .cloned()
            .collect();
        self.inner.txn(asserts, &kept).await
    }

    async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.inner.raw_keys(prefix).await
    }

    async fn raw_first_keys(
        &self,
        prefix: &str,
        limit: usize,
    ) -> coord_backend::Result<Vec<String>> {
        self.inner.raw_first_keys(prefix, limit).await
    }
}

/// A factory of memory stores (one per namespace, shared by every call
/// for it) that drop the dead index's puts or deletes.
fn dead_index_dropped_factory(puts: bool) -> coord_conformance::BackendFactory {
    let stores: Arc<Mutex<HashMap<String, Arc<dyn Backend>>>> = Arc::default();
    Arc::new(move |namespace: String| {
        let stores = stores.clone();
        Box::pin(async move {
            let inner = stores
                .lock()
                .unwrap()
                .entry(namespace.clone())
                .or_insert_with(|| Arc::new(SingleProcessMemoryBackend::new(&namespace).unwrap()))
                .clone();
            Ok(Arc::new(DeadIndexDropped { inner, puts }) as Arc<dyn Backend>)
        })
    })
}

/// What a broken queue wraps, and its bugs.
#[derive(Debug)]
struct BrokenQueue {
    inner: Arc<dyn Board>,
    bugs: QueueBugs,
    /// The last claim `claim_next` answered (for `hands_out_twice`).
    last: Mutex<Option<ClaimedTask>>,
}

impl BrokenQueue {
    fn env(bugs: QueueBugs) -> BoardEnv {
        use coord_adapters::board::{BoardAdapter, BoardOptions};
        let clock = manual_clock();
        let memory = Arc::new(SingleProcessMemoryBackend::new(&unique_namespace("queue")).unwrap());
        let store: Arc<dyn Backend> =
            match (bugs.dead_entries_not_written, bugs.dead_entries_not_removed) {
                (false, false) => memory,
                (puts, _) => Arc::new(DeadIndexDropped {
                    inner: memory,
                    puts,
                }),
            };
        let options = BoardOptions::default().with_clock(clock.clone());
        let board: Arc<dyn Board> = Arc::new(BrokenQueue {
            inner: Arc::new(BoardAdapter::with_options(store, options)),
            bugs,
            last: Mutex::default(),
        });
        BoardEnv::new(every_client(board), clock)
    }

    fn spec(&self, mut spec: TaskSpec) -> TaskSpec {
        if self.bugs.drops_run_at {
            spec.run_at = None;
        }
        if self.bugs.drops_retry_policy {
            spec.retry = Default::default();
        }
        if self.bugs.dependents_unqueued && !spec.deps.is_empty() {
            spec.queue = None;
        }
        if self.bugs.drops_at_most_once {
            spec.at_most_once = false;
        }
        spec
    }
}

#[async_trait]
impl Board for BrokenQueue {
    async fn add(&self, task: TaskSpec) -> Result<(), BoardError> {
        match self.inner.add(self.spec(task)).await {
            Err(BoardError::AlreadyExists { .. }) if self.bugs.add_swallows_conflicts => Ok(()),
            other => other,
        }
    }

    async fn mark_uncertain(&self, id: &str, token: &str, error: &str) -> Result<(), BoardError> {
        if self.bugs.uncertain_fails {
            return self.inner.fail(id, token, error).await.map(|_| ());
        }
        self.inner.mark_uncertain(id, token, error).await
    }

    async fn add_many(&self, tasks: Vec<TaskSpec>) -> Result<(), BoardError> {
        let tasks: Vec<TaskSpec> = tasks.into_iter().map(|t| self.spec(t)).collect();
        if self.bugs.add_many_one_by_one {
            for task in tasks {
                self.inner.add(task).await?;
            }
            return Ok(());
        }
        self.inner.add_many(tasks).await
    }

    async fn claim_next(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
    ) -> Result<Option<ClaimedTask>, BoardError> {
        if self.bugs.hands_out_twice {
            if let Some(again) = self.last.lock().unwrap().take() {
                return Ok(Some(again));
            }
        }
        let claimed = if self.bugs.by_id_order {
            let mut found = None;
            for task in self.inner.list().await? {
                let open = matches!(task.state, TaskState::Open | TaskState::Expired { .. });
                if task.queue.as_deref() == Some(queue) && open {
                    if let Ok(claimed) = self.inner.claim(&task.id, agent, ttl).await {
                        found = Some(claimed);
                        break;
                    }
                }
            }
            found
        } else {
            self.inner.claim_next(queue, agent, ttl).await?
        };
        if self.bugs.hands_out_twice {
            *self.last.lock().unwrap() = claimed.clone();
        }
        Ok(claimed)
    }

    async fn fail(
        &self,
        id: &str,
        token: &str,
        error: &str,
    ) -> Result<coord_adapters::board::Failed, BoardError> {
        if self.bugs.fail_releases {
            self.inner.release(id, token).await?;
            return Ok(coord_adapters::board::Failed::RetryAt(
                UNIX_EPOCH + Duration::from_millis(1_700_000_010_000),
            ));
        }
        self.inner.fail(id, token, error).await
    }

    async fn cancel(&self, id: &str) -> Result<(), BoardError> {
        if self.bugs.cancel_ignored {
            return Ok(());
        }
        self.inner.cancel(id).await
    }

    async fn retry_dead(&self, id: &str) -> Result<(), BoardError> {
        self.inner.retry_dead(id).await
    }

    async fn queues(&self, limit: usize) -> Result<QueueNames, BoardError> {
        self.inner.queues(limit).await
    }

    async fn queue_depth(&self, queue: &str, limit: usize) -> Result<QueueDepth, BoardError> {
        self.inner.queue_depth(queue, limit).await
    }

    async fn dead_tasks(&self, queue: &str, limit: usize) -> Result<DeadTasks, BoardError> {
        self.inner.dead_tasks(queue, limit).await
    }

    async fn claim(&self, id: &str, agent: &str, ttl: Duration) -> Result<ClaimedTask, BoardError> {
        self.inner.claim(id, agent, ttl).await
    }

    async fn renew(&self, id: &str, token: &str, ttl: Duration) -> Result<ClaimedTask, BoardError> {
        self.inner.renew(id, token, ttl).await
    }

    async fn release(&self, id: &str, token: &str) -> Result<(), BoardError> {
        self.inner.release(id, token).await
    }

    async fn complete(&self, id: &str, token: &str, result: Vec<u8>) -> Result<(), BoardError> {
        self.inner.complete(id, token, result).await
    }

    async fn get(&self, id: &str) -> Result<Task, BoardError> {
        self.inner.get(id).await
    }

    async fn list(&self) -> Result<Vec<Task>, BoardError> {
        self.inner.list().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_suite_red_on_each_bug() {
    use coord_conformance::queue as queue_suite;
    let checks = queue_suite::checks();
    all_pass(
        queue_suite::checks(),
        || BrokenQueue::env(QueueBugs::default()),
        "bug-free BrokenQueue, queue",
    )
    .await;
    let retries = [
        "expired_claims_count_as_attempts",
        "backoff_respected",
        "dead_after_max_attempts",
    ];
    let reds: &[Red<'_, QueueBugs>] = &[
        (
            |b| b.hands_out_twice = true,
            &["each_ready_task_claimed_once"],
        ),
        (
            |b| b.by_id_order = true,
            &["priority_then_fifo", "run_at_respected"],
        ),
        (
            |b| b.drops_run_at = true,
            &["run_at_respected", "queue_depth_counts"],
        ),
        (|b| b.drops_retry_policy = true, &retries),
        (
            |b| b.fail_releases = true,
            &["backoff_respected", "dead_after_max_attempts"],
        ),
        (
            |b| b.dependents_unqueued = true,
            &["ready_when_last_dependency_completes"],
        ),
        (
            |b| b.add_many_one_by_one = true,
            &["add_many_all_or_nothing"],
        ),
        (|b| b.cancel_ignored = true, &["cancel_stops_a_task"]),
        (
            |b| b.dead_entries_not_written = true,
            &["dead_index_follows_death"],
        ),
        (
            |b| b.dead_entries_not_removed = true,
            &["dead_index_follows_death"],
        ),
    ];
    red_on_each_bug(&checks, BrokenQueue::env, reds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_suite_red_on_each_bug() {
    use coord_conformance::outbox as outbox_suite;
    let checks = outbox_suite::checks();
    all_pass(
        outbox_suite::checks(),
        || BrokenQueue::env(QueueBugs::default()),
        "bug-free BrokenQueue, outbox",
    )
    .await;
    let reds: &[Red<'_, QueueBugs>] = &[
        (
            |b| b.hands_out_twice = true,
            &["committed_runs_exactly_once"],
        ),
        (
            |b| b.drops_at_most_once = true,
            &["killed_mid_run_is_uncertain"],
        ),
        (
            |b| b.uncertain_fails = true,
            &["unknown_outcome_is_uncertain"],
        ),
        (
            |b| b.fail_releases = true,
            &["not_applied_retried_after_backoff"],
        ),
        (
            |b| b.drops_retry_policy = true,
            &["not_applied_retried_after_backoff"],
        ),
        (
            |b| b.add_swallows_conflicts = true,
            &["same_key_deduplicated"],
        ),
    ];
    red_on_each_bug(&checks, BrokenQueue::env, reds).await;
}

/// The queue checks over a backend factory: green on the memory store, red
/// where the store loses the dead index's puts or deletes.
#[tokio::test]
async fn queue_factory_checks_red_without_the_dead_index() {
    use coord_conformance::queue as queue_suite;
    let memory: coord_conformance::BackendFactory = Arc::new(|namespace: String| {
        Box::pin(async move {
            Ok(Arc::new(SingleProcessMemoryBackend::new(&namespace).unwrap()) as Arc<dyn Backend>)
        })
    });
    queue_suite::dead_index_follows_prune(memory)
        .await
        .unwrap_or_else(|f| panic!("dead_index_follows_prune on the memory store: {f}"));
    for puts in [true, false] {
        let broken = queue_suite::dead_index_follows_prune(dead_index_dropped_factory(puts)).await;
        assert!(
            broken.is_err(),
            "dead_index_follows_prune passed on a store dropping the dead index's {}",
            if puts { "puts" } else { "deletes" }
        );
    }
}
