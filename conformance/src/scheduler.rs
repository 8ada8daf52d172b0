//! The scheduler suite: the run-store contract of `coord_scheduler::RunStore`.
//!
//! Every check is a plain `async fn` over a [`SchedulerEnv`]: a
//! [`BackendFactory`] (each call is another client of the store under test,
//! as another process would have) and a [`StoreMaker`] that builds the
//! [`SlotStore`] under test over one client (by default
//! [`coord_scheduler::RunStore`]; tests pass deliberately broken ones to
//! prove the checks fail). Time is a `ManualClock` the check moves; the run
//! store judges lease expiry with it, so the checks run unchanged on any store.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`claim_race`]: N instances claim one `(job, slot)` at once, many
//!   times: exactly one wins each slot, and history names the winner;
//! - [`repeat_safety`]: the winning token claiming again still wins (also
//!   through another client); another token loses;
//! - [`history_newest_first`]: runs from several instances (and a manual
//!   run) come back newest first, with instance, status, message, duration;
//! - [`heartbeat_ownership`]: a heartbeat extends only the owner's lease;
//! - [`takeover_after_expiry`]: a live lease is never taken; an expired one
//!   is, once, counted, and the old holder can no longer heartbeat/finish/release;
//! - [`overlap_protection`]: a live run of slot N blocks slot N+1 unless the
//!   job allows overlap; finished or expired runs do not block;
//! - [`finish_release_by_token`]: finish / release act only with the owning
//!   token (idempotent for it); release lets a backup take over at once;
//! - [`skip_recorded_once`]: a skipped slot is recorded once, never over a claim,
//!   and does not block a later claim;
//! - [`manual_runs_not_deduplicated`]: manual runs at one instant are all recorded;
//! - [`dedupe_window_refusal`]: a store that forgets claims declares it, and the
//!   scheduler refuses jobs whose jitter + max lateness is not below it;
//! - [`running_slot_below_the_floor`]: a slot still running when a later one
//!   was forgotten stays its owner's (a retried claim wins), can be taken over
//!   once expired, and leaves no running entry behind once finished; a
//!   forgotten slot stays refused;
//! - [`abandoned_run_forgotten`]: a run whose lease ended longer than the
//!   window ago without a finish or a takeover is forgotten by `prune` (no
//!   longer active, not shown running), and stays refused to everyone, its
//!   owner included; a live run, and one whose lease ended inside the
//!   window, stay;
//! - [`attempts_by_token`]: a run counts its attempts (1 at its claim); a
//!   retry is recorded only by the owning token and only as the next
//!   attempt (asked again: answered, not counted twice); a takeover starts
//!   the next attempt and refuses the old holder's; a takeover past
//!   `max_attempts` finishes the run failed instead of starting it.

use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Backend, Clock, ManualClock};
use coord_scheduler::{
    handler, ClaimOutcome, ClaimRequest, FinalStatus, Job, JobOptions, LockingHint, ManualRun,
    RunStatus, RunStore, RunStoreOptions, Schedule, Scheduler, SchedulerOptions, SkipReason,
    SlotStore,
};

use crate::{ensure, joined, unique_namespace, BackendFactory, CheckResult, Failure};

/// Builds the [`SlotStore`] under test over one backend client.
pub type StoreMaker = Arc<
    dyn Fn(
            Arc<dyn Backend>,
            Arc<dyn Clock>,
            RunStoreOptions,
        ) -> Result<Arc<dyn SlotStore>, coord_scheduler::Error>
        + Send
        + Sync,
>;

/// The [`StoreMaker`] of the real [`RunStore`].
pub fn run_store_maker() -> StoreMaker {
    Arc::new(|backend, clock, options| {
        Ok(Arc::new(RunStore::new(backend, clock, options)?) as Arc<dyn SlotStore>)
    })
}

/// What the checks run against.
#[derive(Clone)]
pub struct SchedulerEnv {
    /// Clients of the store under test.
    pub backends: BackendFactory,
    /// The run store built over each client.
    pub stores: StoreMaker,
}

impl SchedulerEnv {
    /// The real [`RunStore`] over `backends`.
    pub fn new(backends: BackendFactory) -> Self {
        SchedulerEnv {
            backends,
            stores: run_store_maker(),
        }
    }

    /// The same store with another [`SlotStore`] implementation.
    pub fn with_stores(mut self, stores: StoreMaker) -> Self {
        self.stores = stores;
        self
    }

    /// A new client (one "instance") of namespace `ns`.
    pub async fn store(
        &self,
        ns: &str,
        clock: Arc<dyn Clock>,
        options: RunStoreOptions,
    ) -> Result<Arc<dyn SlotStore>, Failure> {
        let backend = (self.backends)(ns.to_owned()).await?;
        Ok((self.stores)(backend, clock, options)?)
    }
}

impl From<coord_scheduler::Error> for Failure {
    fn from(error: coord_scheduler::Error) -> Self {
        Failure::new(format!("scheduler error: {error}"))
    }
}

impl From<coord_scheduler::RunError> for Failure {
    fn from(error: coord_scheduler::RunError) -> Self {
        Failure::new(format!("run store error: {error}"))
    }
}

/// An instant well after the epoch, in ms (round, so slots read easily).
const T0: u64 = 1_700_000_000_000;
const TTL: Duration = Duration::from_secs(10);

fn clock_at(ms: u64) -> Arc<ManualClock> {
    Arc::new(ManualClock::at_millis(ms))
}

fn req(job: &str, slot: u64, token: &str, instance: &str) -> ClaimRequest {
    ClaimRequest::new(job, slot, token, instance, TTL)
}

/// `store` wins `request`, or the check fails.
async fn must_claim(store: &dyn SlotStore, request: &ClaimRequest) -> CheckResult {
    let claim = store.claim(request).await?;
    ensure!(
        claim.won,
        "{} could not claim slot {} of {}: {claim:?}",
        request.instance,
        request.slot,
        request.job
    );
    Ok(())
}

/// The heartbeat, finish and release of the old holder `token` of
/// `(job, slot)` are each refused as [`NotOwner`](coord_scheduler::RunError::NotOwner).
async fn refused_to_old_holder(
    store: &dyn SlotStore,
    job: &str,
    slot: u64,
    token: &str,
    when: &str,
) -> CheckResult {
    for (what, result) in [
        (
            "heartbeat",
            store.heartbeat(job, slot, token, TTL).await.map(|_| ()),
        ),
        (
            "finish",
            store.finish(job, slot, token, FinalStatus::Succeeded).await,
        ),
        ("release", store.release(job, slot, token).await),
    ] {
        ensure!(
            matches!(result, Err(coord_scheduler::RunError::NotOwner { .. })),
            "the old holder's {what} {when} was not refused: {result:?}"
        );
    }
    Ok(())
}

/// `N` clients ("instances") of a fresh namespace named after `prefix`,
/// with default options, sharing one clock at [`T0`].
async fn instances<const N: usize>(
    env: &SchedulerEnv,
    prefix: &str,
) -> Result<(Arc<ManualClock>, [Arc<dyn SlotStore>; N]), Failure> {
    let ns = unique_namespace(prefix);
    let clock = clock_at(T0);
    let mut stores = Vec::with_capacity(N);
    for _ in 0..N {
        stores.push(
            env.store(&ns, clock.clone(), RunStoreOptions::default())
                .await?,
        );
    }
    match stores.try_into() {
        Ok(stores) => Ok((clock, stores)),
        Err(_) => unreachable!("exactly N stores were made"),
    }
}

/// `instances` clients race to claim each of `rounds` slots of one job:
/// exactly one wins each slot (store errors are failures, never losers),
/// and the slot's history record names the winner.
pub async fn claim_race(env: &SchedulerEnv, instances: usize, rounds: u64) -> CheckResult {
    let ns = unique_namespace("sched_race");
    let clock = clock_at(T0);
    let mut stores = Vec::new();
    for _ in 0..instances {
        stores.push(
            env.store(&ns, clock.clone(), RunStoreOptions::default())
                .await?,
        );
    }
    for round in 0..rounds {
        let slot = T0 + round * 1_000;
        let barrier = Arc::new(tokio::sync::Barrier::new(instances));
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            let store = store.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                // Overlap allowed: this check is about one slot, not about the previous one.
                let request = ClaimRequest::new(
                    "race",
                    slot,
                    coord_adapters::mint_token(),
                    format!("i{i}"),
                    TTL,
                )
                .with_allow_overlap(true);
                store.claim(&request).await
            }));
        }
        let mut winners = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            let claim = joined(task, format!("instance {i}")).await??;
            if claim.won {
                winners.push(i);
            } else {
                ensure!(
                    claim.outcome == ClaimOutcome::Running,
                    "slot {slot}: a loser of the race got {:?} (expected Running)",
                    claim.outcome
                );
            }
        }
        ensure!(
            winners.len() == 1,
            "slot {slot}: {} of {instances} racing instances won the claim (expected exactly 1): {winners:?}",
            winners.len()
        );
        let history = stores[0].history("race", 1).await?;
        ensure!(
            history.first().map(|r| (r.slot, r.instance.clone()))
                == Some((slot, format!("i{}", winners[0]))),
            "slot {slot}: history does not name the winner i{}: {history:?}",
            winners[0]
        );
    }
    Ok(())
}

/// The winning token claiming again still wins (from the same client and
/// from a fresh client, as after a reconnect); another token loses.
pub async fn repeat_safety(env: &SchedulerEnv) -> CheckResult {
    let (_, [a, b, a_again]) = instances(env, "sched_repeat").await?;
    let mine = req("repeat", T0, "token-a", "a");
    let theirs = req("repeat", T0, "token-b", "b");
    let first = a.claim(&mine).await?;
    ensure!(
        first.won && first.outcome == ClaimOutcome::Won,
        "first claim: {first:?}"
    );
    let again = a.claim(&mine).await?;
    ensure!(again.won, "the same token claiming again lost: {again:?}");
    let other = b.claim(&theirs).await?;
    ensure!(!other.won, "another token won a claimed slot: {other:?}");
    ensure!(
        other.holder.as_deref() == Some("a"),
        "the loser was not told who holds the slot: {other:?}"
    );
    let reconnect = a_again.claim(&mine).await?;
    ensure!(
        reconnect.won,
        "the same token through another client lost: {reconnect:?}"
    );
    let other = b.claim(&theirs).await?;
    ensure!(!other.won, "another token won after the repeats: {other:?}");
    // Still exactly one run in history.
    let history = b.history("repeat", 10).await?;
    ensure!(
        history.len() == 1 && history[0].instance == "a",
        "repeated claims left {} history records: {history:?}",
        history.len()
    );
    a.finish("repeat", T0, "token-a", FinalStatus::Succeeded)
        .await?;
    let after = b.claim(&theirs).await?;
    ensure!(
        !after.won && after.outcome == ClaimOutcome::Done,
        "a finished slot was claimable again: {after:?}"
    );
    Ok(())
}

/// Runs from several instances, and a manual run, come back newest first
/// with instance, status, message, duration; `limit` is honoured.
pub async fn history_newest_first(env: &SchedulerEnv) -> CheckResult {
    let (clock, [a, b, c, reader]) = instances(env, "sched_history").await?;
    let job = "history";
    must_claim(&*a, &req(job, T0, "ta", "a")).await?;
    clock.advance(Duration::from_millis(1_500));
    a.finish(job, T0, "ta", FinalStatus::Succeeded).await?;
    must_claim(&*b, &req(job, T0 + 2_000, "tb", "b")).await?;
    b.finish(job, T0 + 2_000, "tb", FinalStatus::Failed("boom".into()))
        .await?;
    must_claim(&*c, &req(job, T0 + 3_000, "tc", "c")).await?;
    a.record_manual(&ManualRun::new(job, T0 + 2_500, "tm", "a"))
        .await?;
    clock.advance(Duration::from_millis(200));
    a.finish(job, T0 + 2_500, "tm", FinalStatus::Succeeded)
        .await?;

    let history = reader.history(job, 10).await?;
    let got: Vec<(u64, &str, RunStatus, bool)> = history
        .iter()
        .map(|r| (r.slot, r.instance.as_str(), r.status, r.manual))
        .collect();
    let want = vec![
        (T0 + 3_000, "c", RunStatus::Running, false),
        (T0 + 2_500, "a", RunStatus::Succeeded, true),
        (T0 + 2_000, "b", RunStatus::Failed, false),
        (T0, "a", RunStatus::Succeeded, false),
    ];
    ensure!(got == want, "history is {got:?}, expected {want:?}");
    ensure!(
        history[2].message.as_deref() == Some("boom"),
        "the failure message was lost: {:?}",
        history[2]
    );
    ensure!(
        history[3].duration_ms == Some(1_500) && history[1].duration_ms == Some(200),
        "durations are {:?} / {:?}, expected 1500 / 200",
        history[3].duration_ms,
        history[1].duration_ms
    );
    ensure!(
        history[0].duration_ms.is_none(),
        "a running run has a duration"
    );
    let limited = reader.history(job, 2).await?;
    ensure!(
        limited.iter().map(|r| r.slot).collect::<Vec<_>>() == vec![T0 + 3_000, T0 + 2_500],
        "history(limit 2) is {limited:?}"
    );
    Ok(())
}

/// A heartbeat extends the owner's lease (so a backup cannot take over when
/// the first lease would have expired); anyone else's heartbeat is refused.
pub async fn heartbeat_ownership(env: &SchedulerEnv) -> CheckResult {
    let (clock, [a, b]) = instances(env, "sched_heartbeat").await?;
    let job = "heartbeat";
    must_claim(&*a, &req(job, T0, "ta", "a")).await?;
    clock.advance(Duration::from_secs(5));
    let lease = a.heartbeat(job, T0, "ta", TTL).await?;
    ensure!(
        lease.lease_until_ms == T0 + 15_000,
        "heartbeat set the lease to {} (expected now + ttl = {})",
        lease.lease_until_ms,
        T0 + 15_000
    );
    let stranger = b.heartbeat(job, T0, "tb", TTL).await;
    ensure!(
        matches!(stranger, Err(coord_scheduler::RunError::NotOwner { .. })),
        "a heartbeat with another token was not refused: {stranger:?}"
    );
    let nowhere = a.heartbeat(job, T0 + 1_000, "ta", TTL).await;
    ensure!(
        matches!(nowhere, Err(coord_scheduler::RunError::NotOwner { .. })),
        "a heartbeat on an unclaimed slot was not refused: {nowhere:?}"
    );
    let active = b.active(job).await?;
    ensure!(
        active.len() == 1
            && active[0].instance == "a"
            && active[0].live
            && active[0].lease_until_ms == T0 + 15_000,
        "active() is {active:?}"
    );
    // Past the first lease, inside the extended one: still a's.
    clock.advance(Duration::from_secs(7));
    let claim = b.claim(&req(job, T0, "tb", "b")).await?;
    ensure!(
        !claim.won && claim.outcome == ClaimOutcome::Running,
        "the heartbeat did not extend the lease: {claim:?}"
    );
    Ok(())
}

/// A live lease is never taken over; an expired unfinished one is, once,
/// with the takeover counted; the old holder then cannot heartbeat, finish
/// or release.
pub async fn takeover_after_expiry(env: &SchedulerEnv) -> CheckResult {
    let (clock, [a, b, c]) = instances(env, "sched_takeover").await?;
    let job = "takeover";
    must_claim(&*a, &req(job, T0, "ta", "a")).await?;
    clock.advance(Duration::from_secs(9));
    let early = b.claim(&req(job, T0, "tb", "b")).await?;
    ensure!(!early.won, "a live lease was taken over: {early:?}");
    clock.advance(Duration::from_secs(2));
    let active = c.active(job).await?;
    ensure!(
        active.len() == 1 && !active[0].live,
        "active() does not show the expired lease: {active:?}"
    );
    let (rb, rc) = (req(job, T0, "tb", "b"), req(job, T0, "tc", "c"));
    let (tb, tc) = tokio::join!(b.claim(&rb), c.claim(&rc));
    let (tb, tc) = (tb?, tc?);
    ensure!(
        tb.won != tc.won,
        "{} backups took over one expired slot: {tb:?} {tc:?}",
        if tb.won { 2 } else { 0 }
    );
    let (winner, winner_token, winner_name, taken) = if tb.won {
        (&b, "tb", "b", tb)
    } else {
        (&c, "tc", "c", tc)
    };
    ensure!(
        taken.outcome == ClaimOutcome::TakenOver && taken.takeovers == 1,
        "the takeover is not recorded as one: {taken:?}"
    );
    refused_to_old_holder(&*a, job, T0, "ta", "after a takeover").await?;
    winner
        .finish(job, T0, winner_token, FinalStatus::Succeeded)
        .await?;
    let history = a.history(job, 10).await?;
    ensure!(
        history.len() == 1
            && history[0].instance == winner_name
            && history[0].takeovers == 1
            && history[0].status == RunStatus::Succeeded,
        "history after a takeover is {history:?}"
    );
    let late = a.claim(&req(job, T0, "ta2", "a")).await?;
    ensure!(
        !late.won && late.outcome == ClaimOutcome::Done,
        "a done slot was claimable: {late:?}"
    );
    Ok(())
}

/// A live run of one slot blocks another slot of the same job unless the
/// claim allows overlap; finished and expired runs block nothing.
pub async fn overlap_protection(env: &SchedulerEnv) -> CheckResult {
    let (clock, [a, b]) = instances(env, "sched_overlap").await?;
    let job = "overlap";
    let (s1, s2, s3, s4) = (T0, T0 + 1_000, T0 + 2_000, T0 + 3_000);
    must_claim(&*a, &req(job, s1, "t1", "a")).await?;
    let blocked = b.claim(&req(job, s2, "t2", "b")).await?;
    ensure!(
        !blocked.won && blocked.outcome == (ClaimOutcome::Overlap { running_slot: s1 }),
        "slot 2 was not blocked by running slot 1: {blocked:?}"
    );
    let allowed = b
        .claim(&req(job, s3, "t3", "b").with_allow_overlap(true))
        .await?;
    ensure!(
        allowed.won,
        "a claim allowing overlap was blocked: {allowed:?}"
    );
    a.finish(job, s1, "t1", FinalStatus::Succeeded).await?;
    let still = b.claim(&req(job, s2, "t2", "b")).await?;
    ensure!(
        !still.won && still.outcome == (ClaimOutcome::Overlap { running_slot: s3 }),
        "slot 2 was not blocked by running slot 3: {still:?}"
    );
    b.finish(job, s3, "t3", FinalStatus::Succeeded).await?;
    let free = b.claim(&req(job, s2, "t2", "b")).await?;
    ensure!(
        free.won,
        "slot 2 stayed blocked after every other run finished: {free:?}"
    );
    clock.advance(TTL + Duration::from_secs(1));
    let after_expiry = a.claim(&req(job, s4, "t4", "a")).await?;
    ensure!(
        after_expiry.won,
        "an expired run still blocks other slots: {after_expiry:?}"
    );
    Ok(())
}

/// Finish and release act only with the owning token (and are idempotent
/// for it); a release lets a backup take over at once.
pub async fn finish_release_by_token(env: &SchedulerEnv) -> CheckResult {
    let (_, [a, b]) = instances(env, "sched_token").await?;
    let job = "token";
    must_claim(&*a, &req(job, T0, "ta", "a")).await?;
    for (what, result) in [
        (
            "finish",
            b.finish(job, T0, "tb", FinalStatus::Succeeded).await,
        ),
        ("release", b.release(job, T0, "tb").await),
        (
            "finish of an unclaimed slot",
            b.finish(job, T0 + 1, "ta", FinalStatus::Succeeded).await,
        ),
    ] {
        ensure!(
            matches!(result, Err(coord_scheduler::RunError::NotOwner { .. })),
            "{what} with a token that does not own the run was not refused: {result:?}"
        );
    }
    let history = b.history(job, 10).await?;
    ensure!(
        history.len() == 1 && history[0].status == RunStatus::Running && history[0].instance == "a",
        "a refused finish/release changed the record: {history:?}"
    );
    let held = b.claim(&req(job, T0, "tb", "b")).await?;
    ensure!(!held.won, "a refused release freed the slot: {held:?}");
    a.release(job, T0, "ta").await?;
    a.release(job, T0, "ta").await?; // a retried release is fine
    ensure!(
        b.history(job, 1).await?[0].status == RunStatus::Released,
        "a release is not visible in history"
    );
    let finish_after_release = a.finish(job, T0, "ta", FinalStatus::Succeeded).await;
    ensure!(
        matches!(
            finish_after_release,
            Err(coord_scheduler::RunError::NotOwner { .. })
        ),
        "a released run could still be finished: {finish_after_release:?}"
    );
    let backup = b.claim(&req(job, T0, "tb", "b")).await?;
    ensure!(
        backup.won && backup.outcome == ClaimOutcome::TakenOver && backup.takeovers == 1,
        "a released slot was not taken over at once: {backup:?}"
    );
    b.finish(job, T0, "tb", FinalStatus::TimedOut).await?;
    b.finish(job, T0, "tb", FinalStatus::TimedOut).await?; // a retried finish is fine
    let history = a.history(job, 10).await?;
    ensure!(
        history.len() == 1
            && history[0].status == RunStatus::TimedOut
            && history[0].instance == "b"
            && history[0].takeovers == 1,
        "history after release + takeover is {history:?}"
    );
    ensure!(
        b.active(job).await?.is_empty(),
        "a finished run is still active"
    );
    Ok(())
}

/// A skipped slot is recorded by exactly one of several instances, never
/// over a claimed slot, and does not stop an on-time instance from claiming it.
pub async fn skip_recorded_once(env: &SchedulerEnv) -> CheckResult {
    let (_, [a, b]) = instances(env, "sched_skip").await?;
    let job = "skip";
    let (ra, rb) = tokio::join!(
        a.record_skip(job, T0, "a", SkipReason::Late),
        b.record_skip(job, T0, "b", SkipReason::Late)
    );
    ensure!(ra? ^ rb?, "a skipped slot was not recorded exactly once");
    let history = a.history(job, 10).await?;
    ensure!(
        history.len() == 1 && history[0].status == RunStatus::Skipped(SkipReason::Late),
        "history of a skipped slot is {history:?}"
    );
    let on_time = b.claim(&req(job, T0, "tb", "b")).await?;
    ensure!(
        on_time.won,
        "a skip record blocked an on-time claim: {on_time:?}"
    );
    ensure!(
        !a.record_skip(job, T0, "a", SkipReason::Late).await?,
        "a claimed slot was recorded as skipped"
    );
    let history = a.history(job, 10).await?;
    ensure!(
        history.len() == 1 && history[0].status == RunStatus::Running && history[0].instance == "b",
        "history after claiming a skipped slot is {history:?}"
    );
    Ok(())
}

/// Manual runs are never deduplicated: two at the same instant are both
/// recorded, and each is finished only with its own token.
pub async fn manual_runs_not_deduplicated(env: &SchedulerEnv) -> CheckResult {
    let (_, [a, b]) = instances(env, "sched_manual").await?;
    let job = "manual";
    a.record_manual(&ManualRun::new(job, T0, "m1", "a")).await?;
    b.record_manual(&ManualRun::new(job, T0, "m2", "b")).await?;
    let wrong = a.finish(job, T0, "m3", FinalStatus::Succeeded).await;
    ensure!(
        matches!(wrong, Err(coord_scheduler::RunError::NotOwner { .. })),
        "a manual run was finished with a foreign token: {wrong:?}"
    );
    a.finish(job, T0, "m1", FinalStatus::Succeeded).await?;
    b.finish(job, T0, "m2", FinalStatus::Failed("no".into()))
        .await?;
    let history = a.history(job, 10).await?;
    let mut got: Vec<(&str, RunStatus, bool)> = history
        .iter()
        .map(|r| (r.instance.as_str(), r.status, r.manual))
        .collect();
    got.sort_by_key(|(i, _, _)| *i);
    ensure!(
        got == vec![
            ("a", RunStatus::Succeeded, true),
            ("b", RunStatus::Failed, true)
        ],
        "manual runs in history: {got:?}"
    );
    // A scheduled claim of the same instant is unaffected by manual runs.
    ensure!(
        a.claim(&req(job, T0, "s1", "a")).await?.won,
        "a manual run blocked the scheduled slot"
    );
    Ok(())
}

/// A store configured to forget claims declares it, and a scheduler over
/// it refuses coordinated jobs whose jitter + max lateness (or lease) is
/// not below that window; local jobs and stores that never forget are fine.
pub async fn dedupe_window_refusal(env: &SchedulerEnv) -> CheckResult {
    let ns = unique_namespace("sched_dedupe");
    let clock = clock_at(T0);
    let window = Duration::from_secs(10);
    let forgetful = env
        .store(
            &ns,
            clock.clone(),
            RunStoreOptions::default().with_forget_claims_after(Some(window)),
        )
        .await?;
    ensure!(
        forgetful.dedupe_window() == Some(window),
        "the store forgets claims after {window:?} but declares {:?}",
        forgetful.dedupe_window()
    );
    let forever = env
        .store(&ns, clock.clone(), RunStoreOptions::default())
        .await?;
    ensure!(
        forever.dedupe_window().is_none(),
        "a store that never forgets declares {:?}",
        forever.dedupe_window()
    );
    let job = |name: &str, jitter: u64, max_late: u64, hint: LockingHint| {
        Job::new(
            name,
            Schedule::parse("every 1s", None).expect("valid schedule"),
            handler(|_| async { Ok(()) }),
        )
        .with_options(
            JobOptions::default()
                .with_hint(hint)
                .with_lease_ttl(Duration::from_secs(5))
                .with_jitter(Duration::from_secs(jitter))
                .with_max_late(Duration::from_secs(max_late)),
        )
    };
    let scheduler = Scheduler::new(
        Some(forgetful),
        clock.clone(),
        SchedulerOptions::instance("a"),
    );
    for (jitter, max_late) in [(2, 8), (0, 10), (11, 0)] {
        let refused = scheduler.add_job(job(
            "too_late",
            jitter,
            max_late,
            LockingHint::RequireGlobal,
        ));
        ensure!(
            matches!(refused, Err(coord_scheduler::Error::DedupeWindowTooShort { .. })),
            "jitter {jitter}s + max_late {max_late}s with a {window:?} window was not refused: {refused:?}"
        );
    }
    scheduler
        .add_job(job("fits", 2, 7, LockingHint::RequireGlobal))
        .map_err(|e| {
            Failure::new(format!(
                "jitter 2s + max_late 7s under a 10s window was refused: {e}"
            ))
        })?;
    scheduler
        .add_job(job("local", 0, 3_600, LockingHint::NodeLocal))
        .map_err(|e| Failure::new(format!("a NodeLocal job was refused: {e}")))?;
    let patient = Scheduler::new(Some(forever), clock, SchedulerOptions::instance("b"));
    patient
        .add_job(job("patient", 60, 86_400, LockingHint::RequireGlobal))
        .map_err(|e| Failure::new(format!("a store that never forgets refused a job: {e}")))?;
    Ok(())
}

/// Two clients of a fresh namespace named after `prefix` whose run stores
/// forget claims after a minute, sharing one clock at [`T0`].
async fn forgetful_pair(
    env: &SchedulerEnv,
    prefix: &str,
) -> Result<(Arc<ManualClock>, Arc<dyn SlotStore>, Arc<dyn SlotStore>), Failure> {
    let ns = unique_namespace(prefix);
    let clock = clock_at(T0);
    let options =
        RunStoreOptions::default().with_forget_claims_after(Some(Duration::from_secs(60)));
    let a = env.store(&ns, clock.clone(), options.clone()).await?;
    let b = env.store(&ns, clock.clone(), options).await?;
    Ok((clock, a, b))
}

/// A store that forgets claims keeps a floor below which slots are never
/// claimable again; a slot that was still running when a later slot was
/// forgotten sits below that floor. Its owner retrying its claim (same
/// token) still owns it, a backup takes it over once its lease expired, the
/// finished run leaves `active()`, and the forgotten slot stays refused.
pub async fn running_slot_below_the_floor(env: &SchedulerEnv) -> CheckResult {
    let (clock, a, b) = forgetful_pair(env, "sched_floor").await?;
    let job = "floor";
    let (old, forgotten) = (T0, T0 + 1_000);
    let overlapping = |slot, token: &str, instance: &str| {
        req(job, slot, token, instance).with_allow_overlap(true)
    };
    must_claim(&*a, &overlapping(old, "ta", "a")).await?;
    must_claim(&*a, &overlapping(forgotten, "tf", "a")).await?;
    a.finish(job, forgotten, "tf", FinalStatus::Succeeded)
        .await?;
    // Keep the old slot's run alive past the window, then forget the later one.
    for _ in 0..7 {
        clock.advance(Duration::from_secs(9));
        a.heartbeat(job, old, "ta", TTL).await?;
    }
    let pruned = a.prune(job).await?;
    ensure!(
        pruned == 1,
        "prune forgot {pruned} claims, not the one finished slot"
    );
    let refused = b.claim(&overlapping(forgotten, "tb0", "b")).await?;
    ensure!(
        !refused.won && refused.outcome == ClaimOutcome::Done,
        "a forgotten slot was claimable again: {refused:?}"
    );
    let retried = a.claim(&overlapping(old, "ta", "a")).await?;
    ensure!(
        retried.won && retried.outcome == ClaimOutcome::Won,
        "the owner of a running slot below the floor retried its claim and lost it: {retried:?}"
    );
    let early = b.claim(&overlapping(old, "tb", "b")).await?;
    ensure!(
        !early.won && early.outcome == ClaimOutcome::Running,
        "a live run below the floor was not reported running: {early:?}"
    );
    clock.advance(TTL + Duration::from_secs(1));
    let taken = b.claim(&overlapping(old, "tb", "b")).await?;
    ensure!(
        taken.won && taken.outcome == ClaimOutcome::TakenOver,
        "an expired run below the floor could not be taken over: {taken:?}"
    );
    b.finish(job, old, "tb", FinalStatus::Succeeded).await?;
    let active = a.active(job).await?;
    ensure!(
        active.is_empty(),
        "a finished run below the floor is still active: {active:?}"
    );
    Ok(())
}

/// A run whose holder died (its lease ended and nobody took it over) is
/// forgotten once its lease ended longer than the window ago, like a finished
/// run: `prune` removes it, it leaves `active()`, history no longer shows it
/// running, and the slot is refused for good, to its late owner (heartbeat,
/// finish, a retried claim) as to anyone. A live run, and an expired one
/// whose lease ended inside the window, stay.
pub async fn abandoned_run_forgotten(env: &SchedulerEnv) -> CheckResult {
    let (clock, a, b) = forgetful_pair(env, "sched_abandoned").await?;
    let job = "abandoned";
    let (dead, live, recent) = (T0, T0 + 1_000, T0 + 2_000);
    let overlapping = |slot, token: &str, instance: &str| {
        req(job, slot, token, instance).with_allow_overlap(true)
    };
    // `dead` is claimed and never heard of again; `live` heartbeats all
    // along; `recent` is claimed later and left to expire inside the window.
    must_claim(&*a, &overlapping(dead, "td", "a")).await?;
    must_claim(&*a, &overlapping(live, "tl", "a")).await?;
    for step in 0..8 {
        clock.advance(Duration::from_secs(9));
        a.heartbeat(job, live, "tl", TTL).await?;
        if step == 1 {
            must_claim(&*b, &overlapping(recent, "tr", "b")).await?;
        }
    }
    // Now T0 + 72 s: dead's lease ended at T0 + 10 s (before the horizon,
    // T0 + 12 s), recent's at T0 + 28 s (after it), live's is live.
    let pruned = b.prune(job).await?;
    ensure!(
        pruned == 1,
        "prune forgot {pruned} claims, not the one run abandoned longer than the window ago"
    );
    let mut active: Vec<u64> = a.active(job).await?.iter().map(|r| r.slot).collect();
    active.sort_unstable();
    ensure!(
        active == [live, recent],
        "active runs after forgetting the abandoned one: {active:?} (expected the live and the recent one)"
    );
    let history = b.history(job, 10).await?;
    let shown = history.iter().find(|r| r.slot == dead && !r.manual);
    ensure!(
        shown.is_none_or(|r| r.status != RunStatus::Running),
        "history still shows the forgotten run running: {shown:?}"
    );
    refused_to_old_holder(&*a, job, dead, "td", "after its run was forgotten").await?;
    for (who, token) in [(&a, "td"), (&b, "tb")] {
        let claim = who.claim(&overlapping(dead, token, "x")).await?;
        ensure!(
            !claim.won && claim.outcome == ClaimOutcome::Done,
            "a forgotten run was claimable again: {claim:?}"
        );
    }
    a.heartbeat(job, live, "tl", TTL).await?;
    a.finish(job, live, "tl", FinalStatus::Succeeded).await?;
    let taken = a.claim(&overlapping(recent, "ta", "a")).await?;
    ensure!(
        taken.won && taken.outcome == ClaimOutcome::TakenOver,
        "a run expired inside the window could not be taken over: {taken:?}"
    );
    Ok(())
}

/// `record_attempt` by `store` is refused as `NotOwner`, or the check fails.
async fn attempt_refused(
    store: &dyn SlotStore,
    job: &str,
    token: &str,
    attempt: u32,
    when: &str,
) -> CheckResult {
    let result = store
        .record_attempt(job, T0, token, attempt, "late failure")
        .await;
    ensure!(
        matches!(result, Err(coord_scheduler::RunError::NotOwner { .. })),
        "attempt {attempt} recorded by token {token:?} {when}: {result:?}"
    );
    Ok(())
}

/// A run counts its attempts, and only its owner moves the count, only
/// forward: the claim starts attempt 1; the owner records attempt 2 (asking
/// again for it is answered without counting it twice, a gap is refused);
/// another token is refused; a takeover starts attempt 3 and the old
/// holder's next attempt is refused; a takeover with `max_attempts = 3`
/// finishes the run failed (history: failed, 3 attempts) instead of starting
/// a fourth, and the stopped holder can no longer finish it.
pub async fn attempts_by_token(env: &SchedulerEnv) -> CheckResult {
    let (clock, [a, b]) = instances::<2>(env, "sched_attempts").await?;
    let job = "attempts";
    let first = a.claim(&req(job, T0, "ta", "a")).await?;
    ensure!(
        first.won && first.attempts == 1,
        "a first claim did not start attempt 1: {first:?}"
    );
    attempt_refused(&*b, job, "tb", 2, "by a token that never owned the run").await?;
    a.record_attempt(job, T0, "ta", 2, "boom").await?;
    a.record_attempt(job, T0, "ta", 2, "boom")
        .await
        .map_err(|e| Failure::new(format!("the same attempt asked again was refused: {e}")))?;
    let gap = a.record_attempt(job, T0, "ta", 4, "boom").await;
    ensure!(
        matches!(gap, Err(coord_scheduler::RunError::InvalidArgument(_))),
        "attempt 4 was recorded after attempt 2: {gap:?}"
    );
    let shown = b.history(job, 10).await?;
    ensure!(
        shown.first().is_some_and(|r| r.attempts == 2
            && r.status == RunStatus::Running
            && r.message.as_deref() == Some("boom")),
        "history after attempt 2 (expected running, 2 attempts, the failure): {shown:?}"
    );
    clock.advance(TTL + Duration::from_secs(1));
    let taken = b.claim(&req(job, T0, "tb", "b")).await?;
    ensure!(
        taken.won && taken.outcome == ClaimOutcome::TakenOver && taken.attempts == 3,
        "a takeover after attempt 2 did not start attempt 3: {taken:?}"
    );
    attempt_refused(&*a, job, "ta", 3, "after the slot was taken over").await?;
    clock.advance(TTL + Duration::from_secs(1));
    let capped = req(job, T0, "tc", "c").with_max_attempts(Some(3));
    let refused = a.claim(&capped).await?;
    ensure!(
        !refused.won && refused.outcome == ClaimOutcome::Done && refused.attempts == 3,
        "a takeover past max_attempts was not refused as done: {refused:?}"
    );
    let shown = a.history(job, 10).await?;
    ensure!(
        shown
            .first()
            .is_some_and(|r| r.attempts == 3 && r.status == RunStatus::Failed),
        "history of a run whose attempts ran out (expected failed, 3 attempts): {shown:?}"
    );
    let late = b.finish(job, T0, "tb", FinalStatus::Succeeded).await;
    ensure!(
        matches!(late, Err(coord_scheduler::RunError::NotOwner { .. })),
        "the stopped holder finished a run whose attempts ran out: {late:?}"
    );
    attempt_refused(&*b, job, "tb", 4, "after the run's attempts ran out").await?;
    Ok(())
}

crate::__define_suite! {$
    /// The scheduler suite's one list of cases (see [`crate::__define_suite!`]).
    __scheduler_suite "scheduler" |factory, check, name| async move { check(&SchedulerEnv::new(factory)).await };
    /// Every case of the scheduler suite, over the real [`RunStore`].
    cases;
    /// Expand the scheduler suite into one `#[tokio::test]` per case for a
    /// [`BackendFactory`] expression (evaluated once per test).
    scheduler_tests(scheduler);
    claim_race => |factory| async move {
        claim_race(&SchedulerEnv::new(factory), 8, 10).await
    },
    repeat_safety,
    history_newest_first,
    heartbeat_ownership,
    takeover_after_expiry,
    overlap_protection,
    finish_release_by_token,
    skip_recorded_once,
    manual_runs_not_deduplicated,
    dedupe_window_refusal,
    running_slot_below_the_floor,
    abandoned_run_forgotten,
    attempts_by_token,
}
