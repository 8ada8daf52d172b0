//! One run of a handler: spawned in its own task, bounded by the job's
//! timeout, kept alive by heartbeats while its lease is confirmed, then
//! finished in the store (or released on shutdown so a backup can take
//! over at once). A job with a retry policy runs a failed handler again
//! after its backoff, under the same lease (heartbeats go on through the
//! wait), each retry first recorded in the store by token (`Retrying`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::wake::later;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{bounded, millis, wait_shutdown, Inner, JobEntry, Scheduler};
use crate::{jitter_for, FinalStatus, Handler, Retry, RunContext, Slot, SlotStore};

/// Run `handler` in its own task (a panic becomes a failure), bounded by
/// `timeout`, alongside `side` (heartbeats; never completes). `None` = shutdown.
pub(super) async fn execute(
    handler: &Handler,
    ctx: RunContext,
    timeout: Option<Duration>,
    side: impl Future<Output = ()>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<FinalStatus> {
    let task = tokio::spawn(handler(ctx));
    let abort = task.abort_handle();
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    // Biased, in this order: a handler that finished by its deadline
    // succeeded; and no random pick, so a seeded simulation replays exactly.
    tokio::select! {
        biased;
        joined = task => Some(match joined {
            Ok(Ok(())) => FinalStatus::Succeeded,
            Ok(Err(e)) => FinalStatus::Failed(e.to_string()),
            Err(e) if e.is_panic() => FinalStatus::Failed("handler panicked".into()),
            Err(_) => FinalStatus::Failed("handler cancelled".into()),
        }),
        _ = deadline => {
            abort.abort();
            Some(FinalStatus::TimedOut)
        }
        _ = side => unreachable_side(),
        _ = wait_shutdown(shutdown) => {
            abort.abort();
            None
        }
    }
}

fn unreachable_side() -> Option<FinalStatus> {
    // The side future loops forever; should it ever end, treat as a failure.
    Some(FinalStatus::Failed("heartbeat loop ended".into()))
}

/// How a run (all its attempts) ends.
enum End {
    /// Record this status by token.
    Finish(FinalStatus),
    /// Shutdown: release the lease so a backup takes over at once.
    Release,
    /// The store says another token owns the run now: nothing to record.
    NotOwner,
}

/// What one coordinated run needs between attempts.
struct Retrying<'a> {
    inner: &'a Inner,
    entry: &'a JobEntry,
    slot: Slot,
    /// The store and token of a coordinated run.
    owner: Option<(&'a Arc<dyn SlotStore>, &'a str)>,
}

impl Retrying<'_> {
    /// The last instant (UTC ms, this instance's clock) a retry may start:
    /// the slot's lateness bound, as a claim of the slot obeys it
    /// (`slot + jitter(job, slot) + max_late`).
    fn bound(&self) -> u64 {
        let job = &self.entry.job;
        self.slot
            .saturating_add(jitter_for(&job.name, self.slot, job.options.jitter))
            .saturating_add(millis(job.options.max_late))
    }

    /// After failed attempt `attempt` (of `retry.max_attempts`): wait the
    /// backoff holding the lease, then record attempt `attempt + 1` in the
    /// store. `Ok(())`: run it; `Err(end)`: the run ends so.
    async fn next(
        &self,
        retry: Retry,
        attempt: u32,
        failure: &str,
        lost: &mut watch::Receiver<bool>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), End> {
        let name = self.entry.job.name.as_str();
        let slot = self.slot;
        let failed = || End::Finish(FinalStatus::Failed(failure.to_owned()));
        if *lost.borrow() {
            tracing::warn!(
                job = name,
                slot,
                attempt,
                "attempt failed and the lease is lost: not retrying"
            );
            return Err(failed());
        }
        let wait = retry.backoff.delay(attempt);
        let bound = self.bound();
        let clock = &self.inner.clock;
        if clock.now_millis().saturating_add(millis(wait)) > bound {
            tracing::info!(
                job = name,
                slot,
                attempt,
                "attempt failed: a retry would start past the slot's lateness bound"
            );
            return Err(failed());
        }
        tracing::info!(
            job = name,
            slot,
            attempt,
            ?wait,
            error = failure,
            "attempt failed: retrying after the backoff"
        );
        // Biased, shutdown first, then the lease: no random pick, so a
        // seeded simulation replays exactly.
        tokio::select! {
            biased;
            _ = wait_shutdown(shutdown) => return Err(End::Release),
            _ = lost.wait_for(|l| *l) => return Err(failed()),
            _ = tokio::time::sleep(wait) => {}
        }
        let Some((store, token)) = self.owner else {
            return self.on_time(bound, failed);
        };
        let pause = (self.entry.job.options.lease_ttl / 3).max(Duration::from_millis(10));
        loop {
            // Judged again before each try: a pause, or a store that is slow
            // to answer, must not start a retry past the bound.
            self.on_time(bound, failed)?;
            if *lost.borrow() {
                return Err(failed());
            }
            let record = store.record_attempt(name, slot, token, attempt + 1, failure);
            match bounded(
                self.inner.options.store_timeout,
                "record an attempt",
                record,
            )
            .await
            {
                // Lost while the store answered: recorded, yet not run (an
                // attempt counted and not run never lets a slot run more).
                Ok(()) if *lost.borrow() => return Err(failed()),
                Ok(()) => return Ok(()),
                Err(error) if error.is_not_owner() => {
                    tracing::warn!(
                        job = name,
                        slot,
                        "not retrying: another instance owns the run"
                    );
                    return Err(End::NotOwner);
                }
                Err(error) => {
                    // Unknown is not "not recorded": ask the same question
                    // again (the store answers it for an attempt it already
                    // recorded), until the lease or the bound runs out.
                    tracing::warn!(job = name, slot, %error, "could not record the retry; asking again");
                }
            }
            tokio::select! {
                biased;
                _ = wait_shutdown(shutdown) => return Err(End::Release),
                _ = lost.wait_for(|l| *l) => return Err(failed()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    fn on_time(&self, bound: u64, failed: impl Fn() -> End) -> Result<(), End> {
        if self.inner.clock.now_millis() > bound {
            tracing::info!(
                job = %self.entry.job.name,
                slot = self.slot,
                "not retrying: past the slot's lateness bound"
            );
            return Err(failed());
        }
        Ok(())
    }
}

impl Scheduler {
    /// Run the handler of a won slot (`token`: coordinated; its claim was
    /// sent at `claim_sent`; `counts`: its takeovers and the attempt the
    /// claim started) with heartbeats, retrying failed attempts as its job
    /// says, then finish or release it.
    pub(super) fn spawn_run(
        &self,
        entry: Arc<JobEntry>,
        slot: Slot,
        token: Option<String>,
        counts: (u32, u32),
        claim_sent: Instant,
    ) {
        let inner = self.inner.clone();
        let handle = tokio::spawn(async move {
            let job = &entry.job;
            let name = job.name.clone();
            let (lost_tx, lost_rx) = watch::channel(false);
            let mut shutdown = inner.shutdown.subscribe();
            let store = inner.store.clone().filter(|_| token.is_some());
            let ttl = job.options.lease_ttl;
            let heartbeats = async {
                let (Some(store), Some(token)) = (&store, &token) else {
                    return std::future::pending::<()>().await;
                };
                // The lease as this instance knows it, like LockGuard's
                // (crates/coord-adapters/src/lock/guard.rs): it runs out one
                // TTL after the last *confirmed* claim or heartbeat was
                // SENT, on the monotonic clock (a wall-clock step cannot
                // extend it). A backup takes over only after seeing the lease
                // unchanged for a full TTL on its own monotonic clock, so it
                // never starts before this deadline has passed here.
                let every = (ttl / 3).max(Duration::from_millis(10));
                let mut deadline = later(claim_sent, ttl);
                let mut next = later(claim_sent, every);
                let lost = |why: &str| {
                    tracing::warn!(job = %name, slot, "lease lost: {why}");
                    lost_tx.send_replace(true);
                };
                loop {
                    // Biased: at a lease end that falls on a heartbeat, stop.
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep_until(deadline) => break,
                        _ = tokio::time::sleep_until(next) => {}
                    }
                    let sent = Instant::now();
                    next = later(sent, every);
                    // A heartbeat that does not answer before the next one
                    // is due (or the lease ends) counts as failed.
                    let answer = tokio::time::timeout_at(
                        next.min(deadline),
                        store.heartbeat(&name, slot, token, ttl),
                    )
                    .await;
                    match answer {
                        Ok(Ok(_)) => deadline = deadline.max(later(sent, ttl)),
                        Ok(Err(error)) if error.is_not_owner() => {
                            lost("another instance took the slot over");
                            return std::future::pending::<()>().await;
                        }
                        Ok(Err(error)) => {
                            tracing::warn!(job = %name, slot, %error, "heartbeat failed; retrying");
                        }
                        Err(_) => {
                            tracing::warn!(job = %name, slot, "heartbeat did not answer in time; retrying");
                        }
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                lost("no heartbeat confirmed within the lease (store unreachable or slow)");
                std::future::pending::<()>().await
            };
            let (takeovers, first) = counts;
            let retrying = Retrying {
                inner: &inner,
                entry: &entry,
                slot,
                owner: store.as_ref().zip(token.as_deref()),
            };
            let attempts = async {
                let mut attempt = first;
                let mut lost = lost_rx.clone();
                loop {
                    let ctx = RunContext::new(
                        name.clone(),
                        slot,
                        inner.options.instance_id.clone(),
                        false,
                        token.is_some(),
                        (takeovers, attempt),
                        lost_rx.clone(),
                    );
                    let pending = std::future::pending::<()>();
                    let status = execute(
                        &job.handler,
                        ctx,
                        job.options.timeout,
                        pending,
                        &mut shutdown,
                    )
                    .await;
                    let failure = match status {
                        None => return End::Release,
                        Some(FinalStatus::Failed(failure)) => failure,
                        Some(status) => return End::Finish(status),
                    };
                    let retry = match job.options.retry {
                        Some(retry) if attempt < retry.max_attempts => retry,
                        _ => return End::Finish(FinalStatus::Failed(failure)),
                    };
                    match retrying
                        .next(retry, attempt, &failure, &mut lost, &mut shutdown)
                        .await
                    {
                        Ok(()) => attempt += 1,
                        Err(end) => return end,
                    }
                }
            };
            // Biased: an ended run is recorded, whatever the heartbeats do.
            let end = tokio::select! {
                biased;
                end = attempts => end,
                _ = heartbeats => End::Finish(FinalStatus::Failed("heartbeat loop ended".into())),
            };
            {
                let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                st.local_running.remove(&slot);
            }
            if let End::Finish(FinalStatus::Failed(_) | FinalStatus::TimedOut) = &end {
                crate::telemetry::run("failed");
            }
            let (Some(store), Some(token)) = (store, token) else {
                tracing::info!(job = %name, slot, "local run ended");
                return;
            };
            let bound = inner.options.store_timeout;
            match end {
                End::Finish(status) => {
                    let finish = store.finish(&name, slot, &token, status.clone());
                    if let Err(error) = bounded(bound, "finish", finish).await {
                        tracing::warn!(job = %name, slot, %error, "could not record the end of the run");
                    }
                    // The next slot of the job may be waiting for this one.
                    inner.wake.notify_one();
                    if store.dedupe_window().is_some() {
                        if let Err(error) = bounded(bound, "prune", store.prune(&name)).await {
                            tracing::warn!(job = %name, %error, "could not forget old claims");
                        }
                    }
                }
                End::Release => {
                    let release = store.release(&name, slot, &token);
                    if let Err(error) = bounded(bound, "release", release).await {
                        tracing::warn!(job = %name, slot, %error, "could not release the lease on shutdown");
                    }
                }
                End::NotOwner => inner.wake.notify_one(),
            }
        });
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }
}
