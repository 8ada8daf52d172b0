//! The election suite: the contract of [`coord_adapters::election::Election`].
//!
//! Every check is a plain `async fn` over an [`ElectionEnv`]: a factory of
//! clients (each call a separate client, as another process would hold) and
//! the `ManualClock` they judge expiry with, so expiry checks never sleep.
//! [`election_tests!`](crate::election_tests) runs them on
//! [`GenericElection`](coord_adapters::election::GenericElection)s over a store; call them directly to check another
//! implementation.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`one_leader_race`]: of N candidates campaigning at once, exactly one leads;
//! - [`term_increases`]: terms strictly increase across resignations and expiries;
//! - [`resign_hands_over`]: a waiting campaign wins when the leader resigns, with a higher term;
//! - [`expired_leader_replaced`]: an expired leader is replaced, and its renew,
//!   proclaim and resign are refused without changing the new leader;
//! - [`proclaim_only_by_leader`]: the leader's proclaim changes the value, a stale one's does not;
//! - [`leader_reflects_changes`]: `leader` follows win, proclaim, renew, resign and expiry;
//! - [`observe_sees_change`]: a waiting observer wakes for a new leader and for its resignation;
//! - [`election_bad_input`]: empty name / candidate, zero TTL are typed errors.

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::election::{Election, ElectionError, Leadership, Observer};

use crate::clients::{granted as won, key as name, lost, ClientEnv, ClientFactory, Ctx};
use crate::{ensure, joined, BoxFuture, CheckResult, Failure};

/// Makes a new client of the election under test.
pub type ElectionFactory = ClientFactory<dyn Election, ElectionError>;

/// What a election check runs against (see [`ClientEnv`]).
pub type ElectionEnv = ClientEnv<dyn Election, ElectionError>;

const TTL: Duration = Duration::from_secs(3_600);
const SHORT: Duration = Duration::from_millis(1_500);
const WAIT: Duration = Duration::from_secs(30);

/// What `leader` says, as `(candidate, value, term)`.
async fn seen(e: &Arc<dyn Election>, n: &str) -> Result<Option<(String, String, u64)>, Failure> {
    Ok(e.leader(n)
        .await
        .ctx("leader")?
        .map(|l| (l.candidate, l.value, l.term)))
}

/// Twelve candidates (separate clients) campaign at once: exactly one leads,
/// the others time out, and `leader` names the winner with its term.
pub async fn one_leader_race(env: ElectionEnv) -> CheckResult {
    let n = name("race");
    let racers = 12;
    let barrier = Arc::new(tokio::sync::Barrier::new(racers));
    let mut tasks = Vec::new();
    for i in 0..racers {
        let client = env.client().await?;
        let (n, barrier) = (n.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let me = format!("cand-{i}");
            let answer = client.try_campaign(&n, &me, &me, TTL).await;
            (me, answer)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (me, answer) = joined(task, "candidate").await?;
        if let Some(l) = answer.ctx(&format!("{me} campaigning"))? {
            winners.push((me, l.term()));
        }
    }
    ensure!(winners.len() == 1, "{} leaders: {winners:?}", winners.len());
    let e = env.client().await?;
    let (who, term) = winners.pop().expect("one winner");
    let now = seen(&e, &n).await?;
    ensure!(
        now == Some((who.clone(), who.clone(), term)),
        "leader() says {now:?}, the winner was {who} with term {term}"
    );
    let late = e
        .campaign(&n, "late", "late", TTL, Duration::from_millis(50))
        .await;
    ensure!(
        matches!(late, Err(ElectionError::Timeout { .. })),
        "a campaign against a live leader: expected Timeout, got {late:?}"
    );
    Ok(())
}

/// Terms strictly increase across a resignation and an expiry takeover.
pub async fn term_increases(env: ElectionEnv) -> CheckResult {
    let n = name("term");
    let a = env.client().await?;
    let b = env.client().await?;
    let t1 = won(a.try_campaign(&n, "a", "1", TTL).await, "first leader")?;
    a.resign(t1.clone()).await.ctx("resign")?;
    let t2 = won(b.try_campaign(&n, "b", "2", SHORT).await, "second leader")?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    let t3 = won(
        a.try_campaign(&n, "a", "3", TTL).await,
        "third leader (after expiry)",
    )?;
    ensure!(
        t1.term() < t2.term() && t2.term() < t3.term(),
        "terms {}, {}, {} are not strictly increasing",
        t1.term(),
        t2.term(),
        t3.term()
    );
    let now = seen(&b, &n).await?;
    ensure!(
        now.as_ref().map(|s| s.2) == Some(t3.term()),
        "leader() says {now:?}"
    );
    a.resign(t3).await.ctx("resign")
}

/// A campaign waiting behind a leader wins when the leader resigns, with a
/// higher term; the resigned leadership is refused afterwards.
pub async fn resign_hands_over(env: ElectionEnv) -> CheckResult {
    let n = name("handover");
    let a = env.client().await?;
    let b = env.client().await?;
    let first = won(a.try_campaign(&n, "a", "a", TTL).await, "first leader")?;
    let bn = n.clone();
    let waiting = tokio::spawn(async move { b.campaign(&bn, "b", "b", TTL, WAIT).await });
    a.resign(first.clone()).await.ctx("resign")?;
    let second = joined(waiting, "campaign")
        .await?
        .ctx("the waiting campaign")?;
    ensure!(
        second.term() > first.term(),
        "term {} after resign is not above {}",
        second.term(),
        first.term()
    );
    lost(a.renew(&first).await, "renew after resigning")?;
    lost(a.resign(first).await, "resigning twice")?;
    let now = seen(&a, &n).await?;
    ensure!(
        now == Some(("b".into(), "b".into(), second.term())),
        "leader() says {now:?}"
    );
    Ok(())
}

/// A leader whose lease expired is replaced; the old leadership's renew,
/// proclaim and resign are refused and change nothing; its term is below
/// the new one.
pub async fn expired_leader_replaced(env: ElectionEnv) -> CheckResult {
    let n = name("expired");
    let a = env.client().await?;
    let b = env.client().await?;
    let old = won(a.try_campaign(&n, "a", "old", SHORT).await, "first leader")?;
    ensure!(
        b.try_campaign(&n, "b", "new", TTL)
            .await
            .ctx("campaign")?
            .is_none(),
        "a second leader while the first is live"
    );
    env.clock.advance(SHORT + Duration::from_millis(1));
    lost(a.renew(&old).await, "renew of an expired leadership")?;
    let new = won(
        b.try_campaign(&n, "b", "new", TTL).await,
        "campaign after expiry",
    )?;
    ensure!(
        new.term() > old.term(),
        "term {} not above {}",
        new.term(),
        old.term()
    );
    lost(a.renew(&old).await, "renew of a replaced leadership")?;
    lost(
        a.proclaim(&old, "hijack").await,
        "proclaim by a replaced leader",
    )?;
    lost(a.resign(old).await, "resign by a replaced leader")?;
    let now = seen(&a, &n).await?;
    ensure!(
        now == Some(("b".into(), "new".into(), new.term())),
        "the stale leader changed the election: {now:?}"
    );
    b.renew(&new).await.ctx("renew by the new leader")
}

/// Only the current leader proclaims: its new value is what `leader` shows;
/// a forged leadership with the current term but another token is refused.
pub async fn proclaim_only_by_leader(env: ElectionEnv) -> CheckResult {
    let n = name("proclaim");
    let a = env.client().await?;
    let b = env.client().await?;
    let lead = won(a.try_campaign(&n, "a", "v1", TTL).await, "leader")?;
    a.proclaim(&lead, "v2")
        .await
        .ctx("proclaim by the leader")?;
    ensure!(
        seen(&b, &n).await? == Some(("a".into(), "v2".into(), lead.term())),
        "proclaimed value not shown"
    );
    let forged = Leadership::new(
        &n,
        "b",
        "not-the-token",
        lead.term(),
        TTL,
        lead.expires_at(),
    );
    lost(b.proclaim(&forged, "v3").await, "proclaim by a non-leader")?;
    lost(b.renew(&forged).await, "renew by a non-leader")?;
    lost(b.resign(forged).await, "resign by a non-leader")?;
    ensure!(
        seen(&b, &n).await? == Some(("a".into(), "v2".into(), lead.term())),
        "a non-leader changed the election"
    );
    a.resign(lead).await.ctx("resign")
}

/// `leader` follows the election: none, a win, a proclaim, a renewal past
/// the first TTL, a resignation, another win and its expiry.
pub async fn leader_reflects_changes(env: ElectionEnv) -> CheckResult {
    let n = name("reflect");
    let a = env.client().await?;
    let viewer = env.client().await?;
    ensure!(
        seen(&viewer, &n).await?.is_none(),
        "a leader before any campaign"
    );
    let lead = won(a.try_campaign(&n, "a", "x", SHORT).await, "leader")?;
    ensure!(
        seen(&viewer, &n).await? == Some(("a".into(), "x".into(), lead.term())),
        "after win"
    );
    a.proclaim(&lead, "y").await.ctx("proclaim")?;
    env.clock.advance(SHORT * 3 / 4);
    a.renew(&lead).await.ctx("renew")?;
    env.clock.advance(SHORT * 3 / 4);
    ensure!(
        seen(&viewer, &n).await? == Some(("a".into(), "y".into(), lead.term())),
        "after proclaim and a renewal past the first TTL"
    );
    a.resign(lead).await.ctx("resign")?;
    ensure!(
        seen(&viewer, &n).await?.is_none(),
        "a leader after resigning"
    );
    let next = won(a.try_campaign(&n, "c", "z", SHORT).await, "next leader")?;
    ensure!(
        seen(&viewer, &n).await? == Some(("c".into(), "z".into(), next.term())),
        "after re-win"
    );
    env.clock.advance(SHORT + Duration::from_millis(1));
    ensure!(
        seen(&viewer, &n).await?.is_none(),
        "an expired leader still reported"
    );
    Ok(())
}

/// An observer waiting on an election with no leader wakes with the new
/// leader, then with "no leader" after it resigns; without a change it
/// times out.
pub async fn observe_sees_change(env: ElectionEnv) -> CheckResult {
    let n = name("observe");
    let viewer = env.client().await?;
    let mut observer = Observer::start(viewer.clone(), &n).await.ctx("observer")?;
    ensure!(observer.last().is_none(), "a leader before any campaign");
    let quiet = observer.next(Duration::from_millis(30)).await;
    ensure!(
        matches!(quiet, Err(ElectionError::Timeout { .. })),
        "no change: expected Timeout, got {quiet:?}"
    );
    let waiting = tokio::spawn(async move {
        let first = observer.next(WAIT).await;
        (observer, first)
    });
    let a = env.client().await?;
    let lead = won(a.try_campaign(&n, "a", "x", TTL).await, "leader")?;
    let (mut observer, first) = joined(waiting, "observer").await?;
    let first = first.ctx("observing the win")?;
    ensure!(
        first.as_ref().map(|l| (l.candidate.as_str(), l.term)) == Some(("a", lead.term())),
        "observed {first:?}, expected a at term {}",
        lead.term()
    );
    a.resign(lead).await.ctx("resign")?;
    let second = observer.next(WAIT).await.ctx("observing the resignation")?;
    ensure!(
        second.is_none(),
        "observed {second:?} after the resignation"
    );
    Ok(())
}

/// Empty name, empty candidate and zero TTL are typed errors.
pub async fn election_bad_input(env: ElectionEnv) -> CheckResult {
    let e = env.client().await?;
    for (what, answer) in [
        ("empty name", e.try_campaign("", "a", "v", TTL).await),
        ("empty candidate", e.try_campaign("n", "", "v", TTL).await),
        (
            "zero ttl",
            e.try_campaign("n", "a", "v", Duration::ZERO).await,
        ),
        ("NUL in name", e.try_campaign("n\0", "a", "v", TTL).await),
    ] {
        ensure!(
            matches!(answer, Err(ElectionError::Invalid(_))),
            "{what}: expected Invalid, got {answer:?}"
        );
    }
    let leader = e.leader("").await;
    ensure!(
        matches!(leader, Err(ElectionError::Invalid(_))),
        "leader of an empty name: expected Invalid, got {leader:?}"
    );
    Ok(())
}

crate::__define_suite! {$
    /// The election suite's one list of cases (see [`crate::__define_suite!`]).
    __election_suite "election";
    checks(ElectionEnv);
    /// Every case of the election suite, over [`GenericElection`](coord_adapters::election::GenericElection)s on a
    /// backend factory with a `ManualClock` (see [`ElectionEnv::generic`]).
    cases;
    /// Expand the election suite into one `#[tokio::test]` per case, over
    /// [`GenericElection`](coord_adapters::election::GenericElection)s on a [`BackendFactory`](crate::BackendFactory) expression (or an
    /// `Option<BackendFactory>`, `None` = skipped).
    election_tests(election);
    one_leader_race,
    term_increases,
    resign_hands_over,
    expired_leader_replaced,
    proclaim_only_by_leader,
    leader_reflects_changes,
    observe_sees_change,
    election_bad_input,
}

/// One check of the suite, runnable against any [`ElectionEnv`].
pub type ElectionEnvCheck = fn(ElectionEnv) -> BoxFuture<'static, CheckResult>;
