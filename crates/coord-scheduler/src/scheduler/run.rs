//! One run of a handler: spawned in its own task, bounded by the job's
//! timeout, kept alive by heartbeats while its lease is confirmed, then
//! finished in the store (or released on shutdown so a backup can take
//! over at once).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::wake::later;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{bounded, wait_shutdown, JobEntry, Scheduler};
use crate::{FinalStatus, Handler, RunContext, Slot};

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

impl Scheduler {
    /// Run the handler of a won slot (`token`: coordinated; its claim was
    /// sent at `claim_sent`) with heartbeats, then finish or release it.
    pub(super) fn spawn_run(
        &self,
        entry: Arc<JobEntry>,
        slot: Slot,
        token: Option<String>,
        takeovers: u32,
        claim_sent: Instant,
    ) {
        let inner = self.inner.clone();
        let handle = tokio::spawn(async move {
            let job = &entry.job;
            let name = job.name.clone();
            let (lost_tx, lost_rx) = watch::channel(false);
            let ctx = RunContext::new(
                name.clone(),
                slot,
                inner.options.instance_id.clone(),
                false,
                token.is_some(),
                takeovers,
                lost_rx,
            );
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
            let status = execute(
                &job.handler,
                ctx,
                job.options.timeout,
                heartbeats,
                &mut shutdown,
            )
            .await;
            {
                let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                st.local_running.remove(&slot);
            }
            if let Some(FinalStatus::Failed(_) | FinalStatus::TimedOut) = &status {
                crate::telemetry::run("failed");
            }
            let (Some(store), Some(token)) = (store, token) else {
                tracing::info!(job = %name, slot, ?status, "local run ended");
                return;
            };
            let bound = inner.options.store_timeout;
            match status {
                Some(status) => {
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
                None => {
                    let release = store.release(&name, slot, &token);
                    if let Err(error) = bounded(bound, "release", release).await {
                        tracing::warn!(job = %name, slot, %error, "could not release the lease on shutdown");
                    }
                }
            }
        });
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }
}
