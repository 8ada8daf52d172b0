//! The recipes beside the locks: a semaphore of [`PERMITS`] permits, a
//! read-write lock and a leader election, each fought over by three
//! instances; what they were granted, and the invariants it must keep.
//!
//! Each actor loops: wait for a grant (its waiting call is sometimes cut
//! short by dropping it, as a cancelled task would: a waiter that dies
//! in line), then act in a few steps while the grant is surely held by its
//! local monotonic clock (request time plus TTL, moved on by each
//! successful renewal), then release it, or walk away and let it expire.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::election::{Election, ElectionError, ElectionOptions, GenericElection};
use coord_adapters::lock::{
    FairLock, FairLockOptions, GenericLock, GenericSemaphore, Lock, LockError, LockOptions,
    Semaphore, SemaphoreOptions, WaitOptions,
};
use coord_adapters::rwlock::{GenericRwLock, RwLock, RwLockOptions, RwMode};
use coord_backend::{Backend, Clock};
use rand::Rng;
use tokio::time::Instant;

use super::actors::{maybe_dropped, Actor};
use super::{count, facts, kind, read_counter, read_record, said, Facts, Shared, LOCK_TTL};

/// How many permits the simulated semaphore grants at once.
pub(super) const PERMITS: u32 = 2;
const SEMAPHORE: &str = "S";
const RWLOCK: &str = "RW";
const ELECTION: &str = "E";

/// What a recipe granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Held {
    /// A permit of the semaphore.
    Permit,
    /// The read-write lock, shared.
    Read,
    /// The read-write lock, exclusive.
    Write,
    /// Leadership of the election (its fence is the term).
    Leader,
}

impl Held {
    /// The recipe that grants it.
    fn recipe(self) -> &'static str {
        match self {
            Held::Permit => "semaphore",
            Held::Read | Held::Write => "rwlock",
            Held::Leader => "election",
        }
    }
}

/// The recipes: name, record key, the record's counter of grants.
const COUNTERS: [(&str, &str, &str); 3] = [
    ("semaphore", "sem/S", "fence"),
    ("rwlock", "rwlock/RW", "fence"),
    ("election", "election/E", "term"),
];

/// One grant a recipe actor was told of.
#[derive(Debug)]
pub(super) struct Holding {
    pub(super) what: Held,
    pub(super) who: String,
    /// The fence (the term, for a leader).
    pub(super) fence: u64,
    /// Event numbers: when the grant was answered, and the last moment its
    /// holder acted on it (`None`: it never did).
    pub(super) granted: u64,
    pub(super) last_valid: Option<u64>,
}

/// Record a grant; its index in the facts.
fn granted(shared: &Shared, what: Held, who: &str, fence: u64) -> usize {
    let mut f = facts(shared);
    f.clock += 1;
    let granted = f.clock;
    f.holdings.push(Holding {
        what,
        who: who.to_owned(),
        fence,
        granted,
        last_valid: None,
    });
    f.holdings.len() - 1
}

/// Hold the grant `index` for one to four steps of 100–1500 ms, acting
/// (recording the moment) only while it is surely held: until
/// `requested + ttl`, moved on by each renewal (from the moment it was
/// sent) that answers `Ok(true)`. Calls `renew` before a step now and then
/// (`Ok(false)`: it succeeded without extending the lease).
async fn hold<F, Fut>(actor: &mut Actor, index: usize, requested: Instant, mut renew: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, String>>,
{
    let mut valid_until = requested + LOCK_TTL;
    let who = actor.inst.name.clone();
    for _ in 0..actor.rng.random_range(1..5) {
        tokio::time::sleep(Duration::from_millis(actor.rng.random_range(100..1500))).await;
        actor.inst.wait_running().await;
        if actor.rng.random_bool(0.4) {
            let sent = Instant::now();
            match renew().await {
                Ok(true) => valid_until = sent + LOCK_TTL,
                Ok(false) => {}
                Err(e) => actor.log.event(&who, format!("renew: {}", kind(&e))),
            }
            actor.inst.wait_running().await;
        }
        if Instant::now() >= valid_until {
            actor.log.event(&who, "grant no longer surely held");
            return;
        }
        let mut f = facts(&actor.shared);
        f.clock += 1;
        f.holdings[index].last_valid = Some(f.clock);
    }
}

/// Wait for a grant of `recipe` through `call`, cut short now and then by
/// dropping it (a waiter cancelled or dying in line). `None`: no grant
/// (logged; counted as an unknown outcome when the call was dropped
/// while a store call was under way or held back or after one was answered
/// in doubt, or its error is `maybe_granted`).
async fn wait_for_grant<T, E: std::fmt::Display>(
    actor: &mut Actor,
    (recipe, what): (&'static str, &str),
    call: impl Future<Output = Result<T, E>>,
    maybe_granted: impl Fn(&E) -> bool,
) -> Option<T> {
    let who = actor.inst.name.clone();
    let unknown = |actor: &Actor| {
        *facts(&actor.shared)
            .recipe_unknowns
            .entry(recipe)
            .or_insert(0) += 1;
    };
    let in_doubt = actor.inst.faulty.answered_in_doubt();
    let Some(answer) = maybe_dropped(&mut actor.rng, 0.2, call).await else {
        // A wait dropped between calls changed nothing unknown, unless one
        // of its calls was answered in doubt: the engine may have been
        // backing off before the resend that would have settled it.
        if actor.inst.faulty.drop_leaves_doubt(in_doubt) {
            unknown(actor);
        }
        actor
            .log
            .event(&who, format!("{what}: dropped while waiting"));
        return None;
    };
    match answer {
        Ok(grant) => Some(grant),
        Err(e) => {
            if maybe_granted(&e) {
                unknown(actor);
            }
            actor
                .log
                .event(&who, format!("{what}: {}", kind(&e.to_string())));
            None
        }
    }
}

/// Whether a lock error leaves the grant's outcome unknown.
fn lock_maybe_granted(error: &LockError) -> bool {
    matches!(error, LockError::Store(e) if e.is_indeterminate())
}

/// Whether to give a grant back (else it is left to expire).
fn gives_back(actor: &mut Actor) -> bool {
    actor.rng.random_bool(0.8)
}

async fn pause_between(actor: &mut Actor) {
    tokio::time::sleep(Duration::from_millis(actor.rng.random_range(50..400))).await;
}

pub(super) async fn semaphore_actor(mut actor: Actor) {
    let inst = actor.inst.clone();
    let semaphore = GenericSemaphore::with_options(
        inst.backend(),
        SemaphoreOptions::default().with_clock(inst.clock.clone()),
    );
    let who = inst.name.as_str();
    while Instant::now() < actor.end {
        inst.wait_running().await;
        let wait = WaitOptions::with_timeout(Duration::from_secs(4));
        let acquire = semaphore.acquire(SEMAPHORE, PERMITS, LOCK_TTL, &wait);
        let asked = ("semaphore", "acquire");
        let Some(permit) = wait_for_grant(&mut actor, asked, acquire, lock_maybe_granted).await
        else {
            pause_between(&mut actor).await;
            continue;
        };
        let fence = permit.fence();
        let index = granted(&actor.shared, Held::Permit, who, fence);
        count(&actor.shared, "permits granted");
        actor.log.event(who, format!("permit fence {fence}"));
        let renew = || async {
            let renewed = semaphore.renew(&permit).await;
            renewed.map(|()| true).map_err(|e| e.to_string())
        };
        hold(&mut actor, index, permit.requested_instant(), renew).await;
        if gives_back(&mut actor) {
            let released = semaphore.release(permit).await;
            actor
                .log
                .event(who, format!("release permit {fence}: {}", said(released)));
        }
        pause_between(&mut actor).await;
    }
}

pub(super) async fn rwlock_actor(mut actor: Actor) {
    let inst = actor.inst.clone();
    let rwlock = GenericRwLock::with_options(
        inst.backend(),
        RwLockOptions::default().with_clock(inst.clock.clone()),
    );
    let who = inst.name.as_str();
    let timeout = Duration::from_secs(4);
    while Instant::now() < actor.end {
        inst.wait_running().await;
        let (mode, held) = if actor.rng.random_bool(0.4) {
            (RwMode::Write, Held::Write)
        } else {
            (RwMode::Read, Held::Read)
        };
        let call = async {
            match mode {
                RwMode::Write => rwlock.write(RWLOCK, LOCK_TTL, timeout).await,
                _ => rwlock.read(RWLOCK, LOCK_TTL, timeout).await,
            }
        };
        let asked = ("rwlock", mode.label());
        let Some(handle) = wait_for_grant(&mut actor, asked, call, lock_maybe_granted).await else {
            pause_between(&mut actor).await;
            continue;
        };
        let fence = handle.fence();
        let index = granted(&actor.shared, held, who, fence);
        count(&actor.shared, "rwlock grants");
        actor
            .log
            .event(who, format!("{} granted fence {fence}", mode.label()));
        let renew = || async {
            let renewed = rwlock.renew(&handle).await;
            renewed.map(|()| true).map_err(|e| e.to_string())
        };
        hold(&mut actor, index, handle.lease().requested_instant(), renew).await;
        if gives_back(&mut actor) {
            let released = rwlock.release(handle).await;
            actor.log.event(
                who,
                format!("release {} {fence}: {}", mode.label(), said(released)),
            );
        }
        pause_between(&mut actor).await;
    }
}

pub(super) async fn election_actor(mut actor: Actor) {
    let inst = actor.inst.clone();
    let election = GenericElection::with_options(
        inst.backend(),
        ElectionOptions::default().with_clock(inst.clock.clone()),
    );
    let who = inst.name.as_str();
    while Instant::now() < actor.end {
        inst.wait_running().await;
        let campaign = election.campaign(ELECTION, who, "v0", LOCK_TTL, Duration::from_secs(4));
        let maybe_won =
            |e: &ElectionError| matches!(e, ElectionError::Store(e) if e.is_indeterminate());
        let asked = ("election", "campaign");
        let Some(leadership) = wait_for_grant(&mut actor, asked, campaign, maybe_won).await else {
            pause_between(&mut actor).await;
            continue;
        };
        let term = leadership.term();
        let index = granted(&actor.shared, Held::Leader, who, term);
        count(&actor.shared, "leaderships won");
        actor.log.event(who, format!("leads, term {term}"));
        // Between steps a leader renews, or proclaims a new value (which
        // needs a live lease and does not extend it), alternately.
        let mut proclaims = 0u32;
        let renew = || {
            proclaims += 1;
            let (election, leadership) = (&election, &leadership);
            let value = format!("v{proclaims}");
            async move {
                let extended = proclaims % 2 == 1;
                let answer = if extended {
                    election.renew(leadership).await
                } else {
                    election.proclaim(leadership, &value).await
                };
                answer.map(|()| extended).map_err(|e| e.to_string())
            }
        };
        hold(&mut actor, index, leadership.requested_instant(), renew).await;
        if gives_back(&mut actor) {
            let resigned = election.resign(leadership).await;
            actor
                .log
                .event(who, format!("resign term {term}: {}", said(resigned)));
        }
        pause_between(&mut actor).await;
    }
}

/// The recipes' invariants over the facts: fences (terms) unique per
/// recipe; at any moment at most [`PERMITS`] permits acted on, a writer
/// alone, one leader.
pub(super) fn check_holdings(holdings: &[Holding], violations: &mut Vec<String>) {
    let mut fences = BTreeSet::new();
    for h in holdings {
        if !fences.insert((h.what.recipe(), h.fence)) {
            violations.push(format!(
                "{}: fence {} granted twice",
                h.what.recipe(),
                h.fence
            ));
        }
    }
    // Every pair of grants acted on at overlapping moments.
    let acted: Vec<(&Holding, u64)> = holdings
        .iter()
        .filter_map(|h| h.last_valid.map(|last| (h, last)))
        .collect();
    let overlap = |(a, a_last): &(&Holding, u64), (b, b_last): &(&Holding, u64)| {
        a.granted < *b_last && b.granted < *a_last
    };
    for (i, a) in acted.iter().enumerate() {
        for b in &acted[i + 1..] {
            let clash = matches!(
                (a.0.what, b.0.what),
                (Held::Write, Held::Read | Held::Write)
                    | (Held::Read, Held::Write)
                    | (Held::Leader, Held::Leader)
            );
            if clash && overlap(a, b) {
                violations.push(format!(
                    "{:?} {} (fence {}, events {}..{}) and {:?} {} (fence {}, events {}..{}) held at once",
                    a.0.what, a.0.who, a.0.fence, a.0.granted, a.1,
                    b.0.what, b.0.who, b.0.fence, b.0.granted, b.1
                ));
            }
        }
    }
    // Permits: sweep the acted-on intervals in event order.
    let mut edges: Vec<(u64, i32)> = acted
        .iter()
        .filter(|(h, _)| h.what == Held::Permit)
        .flat_map(|(h, last)| [(h.granted, 1), (*last, -1)])
        .collect();
    edges.sort_unstable();
    let mut live = 0i32;
    for (event, step) in edges {
        live += step;
        if live > PERMITS as i32 {
            violations.push(format!(
                "semaphore: {live} permits acted on at event {event}, of {PERMITS}"
            ));
            break;
        }
    }
}

/// Every grant a recipe's store record counts reached its caller, or its
/// caller got an answer that leaves the outcome unknown: a grant nobody
/// knows of is a waiter told "not granted" (or still waiting) while the
/// store made it holder.
pub(super) async fn check_recipe_grants_reached(
    f: &Facts,
    store: &Arc<dyn Backend>,
    violations: &mut Vec<String>,
) {
    for (recipe, key, counter) in COUNTERS {
        let received: BTreeSet<u64> = f
            .holdings
            .iter()
            .filter(|h| h.what.recipe() == recipe)
            .map(|h| h.fence)
            .collect();
        let unknowns = f.recipe_unknowns.get(recipe).copied().unwrap_or(0);
        let Some(stored) = read_counter(store, key, counter).await else {
            continue;
        };
        let nobody = (1..=stored).filter(|n| !received.contains(n)).count() as u64;
        if nobody > unknowns {
            violations.push(format!(
                "{recipe}: the store granted {nobody} {counter}(s) nobody received, with only {unknowns} unknown answers"
            ));
        }
    }
}

/// Once every actor is done and every lease has run out, each lock and
/// recipe is free again: a grant, a place in line or a ticket left by a
/// waiter that was dropped, paused or partitioned blocks nobody past its
/// lease. Decided through the store itself, on the true clock.
pub(super) async fn check_all_free(
    store: &Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    violations: &mut Vec<String>,
) {
    let mut blocked = |what: &str, answer: String| {
        violations.push(format!(
            "{what} is not free once every lease ran out: {answer}"
        ));
    };
    let ttl = Duration::from_secs(1);
    let lock = GenericLock::with_options(
        store.clone(),
        LockOptions::default().with_clock(clock.clone()),
    );
    let fair = FairLock::with_options(
        store.clone(),
        FairLockOptions::default().with_clock(clock.clone()),
    );
    for (what, lock, key) in [
        ("the generic lock", &lock as &dyn Lock, "L"),
        ("the fair lock", &fair as &dyn Lock, "F"),
    ] {
        match lock.try_lock(key, ttl).await {
            Ok(Some(_)) => {}
            other => blocked(what, format!("{other:?}")),
        }
    }
    let semaphore = GenericSemaphore::with_options(
        store.clone(),
        SemaphoreOptions::default().with_clock(clock.clone()),
    );
    for n in 0..PERMITS {
        match semaphore.try_acquire(SEMAPHORE, PERMITS, ttl).await {
            Ok(Some(_)) => {}
            other => blocked(&format!("the semaphore's permit {n}"), format!("{other:?}")),
        }
    }
    let rwlock = GenericRwLock::with_options(
        store.clone(),
        RwLockOptions::default().with_clock(clock.clone()),
    );
    match rwlock.try_write(RWLOCK, ttl).await {
        Ok(Some(_)) => {}
        other => blocked("the read-write lock", format!("{other:?}")),
    }
    let election =
        GenericElection::with_options(store.clone(), ElectionOptions::default().with_clock(clock));
    match election.try_campaign(ELECTION, "checker", "v", ttl).await {
        Ok(Some(_)) => {}
        other => blocked("the election", format!("{other:?}")),
    }
    check_nothing_dead_left(store, violations).await;
}

/// Once the checker holds everything (its writes drop what has expired),
/// nothing a dead or dropped waiter left stays behind: no fair-lock ticket
/// key, no place in the semaphore's or the read-write lock's line, no
/// holder but the checker's. (Nothing coord writes may pile up.)
async fn check_nothing_dead_left(store: &Arc<dyn Backend>, violations: &mut Vec<String>) {
    match store.keys("fairlock/F/q/").await {
        Ok(tickets) if tickets.is_empty() => {}
        other => violations.push(format!("fair lock tickets left behind: {other:?}")),
    }
    let listed = |key: &'static str, field: &'static str| async move {
        let record = read_record(store, key).await?;
        Some(
            record
                .get(field)
                .and_then(|v| v.as_array())
                .map_or(0, Vec::len),
        )
    };
    for (key, field, expected) in [
        ("sem/S", "waiters", 0),
        ("sem/S", "holders", PERMITS as usize),
        ("rwlock/RW", "queue", 0),
        ("rwlock/RW", "holders", 1),
    ] {
        let found = listed(key, field).await;
        if found != Some(expected) {
            violations.push(format!(
                "{key}: {found:?} {field} left once the checker holds it, expected {expected}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(what: Held, fence: u64, granted: u64, last_valid: Option<u64>) -> Holding {
        Holding {
            what,
            who: format!("x{fence}"),
            fence,
            granted,
            last_valid,
        }
    }

    fn violations(holdings: &[Holding]) -> Vec<String> {
        let mut v = Vec::new();
        check_holdings(holdings, &mut v);
        v
    }

    #[test]
    fn the_checks_pass_grants_that_follow_each_other() {
        let ok = [
            h(Held::Permit, 1, 1, Some(10)),
            h(Held::Permit, 2, 2, Some(11)),
            h(Held::Permit, 3, 12, Some(20)),
            h(Held::Read, 1, 1, Some(10)),
            h(Held::Read, 2, 2, Some(10)),
            h(Held::Write, 3, 11, Some(20)),
            h(Held::Write, 4, 21, None),
            h(Held::Read, 5, 22, Some(30)),
            h(Held::Leader, 1, 1, Some(5)),
            h(Held::Leader, 2, 6, Some(9)),
        ];
        assert_eq!(violations(&ok), Vec::<String>::new());
    }

    #[test]
    fn the_checks_catch_each_broken_invariant() {
        let third_permit = [
            h(Held::Permit, 1, 1, Some(10)),
            h(Held::Permit, 2, 2, Some(10)),
            h(Held::Permit, 3, 3, Some(4)),
        ];
        assert_eq!(violations(&third_permit).len(), 1, "three permits at once");
        let write_with_read = [h(Held::Read, 1, 1, Some(10)), h(Held::Write, 2, 5, Some(6))];
        assert_eq!(
            violations(&write_with_read).len(),
            1,
            "a writer beside a reader"
        );
        let two_leaders = [
            h(Held::Leader, 1, 1, Some(10)),
            h(Held::Leader, 2, 9, Some(12)),
        ];
        assert_eq!(violations(&two_leaders).len(), 1, "two leaders at once");
        let twice = [h(Held::Permit, 1, 1, None), h(Held::Permit, 1, 2, None)];
        assert_eq!(violations(&twice).len(), 1, "one fence granted twice");
    }
}
