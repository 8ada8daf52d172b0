//! One tick of one job, in three steps: plan which slots to look at (under
//! the job's state lock, without awaiting), claim or start them in slot
//! order, then record the slots that became too late. Claims come before
//! skip records because only claims are sensitive to lateness.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use coord_adapters::mint_token;
use coord_adapters::wake::later;
use tokio::time::Instant;

use super::{bounded, millis, JobEntry, JobState, Scheduler};
use crate::{
    jitter_for, Claim, ClaimOutcome, ClaimRequest, RunError, SkipReason, Slot, SlotStore, Takeover,
    TickAction, TickEvent,
};

/// A slot held by another instance, as this one follows it.
#[derive(Clone, Debug)]
pub(super) struct Follow {
    /// The holder's `lease_until_ms` as last seen in the store.
    lease_until: u64,
    /// When (monotonic) that value was first seen. A takeover is only asked
    /// for once it stayed the same for a full lease: by then the holder,
    /// which counts its lease from when its last confirmed heartbeat was
    /// sent, has stopped considering itself the owner (a wall clock stepped
    /// forward on this instance cannot shorten that).
    seen_since: Instant,
    /// When (monotonic) to look at the slot again.
    look_at: Instant,
}

// No `Debug`: a retry carries its token.
#[derive(Clone)]
pub(super) enum Pending {
    /// Held elsewhere: followed until taken over, done, or late.
    Following(Follow),
    /// Blocked by a running slot (store-wide).
    Overlap,
    /// Blocked by a local run of another slot.
    LocalOverlap,
    /// The store failed; retry with the same token (it may have won).
    StoreError { token: String },
}

/// A slot to claim or start, with the token of an earlier attempt whose
/// answer was lost (reused so that a claim that landed is recognised).
type Attempt = (Slot, Option<String>);

/// One job's tick: its fixed time and the events so far.
struct JobTick<'a> {
    entry: &'a Arc<JobEntry>,
    now: u64,
    started: Instant,
    max_late: u64,
    look_back: u64,
    events: Vec<TickEvent>,
}

impl<'a> JobTick<'a> {
    fn state(&self) -> MutexGuard<'a, JobState> {
        let entry: &'a Arc<JobEntry> = self.entry;
        entry.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn jitter(&self, slot: Slot) -> u64 {
        let job = &self.entry.job;
        jitter_for(&job.name, slot, job.options.jitter)
    }

    fn late_at(&self, slot: Slot, at: u64) -> bool {
        at > slot
            .saturating_add(self.jitter(slot))
            .saturating_add(self.max_late)
    }

    fn is_late(&self, slot: Slot) -> bool {
        self.late_at(slot, self.now)
    }

    /// The tick's time, advanced by the monotonic time spent since it
    /// began: a tick that waited on the store (or a process that was
    /// paused) must not claim a slot that became late meanwhile.
    fn fresh_now(&self) -> u64 {
        self.now.saturating_add(millis(self.started.elapsed()))
    }

    fn event(&mut self, slot: Slot, action: TickAction) {
        match &action {
            TickAction::Started { takeover: true, .. } => crate::telemetry::run("takeover"),
            TickAction::Started { .. } => crate::telemetry::run("ran"),
            TickAction::Late {
                reason: SkipReason::Overlap,
                ..
            } => crate::telemetry::run("skipped_overlap"),
            TickAction::Late { .. } | TickAction::LateUnlisted { .. } => {
                crate::telemetry::run("skipped_late")
            }
            _ => {}
        }
        self.events.push(TickEvent {
            job: self.entry.job.name.clone(),
            slot,
            action,
        })
    }
}

impl Scheduler {
    /// Tick one job as if the time were `now`; `started` is when the whole
    /// tick began, on the monotonic clock.
    pub(super) async fn tick_job(
        &self,
        entry: &Arc<JobEntry>,
        now: u64,
        started: Instant,
    ) -> Vec<TickEvent> {
        let opts = &entry.job.options;
        let max_late = millis(opts.max_late);
        let mut tick = JobTick {
            entry,
            now,
            started,
            max_late,
            look_back: max_late.saturating_add(millis(opts.jitter)),
            events: Vec::new(),
        };
        let (attempts, mut lates) = self.plan(&mut tick);
        self.attempt_all(&mut tick, attempts, &mut lates).await;
        self.record_skips(&mut tick, lates).await;
        tick.events
    }

    /// Which slots to claim or start and which are too late: pending slots
    /// first, then due slots from the cursor. Decided under the state lock,
    /// so no await here.
    fn plan(&self, tick: &mut JobTick<'_>) -> (Vec<Attempt>, Vec<(Slot, SkipReason)>) {
        let job = &tick.entry.job;
        let name = job.name.as_str();
        let now = tick.now;
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut lates: Vec<(Slot, SkipReason)> = Vec::new();
        {
            let mut st = tick.state();
            if !st.initialized {
                st.initialized = true;
                st.cursor = job
                    .schedule
                    .next_at_or_after(now.saturating_sub(tick.look_back));
            }
            let mono = Instant::now();
            let pending: Vec<(Slot, Pending)> =
                st.pending.iter().map(|(s, p)| (*s, p.clone())).collect();
            for (slot, p) in pending {
                if tick.is_late(slot) {
                    // Followed slots too: a slot is never claimed past its
                    // lateness bound, which add_job keeps below the store's
                    // dedupe window, so never after its claim could be forgotten.
                    st.pending.remove(&slot);
                    let reason = match p {
                        Pending::Overlap | Pending::LocalOverlap => SkipReason::Overlap,
                        _ => SkipReason::Late,
                    };
                    lates.push((slot, reason));
                    continue;
                }
                match p {
                    Pending::Following(f) if mono < f.look_at => {}
                    Pending::Following(_) | Pending::Overlap | Pending::LocalOverlap => {
                        attempts.push((slot, None))
                    }
                    Pending::StoreError { token } => attempts.push((slot, Some(token))),
                }
            }
            let mut started = 0usize;
            while let Some(slot) = st.cursor {
                if slot.saturating_add(tick.jitter(slot)) > now
                    || started >= self.inner.options.max_starts_per_tick
                {
                    break;
                }
                if tick.is_late(slot) {
                    if lates.len() >= self.inner.options.max_skips_recorded_per_tick {
                        let boundary = now.saturating_sub(tick.look_back);
                        let next = job.schedule.next_at_or_after(boundary);
                        if next.is_some_and(|n| n > slot) || next.is_none() {
                            tracing::warn!(job = name, before = boundary, "skipped every slot before this instant (too late; not listed one by one)");
                            tick.event(boundary, TickAction::LateUnlisted { before: boundary });
                            st.cursor = next;
                            continue;
                        }
                    }
                    lates.push((slot, SkipReason::Late));
                } else if !st.pending.contains_key(&slot) {
                    attempts.push((slot, None));
                    started += 1;
                }
                st.cursor = job.schedule.next_after(slot);
            }
        }
        attempts.sort_by_key(|(slot, _)| *slot);
        attempts.dedup_by_key(|(slot, _)| *slot);
        (attempts, lates)
    }

    /// Claim (or start locally) each attempt, in slot order. Once a slot is
    /// blocked by a running slot (no overlap), every later fresh slot of
    /// this job is blocked too, so it waits without a store write; only the
    /// oldest blocked slot asks the store each tick (a backlog must not
    /// multiply the store load). Retries carrying a token still ask: they
    /// may have won.
    async fn attempt_all(
        &self,
        tick: &mut JobTick<'_>,
        attempts: Vec<Attempt>,
        lates: &mut Vec<(Slot, SkipReason)>,
    ) {
        let entry = tick.entry;
        let mut blocked_by: Option<Slot> = None;
        for (slot, token) in attempts {
            if tick.late_at(slot, tick.fresh_now()) {
                let mut st = tick.state();
                let reason = match st.pending.remove(&slot) {
                    Some(Pending::Overlap | Pending::LocalOverlap) => SkipReason::Overlap,
                    _ => SkipReason::Late,
                };
                lates.push((slot, reason));
                continue;
            }
            if let (Some(running_slot), None, true) = (blocked_by, &token, entry.coordinated) {
                let mut st = tick.state();
                if !matches!(st.pending.get(&slot), Some(Pending::Following(_))) {
                    st.pending.insert(slot, Pending::Overlap);
                    drop(st);
                    tick.event(slot, TickAction::Overlap { running_slot });
                    continue;
                }
            }
            if !entry.coordinated {
                self.start_local(tick, slot);
                continue;
            }
            let Some(store) = self.inner.store.clone() else {
                continue;
            };
            if let Some(running_slot) = self.claim(tick, &store, slot, token).await {
                blocked_by = Some(running_slot);
            }
        }
    }

    /// Start a slot of an uncoordinated job, unless another local run of
    /// the job forbids it.
    fn start_local(&self, tick: &mut JobTick<'_>, slot: Slot) {
        let blocked = {
            let mut st = tick.state();
            if !tick.entry.job.options.allow_overlap && st.local_running.iter().any(|s| *s != slot)
            {
                st.pending.insert(slot, Pending::LocalOverlap);
                true
            } else {
                st.pending.remove(&slot);
                st.local_running.insert(slot);
                false
            }
        };
        if blocked {
            tick.event(slot, TickAction::LocalOverlap);
            return;
        }
        self.spawn_run(tick.entry.clone(), slot, None, (0, 1), Instant::now());
        tick.event(
            slot,
            TickAction::Started {
                takeover: false,
                coordinated: false,
            },
        );
    }

    /// Claim `slot` in the store (with `token` when retrying) and act on
    /// the answer. Returns the running slot that blocks it, when the store
    /// refused it for overlap.
    async fn claim(
        &self,
        tick: &mut JobTick<'_>,
        store: &Arc<dyn SlotStore>,
        slot: Slot,
        token: Option<String>,
    ) -> Option<Slot> {
        let opts = &tick.entry.job.options;
        let ttl = opts.lease_ttl;
        // Another instance's unreleased run is only taken over once this
        // instance saw its lease unchanged for a full lease on its own
        // monotonic clock (and the store's clock says it expired).
        let takeover = {
            let st = tick.state();
            match st.pending.get(&slot) {
                Some(Pending::Following(f)) if f.seen_since.elapsed() >= ttl => {
                    Takeover::IfUnchanged(f.lease_until)
                }
                _ => Takeover::Never,
            }
        };
        let token = token.unwrap_or_else(mint_token);
        let request = ClaimRequest::new(
            tick.entry.job.name.as_str(),
            slot,
            token.clone(),
            self.inner.options.instance_id.clone(),
            ttl,
        )
        .with_allow_overlap(opts.allow_overlap)
        .with_takeover(takeover)
        .with_max_attempts(opts.retry.map(|r| r.max_attempts));
        // The lease counts from when the claim was sent, not answered.
        let sent = Instant::now();
        // Bounded by store_timeout only: on a saturated store, cancelling
        // and retrying sooner would only add load (the abandoned call
        // still runs); an answer that comes after the lease is retried.
        let claim = bounded(
            self.inner.options.store_timeout,
            "claim",
            store.claim(&request),
        )
        .await;
        self.on_claim(tick, slot, token, sent, claim)
    }

    /// Act on the store's answer to the claim of `slot` sent at `sent`.
    fn on_claim(
        &self,
        tick: &mut JobTick<'_>,
        slot: Slot,
        token: String,
        sent: Instant,
        claim: Result<Claim, RunError>,
    ) -> Option<Slot> {
        let entry = tick.entry;
        let name = entry.job.name.as_str();
        let ttl = entry.job.options.lease_ttl;
        let mut st = tick.state();
        match claim {
            Ok(claim) if claim.won && sent.elapsed() >= ttl => {
                // Won, but the answer came after the lease (counted from
                // sending) ran out: claim again with the same token,
                // which renews the lease if nobody took it meanwhile.
                st.pending.insert(slot, Pending::StoreError { token });
                tracing::warn!(
                    job = name,
                    slot,
                    "claim answered after its lease ran out: retrying"
                );
                tick.event(
                    slot,
                    TickAction::StoreError {
                        message: "claim answered after its lease ran out".into(),
                    },
                );
            }
            Ok(claim) if claim.won => {
                st.pending.remove(&slot);
                st.local_running.insert(slot);
                drop(st);
                let counts = (claim.takeovers, claim.attempts.max(1));
                self.spawn_run(entry.clone(), slot, Some(token), counts, sent);
                tick.event(
                    slot,
                    TickAction::Started {
                        takeover: claim.outcome == ClaimOutcome::TakenOver,
                        coordinated: true,
                    },
                );
            }
            Ok(claim) => return tick.on_lost(&mut st, slot, claim),
            Err(error) => {
                st.pending.insert(slot, Pending::StoreError { token });
                tracing::warn!(job = name, slot, %error, "run store failed: skipping this tick");
                tick.event(
                    slot,
                    TickAction::StoreError {
                        message: error.to_string(),
                    },
                );
            }
        }
        None
    }

    /// Record the late slots. Recording them is history only: once the tick
    /// has taken a poll interval, the rest are logged, not written, so a
    /// backlog of late slots never delays the next tick's claims.
    async fn record_skips(&self, tick: &mut JobTick<'_>, lates: Vec<(Slot, SkipReason)>) {
        let entry = tick.entry;
        let name = entry.job.name.as_str();
        let budget = self.inner.options.poll_interval;
        let mut unrecorded = 0usize;
        for (slot, reason) in lates {
            let recorded = match (&self.inner.store, entry.coordinated) {
                (Some(_), true) if tick.started.elapsed() >= budget => {
                    unrecorded += 1;
                    false
                }
                (Some(store), true) => {
                    match bounded(
                        self.inner.options.store_timeout,
                        "record a skip",
                        store.record_skip(name, slot, &self.inner.options.instance_id, reason),
                    )
                    .await
                    {
                        Ok(recorded) => recorded,
                        Err(error) => {
                            tracing::warn!(job = name, slot, %error, "could not record a skipped slot");
                            false
                        }
                    }
                }
                _ => false,
            };
            tracing::info!(job = name, slot, ?reason, "slot skipped: too late to start");
            tick.event(slot, TickAction::Late { reason, recorded });
        }
        if unrecorded > 0 {
            tracing::warn!(
                job = name,
                unrecorded,
                "skipped slots not recorded in history (the tick ran out of time)"
            );
        }
    }
}

impl JobTick<'_> {
    /// A claim another instance won: follow its holder, wait behind the
    /// slot that blocks it, or drop it when its run is done. Returns the
    /// blocking slot on overlap.
    fn on_lost(&mut self, st: &mut JobState, slot: Slot, claim: Claim) -> Option<Slot> {
        let name = self.entry.job.name.as_str();
        let ttl = self.entry.job.options.lease_ttl;
        match claim.outcome {
            ClaimOutcome::Overlap { running_slot } => {
                // A followed slot keeps what it saw of its holder's
                // lease: forgetting it here would restart the full
                // lease of observation a takeover needs, and a dead
                // holder's slot would go late behind the next slots.
                if !matches!(st.pending.get(&slot), Some(Pending::Following(_))) {
                    st.pending.insert(slot, Pending::Overlap);
                }
                tracing::info!(
                    job = name,
                    slot,
                    running_slot,
                    "slot blocked by a running slot (no overlap)"
                );
                self.event(slot, TickAction::Overlap { running_slot });
                return Some(running_slot);
            }
            ClaimOutcome::Running => {
                let lease_until = claim.lease_until_ms.unwrap_or(0);
                let seen = Instant::now();
                let seen_since = match st.pending.get(&slot) {
                    Some(Pending::Following(f)) if f.lease_until == lease_until => f.seen_since,
                    _ => seen,
                };
                let follow_every = (ttl / 3).max(Duration::from_millis(1));
                // Look again every third of a lease (to see the
                // holder's heartbeats move it) and when it has been
                // unchanged for a full lease.
                let look_at = later(seen, follow_every)
                    .min(later(seen_since, ttl))
                    .max(seen + Duration::from_millis(1));
                st.pending.insert(
                    slot,
                    Pending::Following(Follow {
                        lease_until,
                        seen_since,
                        look_at,
                    }),
                );
                tracing::debug!(job = name, slot, holder = ?claim.holder, "slot held elsewhere: following it");
                self.event(
                    slot,
                    TickAction::HeldElsewhere {
                        holder: claim.holder,
                    },
                );
            }
            // Done, and any outcome this version does not know.
            _ => {
                st.pending.remove(&slot);
                self.event(slot, TickAction::AlreadyDone);
            }
        }
        None
    }
}
