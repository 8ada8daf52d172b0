//! Failover harness: real coord workloads on the replicated topologies of
//! `scripts/ha` while a fault loop kills or pauses the primary or leader,
//! then checks of the recorded history (issue 30).
//!
//! One round ([`run_round`]) on one topology:
//!
//! 1. `scripts/ha up <topology>`; then, each with its own client in a fresh
//!    namespace, the [`workload`]s: raw-primitive clients (3 keys, 2 clients
//!    each: snapshot read, then a txn asserting the version read and putting
//!    a fresh unique value), lock holders ([`coord_adapters::GenericLock`],
//!    2 keys, 2 holders each, and [`coord_adapters::FairLock`], 1 key, 2
//!    holders: waiting acquire, writes through a
//!    [`coord_adapters::sideeffect::BackendFencedSink`] with the grant's
//!    fence), semaphore holders ([`coord_adapters::GenericSemaphore`], 1 key
//!    of 2 permits, 3 holders), side-effect runners
//!    ([`coord_adapters::Runner`], 2 runners racing on the same actions),
//!    board workers ([`coord_adapters::BoardAdapter`], 3 workers racing to
//!    claim, apply and complete the same tasks) and scheduler instances
//!    (`coord_scheduler::Scheduler`, 2 instances of one job every 500 ms
//!    over a `RunStore`). A task's or a slot's effect is a txn creating its
//!    own key over "missing", never deleted: a late copy cannot apply it
//!    again, so two acknowledged effects mean the store forgot one.
//!    Every event is recorded with monotonic timestamps ([`history`]).
//! 2. The fault loop ([`topology`]): SIGKILL of the etcd leader, SIGSTOP +
//!    SIGCONT of it (a pause), SIGKILL of the PostgreSQL primary (the
//!    postmaster and its backends at once, as when its machine dies), then
//!    `promote-standby` and `rejoin-old-primary` (with `pg-sync on` or
//!    `off`: synchronous or asynchronous standby), a split brain on
//!    PostgreSQL (SIGSTOP of the primary and its backends, `promote-standby`,
//!    SIGCONT, both primaries serving for [`SPLIT_BRAIN`], then
//!    `rejoin-old-primary`), SIGKILL of the Redis
//!    Cluster primary serving the namespace's slot, SIGKILL of the Redis
//!    Sentinel primary (then polls, bounded in number, until the Sentinels
//!    name another; clients reach it through a `redis+sentinel://` URL, as
//!    is, with `?replicas=1` or with `?replicas=2`, `&replica_timeout_ms=500`;
//!    and with `?replicas=1` after one of the two replicas was killed first,
//!    [`Fault::KillWithOneReplicaLeft`]); after each, `up`
//!    brings the topology back before the next (the old Redis primary as a
//!    replica of the new one).
//! 3. The checks ([`check`](mod@check)): linearizability of every raw key (todc-utils'
//!    WGL checker) and acknowledged writes lost, duplicate or decreasing
//!    fences and overlapping grants (locks, fair lock, semaphore permits
//!    beyond its count, board claims), stale fenced-sink writes, double
//!    applies, board tasks completed twice, scheduler slots run twice;
//!    and the unavailability per fault (fault → end of the first successful
//!    operation called after it), next to the topology's own failover time
//!    (fault → it had a new leader or primary, polled every
//!    [`topology::POLL`]: an etcd survivor says it is the leader, or none
//!    did during a pause; `promote-standby` returned; the Redis Cluster shows
//!    3 primaries again; the Sentinels name another primary that answers as
//!    one).
//!
//! The report is one [`Row`] per topology and mode ([`table`]).
//!
//! The tests (`tests/failover.rs`) kill servers other test binaries use:
//! they are `#[ignore]`d and run on their own, one at a time:
//!
//! ```sh
//! ./scripts/ha up etcd postgres redis-cluster redis-sentinel && eval "$(./scripts/ha env)"
//! cargo test -p coord-failover -- --ignored --test-threads 1
//! # long mode: N faults per topology
//! COORD_FAILOVER_ROUNDS=20 cargo test -p coord-failover -- --ignored --test-threads 1 --nocapture
//! ```

pub mod check;
pub mod history;
pub mod topology;
pub mod workload;

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

pub use check::{check, Violations};
pub use history::{History, Recorder};
pub use topology::Topology;
pub use workload::Store;

use workload::LockKind;

use history::FaultEvent;

/// One workload task, before it is spawned.
type Workload = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
use coord_backend::Backend;
use topology::HaResult;

/// One fault of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the leader (etcd) or the primary (PostgreSQL: then
    /// `promote-standby` and `rejoin-old-primary`; Redis Cluster: the
    /// primary of the namespace's slot, then wait for its replica to take over;
    /// Redis Sentinel: the primary, then wait until the Sentinels name another).
    Kill,
    /// SIGSTOP the etcd leader for [`PAUSE`], then SIGCONT. PostgreSQL: SIGSTOP
    /// the primary with its backends, `promote-standby`, SIGCONT (a split
    /// brain: two primaries for [`SPLIT_BRAIN`]), then `rejoin-old-primary`.
    Pause,
    /// Redis Sentinel only: SIGKILL one of the two replicas and wait until
    /// the Sentinels flag it down and the other has every write the primary
    /// had then ([`topology::leave_one_replica`]), then as [`Fault::Kill`].
    /// With `?replicas=1` the one live replica is every replica: a clean
    /// primary kill must lose no acknowledged write. `up` restarts both.
    KillWithOneReplicaLeft,
}

/// How long a paused etcd leader stays stopped.
pub const PAUSE: Duration = Duration::from_secs(4);

/// How long a paused PostgreSQL primary, resumed after the promotion, runs
/// beside the new primary before it is stopped and rejoined.
pub const SPLIT_BRAIN: Duration = Duration::from_secs(3);

/// One round: a topology, its store, the mode's name and the faults in order.
#[derive(Clone, Debug)]
pub struct RoundConfig {
    /// Which topology of `scripts/ha`.
    pub topology: Topology,
    /// How clients reach it.
    pub store: Store,
    /// The mode's name in the report (e.g. `sync`, `async`).
    pub mode: String,
    /// PostgreSQL only: `pg-sync on|off` before the round (and `off` after it
    /// when it was turned on).
    pub pg_sync: Option<bool>,
    /// The faults, in order.
    pub faults: Vec<Fault>,
}

/// The faults of a round: `pattern` repeated to `COORD_FAILOVER_ROUNDS`
/// faults when that is set, else `pattern` itself.
pub fn faults_from_env(pattern: &[Fault]) -> Vec<Fault> {
    match std::env::var("COORD_FAILOVER_ROUNDS")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
    {
        Some(n) if n > 0 => pattern.iter().copied().cycle().take(n).collect(),
        _ => pattern.to_vec(),
    }
}

/// One row of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The topology's name.
    pub topology: String,
    /// The mode.
    pub mode: String,
    /// Faults injected.
    pub failovers: usize,
    /// Successful operations of every workload.
    pub ops: usize,
    /// Acknowledged raw writes lost.
    pub acked_writes_lost: usize,
    /// Raw keys whose history is not linearizable.
    pub non_linearizable_keys: usize,
    /// Duplicate or decreasing fences.
    pub dup_fences: usize,
    /// Overlapping grants.
    pub overlapping_grants: usize,
    /// Double applies of a side effect.
    pub double_applies: usize,
    /// Board tasks completed (or their effect applied) twice.
    pub tasks_completed_twice: usize,
    /// Scheduler slots run (or their effect applied) twice.
    pub slots_run_twice: usize,
    /// Per fault, the topology's own failover time: fault → it had a new
    /// leader or primary (`None`: not seen; see [`history::FaultEvent`]).
    pub topology_failover: Vec<Option<Duration>>,
    /// Per fault, the unavailability (`None`: nothing succeeded after it).
    pub unavailable: Vec<Option<Duration>>,
}

/// The median and the maximum of `times`, as the table prints them
/// (`never` for the maximum when one is unknown, `-` when all are).
pub fn p50_max(times: &[Option<Duration>]) -> String {
    let mut known: Vec<Duration> = times.iter().flatten().copied().collect();
    if known.is_empty() {
        return "-".to_owned();
    }
    known.sort();
    let p50 = known[(known.len() - 1) / 2];
    let max = if known.len() < times.len() {
        "never".to_owned()
    } else {
        format!("{:.1} s", known[known.len() - 1].as_secs_f64())
    };
    format!("{:.1} s / {max}", p50.as_secs_f64())
}

impl Row {
    /// The median and the maximum unavailability, as the table prints them.
    pub fn unavailable_p50_max(&self) -> String {
        p50_max(&self.unavailable)
    }

    /// The median and the maximum of the topology's own failover time.
    pub fn topology_failover_p50_max(&self) -> String {
        p50_max(&self.topology_failover)
    }
}

/// The header of the report table.
pub const TABLE_HEADER: &str = "| topology | mode | failovers | ops | acked writes lost | dup fences | overlapping grants | double applies | tasks completed twice | slots run twice | topology failover p50/max | unavailable p50/max |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |";

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lost = if self.non_linearizable_keys > 0 {
            format!(
                "{} ({} keys not linearizable)",
                self.acked_writes_lost, self.non_linearizable_keys
            )
        } else {
            self.acked_writes_lost.to_string()
        };
        write!(
            f,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.topology,
            self.mode,
            self.failovers,
            self.ops,
            lost,
            self.dup_fences,
            self.overlapping_grants,
            self.double_applies,
            self.tasks_completed_twice,
            self.slots_run_twice,
            self.topology_failover_p50_max(),
            self.unavailable_p50_max()
        )
    }
}

/// The report table of `rows`, header included.
pub fn table(rows: &[Row]) -> String {
    let mut out = TABLE_HEADER.to_owned();
    for row in rows {
        out.push('\n');
        out.push_str(&row.to_string());
    }
    out
}

/// What one round found.
#[derive(Clone, Debug)]
pub struct RoundReport {
    /// The row of the report.
    pub row: Row,
    /// What the checks found, in detail.
    pub violations: Violations,
    /// Everything recorded.
    pub history: History,
}

/// A failure to run a round (not a violation: those are in the report).
#[derive(Debug)]
pub struct RoundError(pub String);

impl fmt::Display for RoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RoundError {}

impl From<topology::HaError> for RoundError {
    fn from(e: topology::HaError) -> Self {
        RoundError(e.0)
    }
}

impl From<coord_backend::Error> for RoundError {
    fn from(e: coord_backend::Error) -> Self {
        RoundError(format!("store: {e}"))
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> HaResult<T> + Send + 'static,
) -> Result<T, RoundError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RoundError(format!("fault task: {e}")))?
        .map_err(RoundError::from)
}

/// Inject `fault` on `topology` and bring it back (`up`); records the
/// moment of the signal and the moment the topology had a new leader or
/// primary.
fn inject(topology: Topology, fault: Fault, namespace: &str, recorder: &Recorder) -> HaResult<()> {
    use topology::{find_role, pids, signal, up, wait_etcd_leader, wait_roles, POLL};
    // Polls of the waits below: 30 s at most.
    const ATTEMPTS: u32 = 300;
    let record = |what: String| {
        let at = recorder.now();
        let mut index = 0;
        recorder.record(|h| {
            index = h.faults.len();
            h.faults.push(FaultEvent {
                what,
                at,
                new_leader_at: None,
            })
        });
        index
    };
    let new_leader = |index: usize| {
        let now = recorder.now();
        recorder.record(|h| h.faults[index].new_leader_at = Some(now));
    };
    let others = |port: u16| -> HaResult<Vec<u16>> {
        Ok(pids(topology)?
            .iter()
            .map(|p| p.port)
            .filter(|&p| p != port)
            .collect())
    };
    match (topology, fault) {
        (
            Topology::Etcd | Topology::Postgres | Topology::RedisCluster,
            Fault::KillWithOneReplicaLeft,
        ) => Err(topology::HaError(format!(
            "{fault:?} is a Redis Sentinel fault, not one for {}",
            topology.name()
        ))),
        (Topology::Etcd, Fault::Kill) => {
            let leader = find_role(topology, "leader", 20)?;
            let survivors = others(leader.port)?;
            signal(leader.pid.unwrap_or_default(), "KILL")?;
            let fault = record(format!("SIGKILL etcd leader :{}", leader.port));
            // Survivors elect a leader (bounded polls), then the member restarts
            // (once it is really gone: see `wait_gone`).
            wait_etcd_leader(&survivors, ATTEMPTS)?;
            new_leader(fault);
            topology::wait_gone(leader.pid.unwrap_or_default())?;
            up(topology)
        }
        (Topology::Etcd, Fault::Pause) => {
            let leader = find_role(topology, "leader", 20)?;
            let survivors = others(leader.port)?;
            let pid = leader.pid.unwrap_or_default();
            signal(pid, "STOP")?;
            let stopped = std::time::Instant::now();
            let fault = record(format!("SIGSTOP etcd leader :{}", leader.port));
            // Whether the others elect a leader while it is stopped.
            let attempts = (PAUSE.as_millis() / POLL.as_millis()) as u32;
            if wait_etcd_leader(&survivors, attempts).is_ok() && stopped.elapsed() < PAUSE {
                new_leader(fault);
            }
            std::thread::sleep(PAUSE.saturating_sub(stopped.elapsed()));
            signal(pid, "CONT")?;
            up(topology)
        }
        (Topology::Postgres, Fault::Pause) => {
            let primary = find_role(topology, "primary", 20)?;
            let pid = primary.pid.unwrap_or_default();
            topology::signal_tree(pid, "STOP")?;
            let fault = record(format!(
                "SIGSTOP postgres primary :{} and its backends, standby promoted, SIGCONT: \
                 two primaries for {SPLIT_BRAIN:?}",
                primary.port
            ));
            topology::promote_standby()?;
            new_leader(fault);
            // No fencing, as with a failover manager that does not stop the
            // old primary: it serves the sessions it has, and new ones, until
            // `rejoin-old-primary` stops and rewinds it.
            topology::signal_tree(pid, "CONT")?;
            std::thread::sleep(SPLIT_BRAIN);
            topology::rejoin_old_primary()?;
            up(topology)
        }
        (Topology::Postgres, Fault::Kill) => {
            let primary = find_role(topology, "primary", 20)?;
            topology::kill_tree(primary.pid.unwrap_or_default())?;
            let fault = record(format!(
                "SIGKILL postgres primary :{} and its backends",
                primary.port
            ));
            topology::promote_standby()?;
            new_leader(fault);
            topology::rejoin_old_primary()?;
            up(topology)
        }
        (Topology::RedisCluster, _) => {
            let processes = topology::pids(topology)?;
            let ports: Vec<u16> = processes.iter().map(|p| p.port).collect();
            let owner =
                topology::redis_cluster_owner(&ports, &format!("coord:{{{namespace}}}:k:x"))?;
            let pid = processes
                .iter()
                .find(|p| p.port == owner)
                .and_then(|p| p.pid)
                .ok_or_else(|| topology::HaError(format!("no pid for :{owner}")))?;
            signal(pid, "KILL")?;
            let fault = record(format!("SIGKILL redis-cluster primary :{owner}"));
            // Its replica takes the slots over (3 primaries again) before the
            // killed node restarts: a node without persistence restarted
            // first would come back as an empty master of its slots.
            wait_roles(topology, "primary", 3, ATTEMPTS)?;
            new_leader(fault);
            topology::wait_gone(pid)?;
            up(topology)
        }
        (Topology::RedisSentinel, _) => {
            let left = match fault {
                Fault::KillWithOneReplicaLeft => {
                    let stopped = topology::leave_one_replica(ATTEMPTS)?;
                    format!(" (replica :{stopped} killed before, one replica left)")
                }
                Fault::Kill | Fault::Pause => String::new(),
            };
            let primary = find_role(topology, "primary", 20)?;
            signal(primary.pid.unwrap_or_default(), "KILL")?;
            let fault = record(format!(
                "SIGKILL redis-sentinel primary :{}{left}",
                primary.port
            ));
            // The Sentinels promote a replica (bounded polls) before the killed
            // node restarts, so `up` brings it back as a replica of the new one.
            topology::wait_sentinel_failover(primary.port, ATTEMPTS)?;
            new_leader(fault);
            topology::wait_gone(primary.pid.unwrap_or_default())?;
            up(topology)
        }
    }
}

/// Run one round (see the crate docs).
pub async fn run_round(config: &RoundConfig) -> Result<RoundReport, RoundError> {
    let topology = config.topology;
    blocking(move || topology::up(topology)).await?;
    if let Some(on) = config.pg_sync {
        blocking(move || topology::pg_sync(on)).await?;
    }
    let result = run_workloads(config).await;
    if config.pg_sync == Some(true) {
        blocking(|| topology::pg_sync(false)).await?;
    }
    result
}

async fn run_workloads(config: &RoundConfig) -> Result<RoundReport, RoundError> {
    let namespace = coord_conformance::unique_namespace("failover");
    let recorder = Recorder::new();
    let shared = workload::Shared::new(recorder.clone());
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    // Each copy of a workload gets its own client, and its number.
    let mut spawn = async |count: usize, start: &dyn Fn(Arc<dyn Backend>, usize) -> Workload| {
        for i in 0..count {
            let backend = config.store.connect(&namespace).await?;
            tasks.push(tokio::spawn(start(backend, i)));
        }
        Ok::<_, RoundError>(())
    };
    let sh = &shared;
    for k in 0..3 {
        spawn(2, &|b, c| {
            Box::pin(workload::raw_client(
                sh.clone(),
                b,
                format!("raw/{k}"),
                k * 2 + c,
            ))
        })
        .await?;
    }
    for k in 0..2 {
        spawn(2, &|b, h| {
            let key = format!("l{k}");
            Box::pin(workload::lock_holder(
                sh.clone(),
                b,
                LockKind::Generic,
                key,
                k * 2 + h,
            ))
        })
        .await?;
    }
    spawn(2, &|b, r| {
        Box::pin(workload::effect_runner(sh.clone(), b, r))
    })
    .await?;
    spawn(2, &|b, h| {
        let key = "fair0".to_owned();
        Box::pin(workload::lock_holder(
            sh.clone(),
            b,
            LockKind::Fair,
            key,
            10 + h,
        ))
    })
    .await?;
    spawn(3, &|b, h| {
        Box::pin(workload::semaphore_holder(
            sh.clone(),
            b,
            "sem0".to_owned(),
            20 + h,
        ))
    })
    .await?;
    spawn(3, &|b, w| {
        Box::pin(workload::board_worker(sh.clone(), b, w))
    })
    .await?;
    spawn(2, &|b, i| {
        Box::pin(workload::scheduler_instance(sh.clone(), b, i))
    })
    .await?;

    sleep(Duration::from_secs(2)).await;
    let mut fault_error = None;
    for &fault in &config.faults {
        let (ns, rec, topology) = (namespace.clone(), recorder.clone(), config.topology);
        if let Err(e) = blocking(move || inject(topology, fault, &ns, &rec)).await {
            fault_error = Some(e);
            break;
        }
        // Settle: until an operation called now succeeds (at most 100 polls),
        // then a little longer so the next fault hits a working cluster.
        let from = recorder.now();
        for _ in 0..100 {
            if recorder
                .snapshot()
                .successes
                .iter()
                .any(|(c, _)| *c >= from)
            {
                break;
            }
            sleep(Duration::from_millis(100)).await;
        }
        sleep(Duration::from_millis(1500)).await;
    }

    shared.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let abort = task.abort_handle();
        if timeout(Duration::from_secs(60), task).await.is_err() {
            abort.abort();
        }
    }
    if let Some(e) = fault_error {
        // Leave the topology usable for whoever runs next.
        let topology = config.topology;
        let _ = blocking(move || topology::up(topology)).await;
        return Err(e);
    }

    let history = recorder.snapshot();
    let violations = check(&history);
    let row = Row {
        topology: config.topology.name().to_owned(),
        mode: config.mode.clone(),
        failovers: history.faults.len(),
        ops: history.successes.len(),
        acked_writes_lost: violations.acked_writes_lost,
        non_linearizable_keys: violations.non_linearizable_keys.len(),
        dup_fences: violations.dup_fences.len(),
        overlapping_grants: violations.overlapping_grants.len(),
        double_applies: violations.double_applies.len(),
        tasks_completed_twice: violations.tasks_completed_twice.len(),
        slots_run_twice: violations.slots_run_twice.len(),
        topology_failover: history
            .faults
            .iter()
            .map(|f| {
                f.new_leader_at
                    .map(|t| Duration::from_micros(t.saturating_sub(f.at)))
            })
            .collect(),
        unavailable: check::unavailability(&history),
    };
    Ok(RoundReport {
        row,
        violations,
        history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_the_topology_failover_next_to_the_unavailability() {
        let s = Duration::from_secs;
        assert_eq!(p50_max(&[]), "-");
        assert_eq!(
            p50_max(&[Some(s(3)), Some(s(1)), Some(s(2))]),
            "2.0 s / 3.0 s"
        );
        assert_eq!(p50_max(&[Some(s(1)), None]), "1.0 s / never");
        let row = Row {
            topology: "etcd".into(),
            mode: "raft".into(),
            failovers: 2,
            ops: 10,
            acked_writes_lost: 0,
            non_linearizable_keys: 0,
            dup_fences: 0,
            overlapping_grants: 0,
            double_applies: 0,
            tasks_completed_twice: 0,
            slots_run_twice: 0,
            topology_failover: vec![Some(s(1)), None],
            unavailable: vec![Some(s(2)), Some(s(4))],
        };
        let table = table(&[row]);
        assert!(
            table.contains("topology failover p50/max | unavailable p50/max |"),
            "{table}"
        );
        assert!(
            table.ends_with("| 1.0 s / never | 2.0 s / 4.0 s |"),
            "{table}"
        );
    }
}
