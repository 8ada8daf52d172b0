//! Driving `scripts/ha`: which process has which role, faults (SIGKILL,
//! SIGSTOP/SIGCONT through the `kill` command), PostgreSQL promotion, and
//! bringing a topology back (`up`).
//!
//! Every call blocks (it runs a process); the round runs them on tokio's
//! blocking pool while the workloads go on.

use std::path::PathBuf;
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

/// The replicated topologies of `scripts/ha` the harness drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// 3 etcd members (the leader is killed or paused).
    Etcd,
    /// PostgreSQL primary + streaming standby (the primary is killed, the
    /// standby promoted by hand, the old primary rejoined).
    Postgres,
    /// Redis Cluster, 3 primaries + 3 replicas (the primary of the shard
    /// holding the workloads' namespace is killed).
    RedisCluster,
    /// Redis primary + 2 replicas watched by 3 Sentinels (master name
    /// [`SENTINEL_MASTER`]): the primary is killed, the Sentinels promote a
    /// replica, `up` brings the old primary back as a replica.
    RedisSentinel,
}

/// The master name the Sentinels of `scripts/ha` monitor.
pub const SENTINEL_MASTER: &str = "coord";

impl Topology {
    /// The topology's name in `scripts/ha`.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Etcd => "etcd",
            Topology::Postgres => "postgres",
            Topology::RedisCluster => "redis-cluster",
            Topology::RedisSentinel => "redis-sentinel",
        }
    }
}

/// One process of a topology, as `scripts/ha pids` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    /// What the process says it is now (`leader`, `follower`, `primary`,
    /// `replica`, `standby`), or `down` / `unresponsive`.
    pub role: String,
    /// Its pid (`None` when down).
    pub pid: Option<u32>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// A failure of `scripts/ha` or of a signal.
#[derive(Debug)]
pub struct HaError(pub String);

impl std::fmt::Display for HaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HaError {}

/// The result of a topology-control call.
pub type HaResult<T> = Result<T, HaError>;

/// The path of `scripts/ha` in this repository.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ha")
}

/// Run `scripts/ha ARGS`; its stdout when it exits 0.
pub fn ha(args: &[&str]) -> HaResult<String> {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .map_err(|e| HaError(format!("scripts/ha {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(HaError(format!(
            "scripts/ha {} exited with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Parse the output of `scripts/ha pids`.
pub fn parse_pids(text: &str) -> Vec<Process> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let role = fields.next()?.to_owned();
            let pid = fields.next()?.parse().ok();
            let port = fields.next()?.parse().ok()?;
            Some(Process { role, pid, port })
        })
        .collect()
}

/// The processes of `topology` and their roles now.
pub fn pids(topology: Topology) -> HaResult<Vec<Process>> {
    Ok(parse_pids(&ha(&["pids", topology.name()])?))
}

/// Restart what is down in `topology` and wait until it is usable.
pub fn up(topology: Topology) -> HaResult<()> {
    ha(&["up", topology.name()]).map(drop)
}

/// Send `signal` (`KILL`, `STOP`, `CONT`) to `pid` with the `kill` command.
pub fn signal(pid: u32, signal: &str) -> HaResult<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| HaError(format!("kill -{signal} {pid}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(HaError(format!(
            "kill -{signal} {pid} exited with {status}"
        )))
    }
}

/// Send `signal` to `pid` and its child processes in one `kill` command, as
/// when its machine dies (`KILL`) or freezes (`STOP`, then `CONT`): a
/// PostgreSQL postmaster signalled alone leaves its backends serving the
/// sessions they have. A child may exit between `pgrep` and `kill` (`kill`
/// then fails for it), so `kill`'s status is not judged.
pub fn signal_tree(pid: u32, signal: &str) -> HaResult<()> {
    let children = Command::new("pgrep")
        .arg("-P")
        .arg(pid.to_string())
        .output()
        .map_err(|e| HaError(format!("pgrep -P {pid}: {e}")))?;
    let mut pids = vec![pid.to_string()];
    pids.extend(
        String::from_utf8_lossy(&children.stdout)
            .split_whitespace()
            .map(str::to_owned),
    );
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(&pids)
        .stderr(std::process::Stdio::null())
        .status();
    Ok(())
}

/// SIGKILL `pid` and its child processes ([`signal_tree`]), then wait until
/// the root is gone ([`wait_gone`]).
pub fn kill_tree(pid: u32) -> HaResult<()> {
    signal_tree(pid, "KILL")?;
    wait_gone(pid)
}

/// Wait until `pid` is dead or a zombie (at most [`GONE_WITHIN`]). SIGKILL
/// takes effect when the process leaves the kernel: one in an uninterruptible
/// wait (an fsync on a loaded disk: etcd and PostgreSQL fsync all the time)
/// keeps running meanwhile. `scripts/ha up` run before that sees the server
/// alive, does not restart it, and then waits for it in vain.
pub fn wait_gone(pid: u32) -> HaResult<()> {
    let deadline = std::time::Instant::now() + GONE_WITHIN;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        let dead = state
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'));
        if dead {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(HaError(format!(
                "kill -KILL {pid}: still running after {GONE_WITHIN:?}"
            )));
        }
        sleep(Duration::from_millis(10));
    }
}

/// How long [`wait_gone`] waits for a killed process to exit.
pub const GONE_WITHIN: Duration = Duration::from_secs(30);

/// The first process of `topology` whose role is `role`, asking up to
/// `attempts` times half a second apart (a topology mid-election has none).
pub fn find_role(topology: Topology, role: &str, attempts: u32) -> HaResult<Process> {
    let mut last = Vec::new();
    for _ in 0..attempts.max(1) {
        last = pids(topology)?;
        if let Some(p) = last.iter().find(|p| p.role == role && p.pid.is_some()) {
            return Ok(p.clone());
        }
        sleep(Duration::from_millis(500));
    }
    Err(HaError(format!(
        "no {role} in {} after {attempts} attempts: {last:?}",
        topology.name()
    )))
}

/// How long the waits for a new leader or primary pause between polls: they
/// also time the topology's own failover, so finer than the unavailability
/// the report compares it with.
pub const POLL: Duration = Duration::from_millis(100);

/// Wait (at most `attempts` polls [`POLL`] apart) until `topology`
/// shows `count` processes with `role` (e.g. a new leader, or a replica
/// promoted in place of a killed primary).
pub fn wait_roles(topology: Topology, role: &str, count: usize, attempts: u32) -> HaResult<()> {
    let mut last = Vec::new();
    for _ in 0..attempts.max(1) {
        last = pids(topology)?;
        if last.iter().filter(|p| p.role == role).count() >= count {
            return Ok(());
        }
        sleep(POLL);
    }
    Err(HaError(format!(
        "{} never showed {count} {role}(s) in {attempts} attempts: {last:?}",
        topology.name()
    )))
}

/// `scripts/ha pg-sync on|off`.
pub fn pg_sync(on: bool) -> HaResult<()> {
    ha(&["pg-sync", if on { "on" } else { "off" }]).map(drop)
}

/// `scripts/ha promote-standby`.
pub fn promote_standby() -> HaResult<()> {
    ha(&["promote-standby"]).map(drop)
}

/// `scripts/ha rejoin-old-primary`.
pub fn rejoin_old_primary() -> HaResult<()> {
    ha(&["rejoin-old-primary"]).map(drop)
}

/// The port of the Redis Cluster primary serving the slot of `key`, asked
/// of the cluster through `redis-cli` (any answering node of `ports`).
pub fn redis_cluster_owner(ports: &[u16], key: &str) -> HaResult<u16> {
    for &port in ports {
        let Some(slot) = redis_cli(port, &["cluster", "keyslot", key])
            .and_then(|s| s.trim().parse::<u16>().ok())
        else {
            continue;
        };
        let Some(nodes) = redis_cli(port, &["cluster", "nodes"]) else {
            continue;
        };
        if let Some(owner) = slot_owner(&nodes, slot) {
            return Ok(owner);
        }
    }
    Err(HaError(format!(
        "no Redis Cluster node says who serves {key:?}"
    )))
}

/// The port of the primary the Sentinels among `processes` (role
/// `sentinel`) name for [`SENTINEL_MASTER`]: the first answer, asked with
/// `redis-cli SENTINEL GET-MASTER-ADDR-BY-NAME`.
pub fn sentinel_master(processes: &[Process]) -> Option<u16> {
    processes
        .iter()
        .filter(|p| p.role == "sentinel")
        .find_map(|s| {
            let text = redis_cli(
                s.port,
                &["sentinel", "get-master-addr-by-name", SENTINEL_MASTER],
            )?;
            text.lines().nth(1)?.trim().parse().ok()
        })
}

/// What `redis-cli -p PORT ARGS` printed (3 s at most), when it exited 0.
pub fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("timeout")
        .args(["3", "redis-cli", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The number after `field:` in the `INFO replication` of the Redis server
/// on `port`.
fn replication_offset(port: u16, field: &str) -> Option<u64> {
    let info = redis_cli(port, &["info", "replication"])?;
    info.lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether every Sentinel among `processes` flags the replica on `port` as
/// down (`s_down`), so none of them can promote it.
fn sentinels_see_down(processes: &[Process], port: u16) -> bool {
    let sentinels: Vec<u16> = processes
        .iter()
        .filter(|p| p.role == "sentinel")
        .map(|p| p.port)
        .collect();
    !sentinels.is_empty()
        && sentinels.iter().all(|&sentinel| {
            let Some(text) = redis_cli(sentinel, &["sentinel", "replicas", SENTINEL_MASTER]) else {
                return false;
            };
            // One flat list of field/value lines per replica, each starting at `name`.
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            let (mut this_port, mut down) = (None, false);
            for pair in lines.chunks(2) {
                match pair {
                    ["name", _] => (this_port, down) = (None, false),
                    ["port", p] => this_port = p.parse::<u16>().ok(),
                    ["flags", f] => down = f.split(',').any(|flag| flag == "s_down"),
                    _ => {}
                }
                if this_port == Some(port) && down {
                    return true;
                }
            }
            false
        })
}

/// Leave the Sentinel primary with one live replica: SIGKILL the other
/// (once it is gone), then wait (at most `attempts` polls [`POLL`] apart)
/// until every Sentinel flags it down and the live replica has everything
/// the primary had written when it died. From then on an acknowledgement
/// (`WAIT 1`) can only come from the live replica, and the writes
/// acknowledged before came to it through the primary's stream. Returns
/// the killed replica's port.
pub fn leave_one_replica(attempts: u32) -> HaResult<u16> {
    let processes = pids(Topology::RedisSentinel)?;
    let primary = processes
        .iter()
        .find(|p| p.role == "primary")
        .ok_or_else(|| HaError(format!("no Sentinel primary: {processes:?}")))?;
    let replicas: Vec<&Process> = processes
        .iter()
        .filter(|p| p.role == "replica" && p.pid.is_some())
        .collect();
    let [kept, stopped] = replicas[..] else {
        return Err(HaError(format!("not 2 live replicas: {processes:?}")));
    };
    let pid = stopped.pid.unwrap_or_default();
    signal(pid, "KILL")?;
    wait_gone(pid)?;
    let written = replication_offset(primary.port, "master_repl_offset")
        .ok_or_else(|| HaError(format!("no replication offset from :{}", primary.port)))?;
    for _ in 0..attempts.max(1) {
        let caught_up =
            replication_offset(kept.port, "slave_repl_offset").is_some_and(|o| o >= written);
        if caught_up && sentinels_see_down(&processes, stopped.port) {
            return Ok(stopped.port);
        }
        sleep(POLL);
    }
    Err(HaError(format!(
        "replica :{} never caught up with offset {written}, or the Sentinels never saw :{} down",
        kept.port, stopped.port
    )))
}

/// Wait (at most `attempts` polls [`POLL`] apart) until the Sentinels
/// name a primary other than `old` and that process answers as `primary`;
/// its port.
pub fn wait_sentinel_failover(old: u16, attempts: u32) -> HaResult<u16> {
    let mut last = Vec::new();
    for _ in 0..attempts.max(1) {
        last = pids(Topology::RedisSentinel)?;
        if let Some(port) = sentinel_master(&last).filter(|&port| port != old) {
            if last.iter().any(|p| p.port == port && p.role == "primary") {
                return Ok(port);
            }
        }
        sleep(POLL);
    }
    Err(HaError(format!(
        "the Sentinels never named a primary other than :{old} in {attempts} attempts: {last:?}"
    )))
}

/// Whether the etcd member on `port` says it is the leader, asked with
/// `etcdctl endpoint status` (as `scripts/ha pids` does) with short
/// timeouts.
pub fn etcd_is_leader(port: u16) -> bool {
    let out = Command::new("timeout")
        .args([
            "2",
            "etcdctl",
            "--dial-timeout=500ms",
            "--command-timeout=500ms",
        ])
        .arg(format!("--endpoints=127.0.0.1:{port}"))
        .args(["endpoint", "status", "-w", "simple"])
        .env("ETCDCTL_API", "3")
        .output();
    out.is_ok_and(|out| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|line| line.split(", ").nth(4) == Some("true"))
    })
}

/// Wait (at most `attempts` polls [`POLL`] apart) until one of the etcd
/// members on `ports` says it is the leader; its port. Only those members
/// are asked: `scripts/ha pids` would wait for a paused member's timeout
/// on every poll.
pub fn wait_etcd_leader(ports: &[u16], attempts: u32) -> HaResult<u16> {
    for _ in 0..attempts.max(1) {
        if let Some(&port) = ports.iter().find(|&&port| etcd_is_leader(port)) {
            return Ok(port);
        }
        sleep(POLL);
    }
    Err(HaError(format!(
        "no etcd member of {ports:?} said it was the leader in {attempts} attempts"
    )))
}

/// The port of the live master of `slot` in a `CLUSTER NODES` listing.
pub fn slot_owner(nodes: &str, slot: u16) -> Option<u16> {
    nodes.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = fields.get(2)?;
        if !flags.contains("master") || flags.contains("fail") {
            return None;
        }
        let serves = fields.iter().skip(8).any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
        });
        let port = fields.get(1)?.split('@').next()?.rsplit(':').next()?;
        serves.then(|| port.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The root and its children die together; the root, a child of this
    /// process nobody reaps yet, counts as dead as a zombie.
    #[test]
    fn kill_tree_kills_the_children_too() {
        let mut root = std::process::Command::new("sh")
            .args(["-c", "sleep 100 & sleep 100 & wait"])
            .spawn()
            .unwrap();
        let pid = root.id();
        let mut children = Vec::new();
        for _ in 0..100 {
            let out = Command::new("pgrep")
                .arg("-P")
                .arg(pid.to_string())
                .output()
                .unwrap();
            children = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            if children.len() == 2 {
                break;
            }
            sleep(Duration::from_millis(10));
        }
        assert_eq!(children.len(), 2, "{children:?}");
        kill_tree(pid).unwrap();
        assert!(!root.wait().unwrap().success());
        for child in children {
            // Reparented and reaped by init: gone, or a zombie for a moment.
            let mut gone = false;
            for _ in 0..100 {
                let stat =
                    std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
                if stat.is_empty() || stat.contains(") Z") {
                    gone = true;
                    break;
                }
                sleep(Duration::from_millis(10));
            }
            assert!(gone, "child {child} survived");
        }
    }

    #[test]
    fn pids_and_cluster_nodes_are_parsed() {
        let ps = parse_pids("leader 12 2381\ndown - 2382\nfollower 14 2383\n");
        assert_eq!(ps.len(), 3);
        assert_eq!(ps[1].pid, None);
        assert_eq!(ps[2].port, 2383);
        let nodes = "a 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-5460\n\
                     b 127.0.0.1:7102@17102 master - 0 0 2 connected 5461-10922\n\
                     c 127.0.0.1:7104@17104 slave a 0 0 1 connected\n";
        assert_eq!(slot_owner(nodes, 6000), Some(7102));
        assert_eq!(slot_owner(nodes, 0), Some(7101));
        assert_eq!(slot_owner(nodes, 16000), None);
    }
}
