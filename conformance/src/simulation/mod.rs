//! A deterministic simulation of a small cluster of coord users over one
//! memory store, under seeded faults, pauses and clock steps, on virtual time.
//!
//! **How.** A current-thread tokio runtime with paused time: every task runs
//! on one thread in a fixed order, and time only moves when every task
//! waits, jumping to the next timer. The faults come from one
//! [`FaultyBackend`] per instance (seeded), the actors' choices and the chaos
//! schedule from generators seeded by the run's seed, and the adapters'
//! backoff jitter from [`coord_adapters::jitter::seed_thread_jitter`]. So the
//! same seed gives the same trace (a test checks it), and a failure prints
//! its seed, which replays it exactly. A current-thread runtime was chosen
//! over a network simulator (such as turmoil) because coord's faults are
//! injected between the adapters and the store, where [`FaultyBackend`]
//! already sits; nothing here needs a simulated socket.
//!
//! **Who.** Instances of every adapter, each with its own faulty view of the
//! store and its own clock:
//! - lock holders taking one key with [`LockGuard`](coord_adapters::lock::LockGuard)
//!   (waiting), acting only while
//!   [`LockGuard::is_valid`](coord_adapters::lock::LockGuard::is_valid), and writing
//!   through a [`BackendFencedSink`](coord_adapters::sideeffect::BackendFencedSink):
//!   three on a [`GenericLock`], three more on a [`FairLock`] (which hands
//!   the lock over on release); a wait is sometimes dropped mid-way;
//! - three instances each on a semaphore of two permits, a read-write lock
//!   (reading or writing at random) and a leader election (renewing or
//!   proclaiming while they lead): each waits for its grant (a wait is
//!   sometimes dropped mid-line, as a cancelled task's), acts while the
//!   grant is surely held by its local clock, then releases it or walks
//!   away and lets it expire;
//! - task-board workers claiming and completing the same tasks, and tasks
//!   depending on them; a maintainer pruning completed tasks and side
//!   effects (its pruners' clock two hours ahead of a one-hour retention:
//!   every completion goes at once) and adding a pruned task again under
//!   the same id, that add's txn sometimes held in the server (its reply
//!   lost) across the claims, completion and prune of the life its resend
//!   created;
//! - side-effect runners executing the same action keys, and one more
//!   executing keys of its own on a clock two minutes behind everyone's;
//! - scheduler instances running the same every-second job;
//! - a maintainer reclaiming the store's tombstones every 1.5 s (a few per
//!   pass), so deleted lock records, tickets and claims are re-created above
//!   the raised floor while everyone works.
//!
//! **Faults**, at random times and on random instances: windows of random
//! faults (refused, reply lost, late commit right after the next calls or
//! held for hundreds of calls, lost for good, delayed), write
//! partitions where txns hang, pauses longer than any TTL, and clock steps of
//! up to an hour on scheduler instances. (Lock, board and side-effect
//! instances keep a true wall clock: their leases are judged by the clocks
//! of the instances, which must agree within well under a TTL; fencing, not
//! the clock, keeps their downstream writes safe. See docs/locks.md.)
//!
//! **Invariants** checked after each run:
//! - lock (each of the two): fences are unique per grant, and no two grants
//!   were valid at once (a holder's last valid check comes before the next
//!   holder's grant); for the generic lock also: every fence the store
//!   granted reached its caller or an indeterminate answer (the fair lock
//!   skips fences by design: a grant handed to a waiter that gave up or
//!   paused past its lease is passed on unused);
//! - side effect: each action's closure ran at most once per life of its
//!   key (a life ends when retention removes the key's record, which the
//!   store under every instance notes), and every `Applied`/`Replayed`
//!   answer carries the result of a run that happened;
//! - board: at most one successful completion per task and life (a task
//!   added again is a new life), claim fences unique per id across
//!   lives, a completed task's stored result is its completer's unless it
//!   was pruned, a task vanishes only after a claim, and a task whose
//!   dependency completed is claimable at the end, even once that
//!   dependency was pruned and added again;
//! - scheduler: one run per (job, slot), or runs one after the other by
//!   takeover, each later one started after the earlier one stopped acting
//!   (its lease lost or its work done) and with a higher takeover count;
//! - semaphore, read-write lock, election: fences (terms) unique; at no
//!   moment more than two permits acted on, a writer beside anyone, or two
//!   leaders (a grant's holder acts from its grant to its last valid check);
//!   every fence (term) the store counts reached its caller, or that caller
//!   got an indeterminate answer or dropped its wait with a store call
//!   under way or after one was answered in doubt
//!   ([`FaultyBackend::drop_leaves_doubt`]);
//! - no definite answer that the store contradicts (the checks above, read
//!   back from the store at the end);
//! - once every lease has run out, every lock and recipe is free: a
//!   dropped waiter's ticket or place, a grant walked away from, or a late
//!   commit blocks nobody past its lease; and, once the checker holds them,
//!   nothing dead is left: no fair-lock ticket key, no place in a line, no
//!   holder but the checker;
//! - once every completion is past the retention, prunes empty the
//!   retention indexes (nothing indexed where no prune looks);
//! - once every lease is past the run store's window, a prune leaves no
//!   claim and no running entry of the scheduler's job (a run whose finish
//!   was lost and that nobody took over is forgotten too).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_adapters::board::{Board, BoardAdapter, BoardOptions, TaskSpec};
use coord_adapters::jitter::seed_thread_jitter;
use coord_adapters::lock::{FairLock, FairLockOptions, GenericLock, Lock, LockOptions};
use coord_backend::{Backend, Clock};
use coord_memory::SingleProcessMemoryBackend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::faults::{Fault, FaultyBackend, PauseSwitch, Target};

mod actors;
mod check;
mod recipes;

use actors::{
    behind_runner, board_actor, board_maintainer, lock_actor, outbox_actor, queue_actor, reclaimer,
    runner_actor, start_scheduler, Actor,
};
use check::check;
use recipes::{election_actor, rwlock_actor, semaphore_actor, Holding};

/// What a simulation run covers.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SimOptions {
    /// Virtual time during which actors work and faults are injected
    /// (followed by a quiet period to let leases run out and runs finish).
    pub duration: Duration,
    /// Inject faults, pauses and clock steps (off: a fault-free baseline).
    pub chaos: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            duration: Duration::from_secs(40),
            chaos: true,
        }
    }
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// The seed that replays this run.
    pub seed: u64,
    /// Every event, in order, with its virtual time (no tokens or secrets).
    pub trace: Vec<String>,
    /// Broken invariants (empty when the run passed).
    pub violations: Vec<String>,
    /// Counters (grants, runs, faults, ...).
    pub stats: BTreeMap<&'static str, u64>,
}

impl SimReport {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations and the end of the trace, for a failure message.
    pub fn explain(&self) -> String {
        let tail: Vec<&String> = self.trace.iter().rev().take(60).rev().collect();
        format!(
            "seed {} broke {} invariant(s):\n  {}\nlast events:\n  {}",
            self.seed,
            self.violations.len(),
            self.violations.join("\n  "),
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    }
}

/// Run the simulation for `seed` on a fresh current-thread runtime with
/// paused time (call it from a plain `#[test]`, not from inside a runtime).
pub fn run(seed: u64, options: &SimOptions) -> SimReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    seed_thread_jitter(Some(seed));
    let report = runtime.block_on(simulate(seed, options.clone()));
    seed_thread_jitter(None);
    // Tasks still waiting on hung calls are dropped with the runtime.
    drop(runtime);
    report
}

/// Wall-clock time of one instance: virtual time since the start plus a
/// step the chaos may change.
#[derive(Debug)]
struct SimClock {
    start: Instant,
    offset_ms: AtomicI64,
}

/// Virtual wall-clock time at the start of every run (2026-01-01T00:00:00Z).
const EPOCH_MS: u64 = 1_767_225_600_000;

impl Clock for SimClock {
    fn now(&self) -> SystemTime {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let ms = EPOCH_MS
            .saturating_add(elapsed)
            .saturating_add_signed(self.offset_ms.load(Ordering::SeqCst));
        UNIX_EPOCH + Duration::from_millis(ms)
    }
}

/// The shared event log.
#[derive(Debug)]
struct Log {
    start: Instant,
    lines: Mutex<Vec<String>>,
}

impl Log {
    fn event(&self, who: &str, what: impl AsRef<str>) {
        let ms = self.start.elapsed().as_millis();
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{ms:>7} {who:<4} {}", what.as_ref()));
    }
}

/// One simulated process: its faulty view of the store, clock and pause switch.
#[derive(Debug)]
struct Instance {
    name: String,
    faulty: Arc<FaultyBackend>,
    clock: Arc<SimClock>,
    paused: PauseSwitch,
}

impl Instance {
    /// Wait while this process is paused (called before each step it takes).
    async fn wait_running(&self) {
        self.paused.wait_off().await;
    }

    fn backend(&self) -> Arc<dyn Backend> {
        self.faulty.clone()
    }

    /// A board on this process's faulty client and clock.
    fn board(&self) -> BoardAdapter {
        BoardAdapter::with_options(
            self.backend(),
            BoardOptions::default().with_clock(self.clock.clone()),
        )
    }
}

/// The two locks the simulation fights over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum LockKind {
    /// [`GenericLock`] on key `L`.
    Generic,
    /// [`FairLock`] on key `F`.
    Fair,
}

impl LockKind {
    fn key(self) -> &'static str {
        match self {
            LockKind::Generic => "L",
            LockKind::Fair => "F",
        }
    }

    /// The record holding the lock's fence counter.
    fn record(self) -> &'static str {
        match self {
            LockKind::Generic => "lock/L",
            LockKind::Fair => "fairlock/F/m",
        }
    }

    fn make(self, inst: &Instance) -> Arc<dyn Lock> {
        match self {
            LockKind::Generic => Arc::new(GenericLock::with_options(
                inst.backend(),
                LockOptions::default().with_clock(inst.clock.clone()),
            )),
            LockKind::Fair => Arc::new(FairLock::with_options(
                inst.backend(),
                FairLockOptions::default().with_clock(inst.clock.clone()),
            )),
        }
    }
}

#[derive(Debug)]
struct Grant {
    lock: LockKind,
    who: String,
    fence: u64,
    /// Event numbers (the run is single-threaded: they order everything).
    granted: u64,
    last_valid: Option<u64>,
}

#[derive(Debug, Default)]
struct Facts {
    /// Events so far (orders the lock facts).
    clock: u64,
    grants: Vec<Grant>,
    /// What the semaphore, read-write lock and election granted.
    holdings: Vec<Holding>,
    /// Per recipe: answers that may hide a grant (an indeterminate store
    /// error, or a waiting call dropped mid-way).
    recipe_unknowns: BTreeMap<&'static str, u64>,
    /// action key → (runner, event number) of each closure run.
    effects: BTreeMap<String, Vec<(String, u64)>>,
    /// action key → event numbers at which retention removed its record
    /// (each removal ends a life of the key: a run after it is a new one).
    removals: BTreeMap<String, Vec<u64>>,
    /// action key → results answered as Applied or Replayed.
    answered: BTreeMap<String, Vec<String>>,
    /// task id → (worker, fence) of successful claims.
    claims: BTreeMap<String, Vec<u64>>,
    /// `id@life` (the task's payload names its life) → workers whose
    /// completion was answered Ok.
    completions: BTreeMap<String, Vec<String>>,
    /// action key → answers that were errors.
    effect_errors: BTreeMap<String, u64>,
    /// Lock calls that ended "indeterminate", or were dropped with a store
    /// call under way (a grant may have been committed), per lock.
    lock_errors: BTreeMap<LockKind, u64>,
    /// slot → instances that ran it.
    slot_runs: BTreeMap<u64, Vec<SlotRun>>,
    /// outbox intent key → each run of its handler, in start order.
    outbox_runs: BTreeMap<String, Vec<OutboxRun>>,
    /// Intent keys whose enqueue was answered Ok (committed).
    outbox_enqueued: BTreeSet<String>,
    stats: BTreeMap<&'static str, u64>,
}

/// One run of an outbox handler.
#[derive(Debug)]
struct OutboxRun {
    who: String,
    /// Event numbers: when it started, and when it answered (`None`: it
    /// never did, its dispatcher walked away or was dropped).
    started: u64,
    answered: Option<u64>,
    /// It answered "nothing took effect" (the only run a later run may
    /// follow).
    declined: bool,
}

#[derive(Debug)]
struct SlotRun {
    who: String,
    takeovers: u32,
    /// Event numbers: when the handler started, and the last moment it saw its lease held.
    started: u64,
    last_valid: u64,
}

type Shared = Arc<Mutex<Facts>>;

fn facts(shared: &Shared) -> std::sync::MutexGuard<'_, Facts> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

fn count(shared: &Shared, what: &'static str) {
    *facts(shared).stats.entry(what).or_insert(0) += 1;
}

const LOCK_TTL: Duration = Duration::from_secs(3);
/// The schedulers' job, and how long their run store remembers its claims.
const SCHEDULER_JOB: &str = "tick";
const SCHEDULER_WINDOW: Duration = Duration::from_secs(20);
/// How far the late runner's clock is behind.
const BEHIND_MS: i64 = 120_000;
const TASKS: usize = 6;

/// The queue the queue workers drain: `QUEUED` tasks `q<i>` (3 attempts,
/// 1-2 s backoff) and `qd<i>` waiting on each.
const QUEUE: &str = "q";
const QUEUED: usize = 6;
/// The outbox the outbox dispatchers drain: `OUTBOX_SEEDED` intents
/// committed before work, more enqueued by the dispatchers under faults.
const OUTBOX: &str = "sim";
const OUTBOX_SEEDED: usize = 8;
/// The outbox's board lives under a prefix of its own: its completions
/// would otherwise crowd the board maintainer's small prunes, and the
/// tasks' next lives it exercises would become rare.
const OUTBOX_PREFIX: &str = "obx/";
const ACTIONS: usize = 40;

async fn simulate(seed: u64, options: SimOptions) -> SimReport {
    let start = Instant::now();
    let log = Arc::new(Log {
        start,
        lines: Mutex::new(Vec::new()),
    });
    let shared: Shared = Arc::default();
    let store: Arc<dyn Backend> = Arc::new(Observed {
        inner: Arc::new(
            SingleProcessMemoryBackend::new(&format!("sim{seed:x}"))
                .expect("a memory store for the simulation"),
        ),
        shared: shared.clone(),
    });
    let end = start + options.duration;

    let make = |name: String, salt: u64| {
        Arc::new(Instance {
            faulty: Arc::new(
                FaultyBackend::new(store.clone(), seed.wrapping_mul(1_000_003) ^ salt)
                    .with_label(name.clone()),
            ),
            clock: Arc::new(SimClock {
                start,
                offset_ms: AtomicI64::new(0),
            }),
            paused: PauseSwitch::default(),
            name,
        })
    };
    let lockers: Vec<_> = (0..3).map(|i| make(format!("l{i}"), 10 + i)).collect();
    let fair_lockers: Vec<_> = (0..3).map(|i| make(format!("f{i}"), 50 + i)).collect();
    let workers: Vec<_> = (0..2).map(|i| make(format!("w{i}"), 20 + i)).collect();
    let queue_workers: Vec<_> = (0..3).map(|i| make(format!("q{i}"), 110 + i)).collect();
    let dispatchers: Vec<_> = (0..3).map(|i| make(format!("o{i}"), 120 + i)).collect();
    let board_keeper = make("b0".to_owned(), 60);
    // Completes side effects on a clock two minutes behind everyone else's.
    let late_runner = make("r3".to_owned(), 33);
    late_runner
        .clock
        .offset_ms
        .store(-BEHIND_MS, Ordering::SeqCst);
    let runners: Vec<_> = (0..3).map(|i| make(format!("r{i}"), 30 + i)).collect();
    let crons: Vec<_> = (0..3).map(|i| make(format!("s{i}"), 40 + i)).collect();
    let permit_takers: Vec<_> = (0..3).map(|i| make(format!("p{i}"), 70 + i)).collect();
    let rw_lockers: Vec<_> = (0..3).map(|i| make(format!("rw{i}"), 80 + i)).collect();
    let candidates: Vec<_> = (0..3).map(|i| make(format!("e{i}"), 90 + i)).collect();

    // The tasks exist before anyone works (written without faults): `t<i>`
    // in its first life, and `d<i>` waiting on it.
    let board = BoardAdapter::new(store.clone());
    for t in 0..TASKS {
        board
            .add(TaskSpec::new(format!("t{t}"), b"life-0".to_vec()))
            .await
            .expect("seeding the board");
        board
            .add(TaskSpec::new(format!("d{t}"), b"life-0".to_vec()).with_deps([format!("t{t}")]))
            .await
            .expect("seeding the board");
    }

    let retry = coord_adapters::board::RetryPolicy::attempts(3)
        .with_backoff(Duration::from_secs(1), Duration::from_secs(2));
    let queued = |id: String| {
        TaskSpec::new(id, b"life-0".to_vec())
            .in_queue(QUEUE)
            .with_retry(retry)
    };
    for t in 0..QUEUED {
        board
            .add_many(vec![
                queued(format!("qd{t}")).with_deps([format!("q{t}")]),
                queued(format!("q{t}")).with_priority((t % 3) as i16),
            ])
            .await
            .expect("seeding the queue");
    }

    let outbox = coord_adapters::outbox::Outbox::over(
        Arc::new(BoardAdapter::with_options(
            store.clone(),
            BoardOptions::default().with_key_prefix(OUTBOX_PREFIX),
        )),
        OUTBOX,
    )
    .expect("the simulation's outbox");
    for i in 0..OUTBOX_SEEDED {
        let key = format!("seed-{i}");
        outbox
            .enqueue(&key, b"seeded".to_vec())
            .await
            .expect("seeding the outbox");
        facts(&shared).outbox_enqueued.insert(key);
    }

    let mut tasks = Vec::new();
    let actor = |inst: &Arc<Instance>, salt: u64| Actor::new(inst, &log, &shared, seed ^ salt, end);
    for (i, inst) in dispatchers.iter().enumerate() {
        tasks.push(tokio::spawn(outbox_actor(actor(inst, 1200 + i as u64))));
    }
    for (i, inst) in queue_workers.iter().enumerate() {
        tasks.push(tokio::spawn(queue_actor(actor(inst, 1100 + i as u64))));
    }
    for (i, inst) in lockers.iter().enumerate() {
        let actor = actor(inst, 100 + i as u64);
        tasks.push(tokio::spawn(lock_actor(LockKind::Generic, actor)));
    }
    for (i, inst) in fair_lockers.iter().enumerate() {
        let actor = actor(inst, 500 + i as u64);
        tasks.push(tokio::spawn(lock_actor(LockKind::Fair, actor)));
    }
    for (i, inst) in workers.iter().enumerate() {
        tasks.push(tokio::spawn(board_actor(actor(inst, 200 + i as u64))));
    }
    for (i, inst) in runners.iter().enumerate() {
        tasks.push(tokio::spawn(runner_actor(actor(inst, 300 + i as u64))));
    }
    for (i, inst) in permit_takers.iter().enumerate() {
        tasks.push(tokio::spawn(semaphore_actor(actor(inst, 700 + i as u64))));
    }
    for (i, inst) in rw_lockers.iter().enumerate() {
        tasks.push(tokio::spawn(rwlock_actor(actor(inst, 800 + i as u64))));
    }
    for (i, inst) in candidates.iter().enumerate() {
        tasks.push(tokio::spawn(election_actor(actor(inst, 900 + i as u64))));
    }
    tasks.push(tokio::spawn(reclaimer(store.clone(), log.clone(), end)));
    tasks.push(tokio::spawn(board_maintainer(actor(&board_keeper, 600))));
    tasks.push(tokio::spawn(behind_runner(actor(&late_runner, 330))));
    let mut schedulers = Vec::new();
    for inst in &crons {
        schedulers.push(start_scheduler(inst, &log, &shared));
    }
    let everyone: Vec<Arc<Instance>> = lockers
        .iter()
        .chain(&fair_lockers)
        .chain(&workers)
        .chain(&queue_workers)
        .chain(&dispatchers)
        .chain(&runners)
        .chain([&board_keeper, &late_runner])
        .chain(&permit_takers)
        .chain(&rw_lockers)
        .chain(&candidates)
        .chain(&crons)
        .cloned()
        .collect();
    if options.chaos {
        chaos(&everyone, crons.len(), &log, seed, end).await;
    } else {
        tokio::time::sleep_until(end).await;
    }
    // Quiet period: faults healed, everyone running, leases run out, runs end.
    for inst in &everyone {
        inst.faulty.heal();
        inst.paused.set(false);
        inst.faulty.resume();
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(120), task).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for scheduler in &schedulers {
        let _ = tokio::time::timeout(Duration::from_secs(60), scheduler.shutdown()).await;
    }
    for inst in &everyone {
        inst.faulty.flush().await;
    }

    let mut violations = Vec::new();
    let true_clock = Arc::new(SimClock {
        start,
        offset_ms: AtomicI64::new(0),
    });
    // Holding the facts' lock across awaits is fine: every actor has ended.
    let found = std::mem::take(&mut *facts(&shared));
    check(&found, &store, true_clock, &mut violations).await;
    let mut trace = log.lines.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut stats = found.stats;
    for inst in &everyone {
        let events = inst.faulty.events();
        *stats.entry("faults fired").or_insert(0) += inst.faulty.fired();
        trace.extend(events.into_iter().map(|e| format!("fault {e}")));
    }
    SimReport {
        seed,
        trace,
        violations,
        stats,
    }
}

/// Random faults until `end`: windows of faults, hung writes, pauses, clock steps.
async fn chaos(everyone: &[Arc<Instance>], crons: usize, log: &Log, seed: u64, end: Instant) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x000C_4A05);
    let first_cron = everyone.len() - crons;
    while Instant::now() < end {
        // 26 instances: one event every 130–1650 ms gives each about as
        // many faults as one every 200–2500 ms gave 17.
        tokio::time::sleep(Duration::from_millis(rng.random_range(130..1650))).await;
        let victim = &everyone[rng.random_range(0..everyone.len())];
        let f = &victim.faulty;
        match rng.random_range(0..10) {
            0..=3 => {
                let fault = match rng.random_range(0..7) {
                    0 => Fault::Refuse,
                    1 => Fault::LoseReply,
                    2 => Fault::LateCommit {
                        after_calls: rng.random_range(0..4),
                    },
                    3 => Fault::Drop,
                    4 => Fault::Delay(Duration::from_millis(rng.random_range(10..800))),
                    // Held in the server for many of this instance's calls:
                    // across claims, completions, prunes and reclaims.
                    5 => Fault::LateCommit {
                        after_calls: rng.random_range(20..300),
                    },
                    _ => Fault::LateCommit { after_calls: 1 },
                };
                let target = if rng.random_bool(0.7) {
                    Target::WritingTxn
                } else {
                    Target::Any
                };
                let p = rng.random_range(0.1..0.6);
                log.event(
                    "chaos",
                    format!("{}: {fault:?} on {target:?} p={p:.2}", victim.name),
                );
                f.sometimes(target, p, fault);
                let window = Duration::from_millis(rng.random_range(200..4000));
                heal_later(victim.clone(), window);
            }
            4 => {
                log.event("chaos", format!("{}: writes hang", victim.name));
                f.always(Target::WritingTxn, Fault::Hang);
                heal_later(
                    victim.clone(),
                    Duration::from_millis(rng.random_range(200..3000)),
                );
            }
            5..=7 => {
                let pause =
                    Duration::from_millis(rng.random_range(500..(3 * LOCK_TTL.as_millis() as u64)));
                log.event("chaos", format!("{}: paused {pause:?}", victim.name));
                victim.paused.set(true);
                f.pause();
                let v = victim.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    v.paused.set(false);
                    v.faulty.resume();
                });
            }
            _ => {
                let i = first_cron + rng.random_range(0..crons);
                let victim = &everyone[i];
                let step: i64 = match rng.random_range(0..4) {
                    0 => 3_600_000,
                    1 => -3_600_000,
                    _ => rng.random_range(-30_000..30_000),
                };
                log.event("chaos", format!("{}: clock steps {step} ms", victim.name));
                victim.clock.offset_ms.fetch_add(step, Ordering::SeqCst);
            }
        }
    }
}

/// The store under every instance's faulty view: forwards each call to the
/// memory store and notes in the facts every applied removal of a side
/// effect's record (retention's prune), so the check can tell a key's
/// lives apart.
#[derive(Debug)]
struct Observed {
    inner: Arc<dyn Backend>,
    shared: Shared,
}

#[coord_adapters::lock::async_trait]
impl Backend for Observed {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn limits(&self) -> coord_backend::Limits {
        self.inner.limits()
    }

    fn store_name(&self) -> &'static str {
        self.inner.store_name()
    }

    fn changes(&self) -> Option<&dyn coord_backend::Changes> {
        self.inner.changes()
    }

    async fn reclaim(
        &self,
        options: &coord_backend::ReclaimOptions,
    ) -> Result<coord_backend::Reclaimed, coord_backend::Error> {
        self.inner.reclaim(options).await
    }

    async fn raw_snapshot(
        &self,
        keys: &[&str],
    ) -> Result<Vec<coord_backend::Entry>, coord_backend::Error> {
        self.inner.raw_snapshot(keys).await
    }

    async fn raw_txn(
        &self,
        asserts: &[coord_backend::Assert],
        mutations: &[coord_backend::Mutation],
    ) -> Result<coord_backend::TxnOutcome, coord_backend::Error> {
        let outcome = self.inner.raw_txn(asserts, mutations).await?;
        if outcome.applied {
            for mutation in mutations {
                if let coord_backend::Mutation::Delete { key } = mutation {
                    if let Some(action) = key.strip_prefix("se/act/") {
                        let mut f = facts(&self.shared);
                        f.clock += 1;
                        let at = f.clock;
                        f.removals.entry(action.to_owned()).or_default().push(at);
                    }
                }
            }
        }
        Ok(outcome)
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>, coord_backend::Error> {
        self.inner.raw_keys(prefix).await
    }
}

/// The JSON record at `key`, read through the store itself (`None`: never
/// written, or unreadable).
async fn read_record(store: &Arc<dyn Backend>, key: &str) -> Option<serde_json::Value> {
    let entry = store.snapshot(&[key.to_owned()]).await.ok()?.pop()?;
    serde_json::from_slice(entry.value.as_deref()?).ok()
}

/// The counter `field` of the JSON record at `key` (`None`: never written).
async fn read_counter(store: &Arc<dyn Backend>, key: &str, field: &str) -> Option<u64> {
    read_record(store, key).await?.get(field)?.as_u64()
}

fn heal_later(victim: Arc<Instance>, after: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        victim.faulty.heal();
    });
}

/// A call's answer for the trace: `ok`, or its error's kind.
fn said<E: std::fmt::Display>(result: Result<(), E>) -> String {
    result.map_or_else(|e| kind(&e.to_string()), |()| "ok".into())
}

/// An error's kind for the trace: its first words, without tokens or values.
fn kind(message: &str) -> String {
    message
        .split([':', '('])
        .next()
        .unwrap_or(message)
        .trim()
        .to_owned()
}
