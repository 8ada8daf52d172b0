//! The workloads: each a tokio task with its own client, recording into a
//! [`Recorder`] until the round's stop flag is set.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, BoardError, TaskSpec};
use coord_adapters::lock::{FairLock, GenericLock, GenericSemaphore, Lock, Semaphore, WaitOptions};
use coord_adapters::sideeffect::{
    Action, BackendFencedSink, EffectResult, Fence, FencedSink, Outcome, Runner, SideEffectAdapter,
    SideEffectStore,
};
use coord_backend::{Assert, Backend, Error, Mutation, StoreUrl};
use tokio::time::{sleep, timeout, Instant};

use crate::history::{
    Apply, Completion, Effect, EffectOf, Grant, RawKind, RawOp, Recorder, SinkWrite, SlotRun,
    TxnResult, Value,
};

/// The longest the harness lets one store call run before it gives up on it
/// (a txn given up on is `Unknown`): the stores' own timeouts are shorter.
pub const CALL_LIMIT: Duration = Duration::from_secs(20);

/// How to open a client of the store under test.
#[derive(Clone, Debug)]
pub enum Store {
    /// etcd: the comma-separated endpoints of `COORD_HA_ETCD_ENDPOINTS`.
    Etcd(String),
    /// A `postgres://` URL (the multi-host one of `COORD_HA_POSTGRES_URL`).
    Postgres(String),
    /// A `redis+cluster://` URL.
    RedisCluster(String),
    /// A `redis+sentinel://` URL (`COORD_HA_REDIS_SENTINEL_URL`, maybe with
    /// `?replicas=N&replica_timeout_ms=T`).
    RedisSentinel(String),
}

/// `url` with `param` (`name=value`) appended: `?` when it has no query yet,
/// else `&`.
pub fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

impl Store {
    /// A new client (its own connections) in `namespace`.
    pub async fn connect(&self, namespace: &str) -> coord_backend::Result<Arc<dyn Backend>> {
        let with_ns =
            |url: &str| StoreUrl::parse(&with_param(url, &format!("namespace={namespace}")));
        Ok(match self {
            Store::Etcd(endpoints) => {
                let endpoints: Vec<String> = endpoints
                    .split(',')
                    .map(|e| e.trim().to_owned())
                    .filter(|e| !e.is_empty())
                    .collect();
                let options =
                    coord_etcd::EtcdOptions::default().with_request_timeout(Duration::from_secs(3));
                Arc::new(
                    coord_etcd::EtcdBackend::connect_endpoints(&endpoints, namespace, options)
                        .await?,
                )
            }
            Store::Postgres(url) => {
                let options = coord_postgres::PostgresOptions::default()
                    .with_max_connections(2)
                    .with_connect_timeout(Duration::from_secs(3));
                Arc::new(
                    coord_postgres::PostgresBackend::connect_with(&with_ns(url)?, options).await?,
                )
            }
            Store::RedisCluster(url) | Store::RedisSentinel(url) => {
                Arc::new(coord_redis::RedisBackend::connect(&with_ns(url)?).await?)
            }
        })
    }
}

/// What every workload task shares: the recorder, the stop flag and a
/// source of unique values.
#[derive(Clone, Debug)]
pub struct Shared {
    /// Where events go.
    pub recorder: Recorder,
    /// Set when the round is over.
    pub stop: Arc<AtomicBool>,
    /// The next unique value.
    pub next_value: Arc<AtomicU64>,
}

impl Shared {
    /// Fresh shared state.
    pub fn new(recorder: Recorder) -> Self {
        Shared {
            recorder,
            stop: Arc::default(),
            next_value: Arc::new(AtomicU64::new(1)),
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn success(&self, call: u64) {
        let ret = self.recorder.now();
        self.recorder.record(|h| h.successes.push((call, ret)));
    }
}

fn parse_value(bytes: Option<&[u8]>) -> Result<Value, ()> {
    match bytes {
        None => Ok(None),
        Some(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or(()),
    }
}

/// A raw-primitive client on `key`: snapshot read, then a txn asserting the
/// version read and putting a fresh unique value, until stopped.
pub async fn raw_client(shared: Shared, backend: Arc<dyn Backend>, key: String, client: usize) {
    let rec = &shared.recorder;
    let push = |call, ret, kind| {
        rec.record(|h| {
            h.raw.push(RawOp {
                key: key.clone(),
                client,
                call,
                ret,
                kind,
            })
        })
    };
    while !shared.stopped() {
        let call = rec.now();
        let read = timeout(CALL_LIMIT, backend.snapshot(std::slice::from_ref(&key))).await;
        let entry = match read {
            Ok(Ok(mut entries)) if entries.len() == 1 => entries.remove(0),
            _ => {
                sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ret = rec.now();
        let Ok(expected) = parse_value(entry.value.as_deref()) else {
            sleep(Duration::from_millis(50)).await;
            continue;
        };
        shared.success(call);
        push(call, ret, RawKind::Read { value: expected });

        let new = shared.next_value.fetch_add(1, Ordering::Relaxed);
        let call = rec.now();
        let outcome = timeout(
            CALL_LIMIT,
            backend.txn(
                &[Assert::at(key.clone(), entry.version)],
                &[Mutation::put(key.clone(), new.to_string().into_bytes())],
            ),
        )
        .await;
        let result = match outcome {
            Ok(Ok(o)) if o.applied => TxnResult::Applied,
            Ok(Ok(_)) => TxnResult::Rejected,
            // Refused before sending: nothing happened, not part of the history.
            Ok(Err(Error::Unavailable { .. })) => {
                sleep(Duration::from_millis(50)).await;
                continue;
            }
            Ok(Err(_)) | Err(_) => TxnResult::Unknown,
        };
        let ret = rec.now();
        if result != TxnResult::Unknown {
            shared.success(call);
        }
        push(
            call,
            ret,
            RawKind::Cas {
                expected,
                new,
                result,
            },
        );
        let pause = if result == TxnResult::Unknown { 50 } else { 10 };
        sleep(Duration::from_millis(pause)).await;
    }
}

/// The TTL of the lock workload's grants.
pub const LOCK_TTL: Duration = Duration::from_secs(2);

/// Which lock a [`lock_holder`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// [`GenericLock`].
    Generic,
    /// [`FairLock`] (FIFO tickets).
    Fair,
}

/// A lock holder on `key`: waits for the lock (timeout 5 s), writes three
/// times through a [`BackendFencedSink`] with its fence, renewing before each
/// write, then releases; records each grant's fence and validity.
pub async fn lock_holder(
    shared: Shared,
    backend: Arc<dyn Backend>,
    kind: LockKind,
    key: String,
    holder: usize,
) {
    let rec = &shared.recorder;
    let lock: Box<dyn Lock> = match kind {
        LockKind::Generic => Box::new(GenericLock::new(backend.clone())),
        LockKind::Fair => Box::new(FairLock::new(backend.clone())),
    };
    let sink = BackendFencedSink::new(backend);
    let wait = WaitOptions::with_timeout(Duration::from_secs(5));
    while !shared.stopped() {
        let call = rec.now();
        let handle = match timeout(CALL_LIMIT, lock.wait_lock(&key, LOCK_TTL, &wait)).await {
            Ok(Ok(handle)) => handle,
            _ => {
                sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let granted = rec.now();
        shared.success(call);
        let fence = handle.fence();
        let mut until = rec.at(handle.requested_instant() + LOCK_TTL);
        for write in 0..3 {
            sleep(Duration::from_millis(150)).await;
            let sent = Instant::now();
            let call = rec.at(sent);
            if !matches!(timeout(CALL_LIMIT, lock.renew(&handle)).await, Ok(Ok(()))) {
                break;
            }
            shared.success(call);
            until = rec.at(sent + LOCK_TTL);
            let call = rec.now();
            let mutation = Mutation::put(
                format!("data/{key}"),
                format!("{holder}/{fence}/{write}").into_bytes(),
            );
            let written = timeout(
                CALL_LIMIT,
                sink.write_fenced(&key, Fence(fence), vec![mutation]),
            )
            .await;
            if matches!(written, Ok(Ok(()))) {
                let ret = rec.now();
                shared.success(call);
                rec.record(|h| {
                    h.sink_writes.push(SinkWrite {
                        resource: key.clone(),
                        fence,
                        call,
                        ret,
                    })
                });
            }
        }
        // The holder stops relying on the grant when it asks to release it.
        until = until.min(rec.now());
        let _ = timeout(CALL_LIMIT, lock.release(handle)).await;
        rec.record(|h| {
            h.grants.push(Grant {
                key: key.clone(),
                permits: 1,
                holder,
                fence,
                call,
                granted,
                until,
            })
        });
        sleep(Duration::from_millis(20 + 15 * holder as u64)).await;
    }
}

/// A side-effect runner: executes the actions `e0`, `e1`, ... in order (the
/// other runners race for the same ones), each until it is applied or
/// replayed (an `Uncertain` one is left alone: it would need reconciling),
/// at most 20 attempts each; the effect appends to the shared log.
pub async fn effect_runner(shared: Shared, backend: Arc<dyn Backend>, runner_id: usize) {
    let rec = shared.recorder.clone();
    let store: Arc<dyn SideEffectStore> = Arc::new(SideEffectAdapter::new(backend));
    let runner = Runner::new(store);
    let mut n = 0u64;
    while !shared.stopped() {
        let action = Action::new(format!("e{n}"), format!("res{}", n % 3));
        for _ in 0..20 {
            if shared.stopped() {
                return;
            }
            let call = rec.now();
            let log = rec.clone();
            let key = action.key.clone();
            let result = timeout(
                CALL_LIMIT,
                runner.execute(&action, Duration::from_secs(2), move |lease| async move {
                    let at = log.now();
                    log.record(|h| {
                        h.applies.push(Apply {
                            action: key,
                            runner: runner_id,
                            fence: lease.fence.0,
                            at,
                        })
                    });
                    Ok::<_, std::convert::Infallible>(EffectResult::from("done"))
                }),
            )
            .await;
            match result {
                Ok(Ok(execution))
                    if matches!(execution.outcome, Outcome::Applied | Outcome::Replayed) =>
                {
                    shared.success(call);
                    break;
                }
                Ok(Ok(execution)) if execution.outcome == Outcome::Uncertain => break,
                _ => sleep(Duration::from_millis(30 + 20 * runner_id as u64)).await,
            }
        }
        n += 1;
        sleep(Duration::from_millis(20)).await;
    }
}

/// How many permits the semaphore workload's key has.
pub const SEM_PERMITS: u32 = 2;

/// A semaphore holder on `key` ([`GenericSemaphore`], [`SEM_PERMITS`]
/// permits): waits in line for a permit (timeout 5 s), holds it for three
/// renewals 150 ms apart, then releases; records each permit's fence and
/// validity.
pub async fn semaphore_holder(
    shared: Shared,
    backend: Arc<dyn Backend>,
    key: String,
    holder: usize,
) {
    let rec = &shared.recorder;
    let sem = GenericSemaphore::new(backend);
    let wait = WaitOptions::with_timeout(Duration::from_secs(5));
    while !shared.stopped() {
        let call = rec.now();
        let acquired = timeout(CALL_LIMIT, sem.acquire(&key, SEM_PERMITS, LOCK_TTL, &wait)).await;
        let Ok(Ok(permit)) = acquired else {
            sleep(Duration::from_millis(50)).await;
            continue;
        };
        let granted = rec.now();
        shared.success(call);
        let mut until = rec.at(permit.requested_instant() + LOCK_TTL);
        for _ in 0..3 {
            sleep(Duration::from_millis(150)).await;
            let sent = Instant::now();
            if !matches!(timeout(CALL_LIMIT, sem.renew(&permit)).await, Ok(Ok(()))) {
                break;
            }
            shared.success(rec.at(sent));
            until = rec.at(sent + LOCK_TTL);
        }
        until = until.min(rec.now());
        let fence = permit.fence();
        let _ = timeout(CALL_LIMIT, sem.release(permit)).await;
        rec.record(|h| {
            h.grants.push(Grant {
                key: key.clone(),
                permits: SEM_PERMITS,
                holder,
                fence,
                call,
                granted,
                until,
            })
        });
        sleep(Duration::from_millis(20 + 15 * holder as u64)).await;
    }
}

/// Apply the once-only effect of `of` for `who`: a txn creating `key` over
/// "missing" with `who` as its value, retried (at most 20 times) while its
/// answer is lost. Recorded when it applied, or when a retry finds `who`'s
/// own value there (its lost copy landed); another's value means the
/// effect is done already. The key is never deleted, so a late copy of the
/// txn cannot apply a second time.
async fn apply_once(shared: &Shared, backend: &dyn Backend, key: &str, of: EffectOf, who: &str) {
    let rec = &shared.recorder;
    for _ in 0..20 {
        let call = rec.now();
        let outcome = timeout(
            CALL_LIMIT,
            backend.txn(
                &[Assert::missing(key)],
                &[Mutation::put(key, who.as_bytes().to_vec())],
            ),
        )
        .await;
        let mine = match outcome {
            Ok(Ok(o)) => {
                o.applied
                    || o.current
                        .iter()
                        .any(|e| e.value.as_deref() == Some(who.as_bytes()))
            }
            _ => {
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        shared.success(call);
        if mine {
            let at = rec.now();
            rec.record(|h| {
                h.effects.push(Effect {
                    of,
                    who: who.to_owned(),
                    at,
                })
            });
        }
        return;
    }
}

/// The TTL of the board workers' claims.
pub const CLAIM_TTL: Duration = Duration::from_secs(5);

/// A board worker ([`BoardAdapter`]): for tasks `t0`, `t1`, ... in order
/// (every worker adds each one, a no-op once it exists, and races the
/// others for it), claims the task, applies its once-only effect
/// (`fx/task/<id>`, see [`Effect`]), then completes it, retrying the
/// completion with the same token while its answer is lost (a no-op once
/// it landed); moves on once the task is completed. Records each claim as
/// a [`Grant`] of `task/<id>` (valid until the first complete call), each
/// acknowledged completion and effect.
pub async fn board_worker(shared: Shared, backend: Arc<dyn Backend>, worker: usize) {
    let rec = &shared.recorder;
    let board = BoardAdapter::new(backend.clone());
    let agent = format!("w{worker}");
    let mut n = 0u64;
    while !shared.stopped() {
        let id = format!("t{n}");
        let call = rec.now();
        if !matches!(
            timeout(CALL_LIMIT, board.add(TaskSpec::new(id.clone(), Vec::new()))).await,
            Ok(Ok(()))
        ) {
            sleep(Duration::from_millis(50)).await;
            continue;
        }
        shared.success(call);
        let sent = Instant::now();
        let call = rec.at(sent);
        let claim = match timeout(CALL_LIMIT, board.claim(&id, &agent, CLAIM_TTL)).await {
            Ok(Ok(claim)) => claim,
            Ok(Err(BoardError::Completed { .. })) => {
                shared.success(call);
                n += 1;
                continue;
            }
            Ok(Err(BoardError::AlreadyClaimed { .. })) => {
                shared.success(call);
                sleep(Duration::from_millis(30 + 10 * worker as u64)).await;
                continue;
            }
            _ => {
                sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let granted = rec.now();
        shared.success(call);
        let who = format!("worker {worker} fence {}", claim.fence);
        apply_once(
            &shared,
            backend.as_ref(),
            &format!("fx/task/{id}"),
            EffectOf::Task(id.clone()),
            &who,
        )
        .await;
        let complete_call = rec.now();
        let until = rec.at(sent + CLAIM_TTL).min(complete_call);
        rec.record(|h| {
            h.grants.push(Grant {
                key: format!("task/{id}"),
                permits: 1,
                holder: worker,
                fence: claim.fence,
                call,
                granted,
                until,
            })
        });
        for _ in 0..20 {
            let call = rec.now();
            let done = timeout(
                CALL_LIMIT,
                board.complete(&id, &claim.token, b"done".to_vec()),
            )
            .await;
            match done {
                Ok(Ok(())) => {
                    let ret = rec.now();
                    shared.success(call);
                    rec.record(|h| {
                        h.completions.push(Completion {
                            task: id.clone(),
                            worker,
                            fence: claim.fence,
                            call: complete_call,
                            ret,
                        })
                    });
                    break;
                }
                // Lost (taken over) or completed by another claim: not ours.
                Ok(Err(BoardError::LeaseLost { .. } | BoardError::Completed { .. })) => break,
                _ => sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// The scheduler workload's slot period.
pub const SLOT_PERIOD: Duration = Duration::from_millis(500);

/// A scheduler instance (`coord-scheduler` over its own client's
/// [`coord_scheduler::RunStore`]) of the job `tick`, every
/// [`SLOT_PERIOD`], coordinated through the store: the handler records its
/// start and applies the slot's once-only effect (`fx/slot/<slot>`, see
/// [`Effect`]). Runs until the round stops, then shuts down.
pub async fn scheduler_instance(shared: Shared, backend: Arc<dyn Backend>, instance: usize) {
    use coord_scheduler::{
        handler, Job, JobOptions, LockingHint, RunStore, RunStoreOptions, Schedule, Scheduler,
        SchedulerOptions,
    };
    let clock = Arc::new(coord_backend::SystemClock);
    let Ok(store) = RunStore::new(backend.clone(), clock.clone(), RunStoreOptions::default())
    else {
        return;
    };
    let scheduler = Scheduler::new(
        Some(Arc::new(store)),
        clock,
        SchedulerOptions::instance(format!("i{instance}"))
            .with_poll_interval(Duration::from_millis(100))
            .with_store_timeout(Duration::from_secs(5)),
    );
    let Ok(schedule) = Schedule::every(SLOT_PERIOD) else {
        return;
    };
    let run_shared = shared.clone();
    let job = Job::new(
        "tick",
        schedule,
        handler(move |ctx| {
            let (shared, backend) = (run_shared.clone(), backend.clone());
            async move {
                let at = shared.recorder.now();
                shared.recorder.record(|h| {
                    h.slot_runs.push(SlotRun {
                        slot: ctx.slot,
                        instance: ctx.instance.clone(),
                        takeovers: ctx.takeovers,
                        at,
                    })
                });
                let who = format!("{} takeovers {}", ctx.instance, ctx.takeovers);
                apply_once(
                    &shared,
                    backend.as_ref(),
                    &format!("fx/slot/{}", ctx.slot),
                    EffectOf::Slot(ctx.slot),
                    &who,
                )
                .await;
                Ok(())
            }
        }),
    )
    .with_options(
        JobOptions::default()
            .with_hint(LockingHint::RequireGlobal)
            .with_lease_ttl(Duration::from_secs(10))
            .with_max_late(Duration::from_secs(10)),
    );
    if scheduler.add_job(job).is_err() {
        return;
    }
    scheduler.start();
    while !shared.stopped() {
        sleep(Duration::from_millis(100)).await;
    }
    scheduler.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::with_param;

    #[test]
    fn params_are_appended_with_the_right_separator() {
        assert_eq!(
            with_param("redis+sentinel://h:1,h:2/coord", "replicas=1"),
            "redis+sentinel://h:1,h:2/coord?replicas=1"
        );
        assert_eq!(
            with_param("redis+sentinel://h:1/coord?db=2", "replicas=1"),
            "redis+sentinel://h:1/coord?db=2&replicas=1"
        );
    }
}
