//! Crash testing of the side-effect gate with real processes and SIGKILL.
//!
//! `coordctl crash-child` (hidden) runs ONE action through
//! [`Runner::execute_with`]; its apply appends the line `KEY\n` to a counter
//! file (O_APPEND + fsync): an external counter, outside coord, like a row
//! written to another system. It announces each point where it can be
//! killed on stderr (`crash-child phase=NAME`) and sleeps there, so the
//! driver can SIGKILL it inside that phase:
//!
//! - `before-apply`: granted (intent + lease stored), in the prepare step,
//!   before the runner's ownership check;
//! - `inside-apply`: the counter file is open, the line not yet written;
//! - `after-apply`: the line is written and fsynced, `complete` not yet sent;
//! - `random`: killed after a random delay from spawn, wherever it is
//!   (startup, acquire, complete, or already finished).
//!
//! `coordctl crash-drive` (hidden; used by `tests/crash.rs`, runnable by
//! hand) repeats, per iteration with a fresh key: spawn a child, SIGKILL it
//! in the chosen phase ([`std::process::Child::kill`]), then run the same
//! key again to completion and settle it:
//!
//! - `Replayed` / `Applied` → done;
//! - `Contended` (the killed child's lease is still live) → wait one TTL
//!   and run again;
//! - `Uncertain` → `coordctl reconcile` as a subprocess, `--applied` when
//!   the counter holds the key's line, `--not-applied` when it does not (the
//!   downstream fact decides, as an operator would), then run again: it
//!   must replay, or apply exactly once.
//!
//! After every step the counter lines of the key must be ≤ 1 (a second
//! line is a double apply), and at the end exactly 1. Anything else is an
//! anomaly and makes the driver exit non-zero.
//!
//! Boundary: this checks the gate across process death, not across store
//! failure (the store itself stays up); the counter file stands for a
//! downstream that does not deduplicate, so only the gate keeps it ≤ 1.

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use coord_adapters::sideeffect::{
    Action, EffectResult, Lease, RetrySafety, Runner, SideEffectAdapter, SideEffectError,
};
use coord_backend::Error;
use serde::{Deserialize, Serialize};

/// The marker a child prints on stderr when it reaches a kill point.
const PHASE_MARKER: &str = "crash-child phase=";

/// Arguments of `coordctl crash-child` (internal).
#[derive(Args)]
pub(crate) struct ChildArgs {
    /// Store URL.
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// The idempotency key.
    #[arg(long)]
    key: String,
    /// The external counter: apply appends `KEY\n` here.
    #[arg(long)]
    counter_file: PathBuf,
    /// The action's resource; default `crash-resource/<KEY>`.
    #[arg(long)]
    resource: Option<String>,
    /// Lease TTL.
    #[arg(long, default_value_t = 300)]
    ttl_ms: u64,
    /// Sleep after the grant, before the ownership check and apply.
    #[arg(long, default_value_t = 0)]
    pause_before_apply_ms: u64,
    /// Sleep inside apply, between opening the counter file and writing.
    #[arg(long, default_value_t = 0)]
    pause_inside_apply_ms: u64,
    /// Sleep after the line is written and fsynced, before complete.
    #[arg(long, default_value_t = 0)]
    pause_after_apply_ms: u64,
    /// Make apply fail after opening the file, writing nothing (the runner
    /// then marks the key uncertain: the outcome is unknown to it).
    #[arg(long)]
    fail_apply: bool,
    /// The action's retry safety. `safe` is WRONG for this effect (the
    /// counter does not deduplicate): it exists to show that the crash test
    /// catches the double applies such a wrong declaration causes.
    #[arg(long, value_parser = parse_retry_safety, default_value = "unknown")]
    retry_safety: RetrySafety,
}

fn parse_retry_safety(text: &str) -> Result<RetrySafety, String> {
    match text {
        "unknown" => Ok(RetrySafety::Unknown),
        "safe" => Ok(RetrySafety::Safe),
        "unsafe" => Ok(RetrySafety::Unsafe),
        other => Err(format!("{other:?}: expected unknown, safe or unsafe")),
    }
}

/// What a child prints on stdout (one JSON line).
#[derive(Debug, Serialize, Deserialize, Clone)]
pub(crate) struct ChildReport {
    key: String,
    /// applied / replayed / contended / uncertain / error
    outcome: String,
    /// The runner refused to apply after its ownership check and abandoned
    /// the attempt (a clean "nothing applied").
    #[serde(default)]
    abandoned: bool,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

fn marker(phase: &str) {
    // stderr is unbuffered: the driver sees the line before the sleep starts.
    eprintln!("{PHASE_MARKER}{phase}");
}

async fn pause(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// The effect: one line appended to the counter file, made durable.
fn append_line(file: &mut std::fs::File, key: &str) -> std::io::Result<()> {
    // One write of a short line on an O_APPEND file: never interleaved.
    file.write_all(format!("{key}\n").as_bytes())?;
    file.sync_all()
}

/// `coordctl crash-child`: one run of one action, outcome as one JSON line.
pub(crate) async fn child(args: ChildArgs) -> Result<ExitCode, Error> {
    if args.ttl_ms == 0 {
        return Err(Error::Config("--ttl-ms must be at least 1".into()));
    }
    let store = coord::connect(&args.store).await?;
    let runner = Runner::new(Arc::new(SideEffectAdapter::new(store)));
    let resource = args
        .resource
        .clone()
        .unwrap_or_else(|| format!("crash-resource/{}", args.key));
    // Unknown (the default): a killed attempt must be reconciled, never
    // silently re-run.
    let action = Action::new(args.key.clone(), resource).with_retry_safety(args.retry_safety);
    let ttl = Duration::from_millis(args.ttl_ms);
    let key = args.key.clone();
    let path = args.counter_file.clone();
    let fail_apply = args.fail_apply;
    let (before, inside, after) = (
        args.pause_before_apply_ms,
        args.pause_inside_apply_ms,
        args.pause_after_apply_ms,
    );
    let ran = runner
        .execute_with(
            &action,
            ttl,
            || async move {
                marker("before-apply");
                pause(before).await;
                Ok::<_, std::io::Error>(())
            },
            |(), lease: Lease| async move {
                let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
                marker("inside-apply");
                pause(inside).await;
                if fail_apply {
                    return Err(std::io::Error::other("injected apply failure"));
                }
                append_line(&mut file, &key)?;
                marker("after-apply");
                pause(after).await;
                Ok::<_, std::io::Error>(EffectResult::from(
                    format!("appended {} @fence {}", key, lease.fence.0).as_bytes(),
                ))
            },
        )
        .await;
    let text = |r: &Option<EffectResult>| {
        r.as_ref()
            .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
    };
    let report = match ran {
        Ok(execution) => ChildReport {
            key: args.key.clone(),
            outcome: execution.outcome.to_string(),
            abandoned: false,
            result: text(&execution.result),
            error: None,
        },
        Err(e) => ChildReport {
            key: args.key.clone(),
            outcome: match e.outcome() {
                Some(outcome) => outcome.to_string(),
                None => "error".into(),
            },
            abandoned: matches!(e, SideEffectError::LeaseLost),
            result: None,
            error: Some(e.to_string()),
        },
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| Error::Config(e.to_string()))?
    );
    Ok(if report.outcome == "error" {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Arguments of `coordctl crash-drive` (internal).
#[derive(Args)]
pub(crate) struct DriveArgs {
    /// Store URL (use a fresh `?namespace=` per run).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Kill iterations (each with a fresh key).
    #[arg(long, default_value_t = 40)]
    iterations: u32,
    /// The external counter file (appended to; default: a temporary file).
    #[arg(long)]
    counter_file: Option<PathBuf>,
    /// Write the per-iteration report (JSON) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Lease TTL of the children.
    #[arg(long, default_value_t = 300)]
    ttl_ms: u64,
    /// Random seed (printed; pass it again to repeat the same kill plan).
    #[arg(long)]
    seed: Option<u64>,
    /// Passed to every child (`safe` deliberately breaks the at-most-once
    /// guarantee for this effect: a self-check of the harness).
    #[arg(long, value_parser = parse_retry_safety, default_value = "unknown")]
    retry_safety: RetrySafety,
}

/// The kill phases, in the order of the summary table.
const PHASES: [&str; 4] = ["before-apply", "inside-apply", "after-apply", "random"];

/// Where a kill can land, in the order of the summary table.
const KILL_POINTS: [&str; 5] = [
    "pre-prepare",
    "before-apply",
    "inside-apply",
    "after-apply",
    "exited",
];

/// The end states, in the order of the summary table.
const END_STATES: [&str; 6] = [
    "replayed",
    "applied-by-rerun",
    "abandoned-then-applied",
    "uncertain-then-applied",
    "uncertain-then-reapplied",
    "anomaly",
];

/// One iteration, as recorded in the report.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub(crate) struct IterationReport {
    /// The iteration's fresh idempotency key.
    pub(crate) key: String,
    /// The kill phase (see [`PHASES`]).
    pub(crate) phase: String,
    /// Pause the child was given in its phase.
    pub(crate) pause_ms: u64,
    /// Delay from the phase marker (from spawn for `random`) to the kill.
    pub(crate) kill_after_ms: u64,
    /// Where the child really was when the kill landed (see [`KILL_POINTS`]):
    /// the last phase marker it printed, `exited` when it had already
    /// finished, `pre-prepare` when it printed none (startup, connect, or
    /// inside the acquire call: the grant may or may not have committed).
    pub(crate) killed_at: String,
    /// The killed child's own report, when it finished first.
    pub(crate) killed_child: Option<ChildReport>,
    /// Outcomes of the following runs, in order (`reconcile:applied` etc. in between).
    pub(crate) steps: Vec<String>,
    /// TTL waits because the killed child's lease was still live.
    pub(crate) ttl_waits: u32,
    /// The highest count of the key's counter lines seen after any step.
    pub(crate) counter_max: u64,
    /// The key's counter lines at the end.
    pub(crate) counter_final: u64,
    /// One of [`END_STATES`].
    pub(crate) end_state: String,
    /// What went wrong, for an anomaly.
    pub(crate) anomaly: Option<String>,
}

/// The whole run, as written to `--report`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DriveReport {
    /// The store URL driven.
    pub(crate) store: String,
    /// The seed of the kill plan.
    pub(crate) seed: u64,
    /// The counter file.
    pub(crate) counter_file: PathBuf,
    /// Lifetime of an unkilled child (calibrates the `random` phase).
    pub(crate) child_millis: u64,
    /// Wall time of the whole run.
    pub(crate) wall_millis: u64,
    /// Keys whose counter ever exceeded 1.
    pub(crate) double_applies: u64,
    /// Iterations that ended in [`END_STATES`] "anomaly".
    pub(crate) anomalies: u64,
    /// Every iteration.
    pub(crate) iterations: Vec<IterationReport>,
}

/// xorshift64*: enough randomness for kill timing, reproducible by seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `lo..hi` (`lo` when empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo)
        }
    }
}

fn config(e: impl std::fmt::Display) -> Error {
    Error::Config(e.to_string())
}

/// Lines equal to `key` in the counter file (0 when it does not exist yet).
fn counter_of(path: &Path, key: &str) -> Result<u64, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(config(format!("cannot read {}: {e}", path.display()))),
    };
    Ok(text.lines().filter(|l| *l == key).count() as u64)
}

struct Driver {
    exe: PathBuf,
    store: String,
    counter_file: PathBuf,
    ttl_ms: u64,
    retry_safety: RetrySafety,
}

/// How a child should pause (the phase decides which pause is long).
#[derive(Default, Clone, Copy)]
struct Pauses {
    before: u64,
    inside: u64,
    after: u64,
}

impl Driver {
    fn child_command(&self, key: &str, pauses: Pauses) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("crash-child")
            .env(crate::STORE_ENV, &self.store)
            .args(["--key", key])
            .arg("--counter-file")
            .arg(&self.counter_file)
            .args(["--ttl-ms", &self.ttl_ms.to_string()])
            .args(["--retry-safety", &self.retry_safety.to_string()])
            .args(["--pause-before-apply-ms", &pauses.before.to_string()])
            .args(["--pause-inside-apply-ms", &pauses.inside.to_string()])
            .args(["--pause-after-apply-ms", &pauses.after.to_string()]);
        cmd
    }

    /// Run a child to completion (no kill); its report.
    fn run_to_end(&self, key: &str) -> Result<ChildReport, String> {
        let out = self
            .child_command(key, Pauses::default())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot start crash-child: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str::<ChildReport>(stdout.trim()).map_err(|e| {
            format!(
                "crash-child gave no report ({e}); status {}, stderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    /// `coordctl reconcile` as an operator would run it.
    fn reconcile(&self, key: &str, applied: bool) -> Result<(), String> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("reconcile")
            .arg(key)
            .env(crate::STORE_ENV, &self.store);
        if applied {
            cmd.args([
                "--applied",
                "--result",
                &format!("appended {key} (reconciled)"),
            ]);
        } else {
            cmd.arg("--not-applied");
        }
        let verdict = if applied { "the line is" } else { "no line is" };
        cmd.args([
            "--reason",
            &format!("crash test: {verdict} in the counter file"),
        ]);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot start coordctl reconcile: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "coordctl reconcile failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Spawn a child that pauses in `phase` and SIGKILL it there.
    fn kill_in_phase(
        &self,
        key: &str,
        phase: &str,
        pauses: Pauses,
        kill_after: Duration,
    ) -> Result<(&'static str, Option<ChildReport>), String> {
        let mut child = self
            .child_command(key, pauses)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start crash-child: {e}"))?;
        let started = Instant::now();
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            let mut tail = String::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(p) = line.strip_prefix(PHASE_MARKER) {
                    let _ = tx.send(p.to_owned());
                } else {
                    tail.push_str(&line);
                    tail.push('\n');
                }
            }
            tail
        });
        let waited = if phase == "random" {
            Ok(Marker::Reached)
        } else {
            wait_for_marker(&rx, phase, &mut child)
        };
        let deadline = match waited {
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                let tail = reader.join().unwrap_or_default();
                return Err(format!("{why}; child stderr: {}", tail.trim()));
            }
            // Nothing left to kill: the iteration goes on as "exited",
            // and settling it checks the counter like any other.
            Ok(Marker::ExitedFirst) => Instant::now(),
            Ok(Marker::Reached) if phase == "random" => started + kill_after,
            Ok(Marker::Reached) => Instant::now() + kill_after,
        };
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        let finished = matches!(child.try_wait(), Ok(Some(_)));
        // SIGKILL on Unix; an already exited child makes this a no-op.
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
        // Every marker printed before death is in the pipe, so after the
        // reader hit EOF the last one names the point the kill landed in.
        let last = rx.try_iter().last();
        let marked = last.as_deref().or(match phase {
            "random" => None,
            reached => Some(reached),
        });
        let killed_at = if finished {
            "exited"
        } else {
            match marked {
                None => "pre-prepare",
                Some(m) => KILL_POINTS
                    .iter()
                    .copied()
                    .find(|p| *p == m)
                    .unwrap_or("pre-prepare"),
            }
        };
        let report = if finished {
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                let _ = stdout.read_to_string(&mut out);
            }
            serde_json::from_str::<ChildReport>(out.trim()).ok()
        } else {
            None
        };
        Ok((killed_at, report))
    }

    /// One iteration: kill, then settle the key; every step checks the counter.
    fn iteration(&self, key: &str, phase: &str, rng: &mut Rng, child_ms: u64) -> IterationReport {
        let ttl = self.ttl_ms;
        let mut pauses = Pauses::default();
        let (pause_ms, kill_after_ms) = match phase {
            "before-apply" => {
                if rng.range(0, 3) == 0 {
                    // Overrun: the pause outlives the lease, so the runner's
                    // ownership check fails and it abandons (if not killed first).
                    let p = ttl + 40;
                    pauses.before = p;
                    (p, rng.range(ttl.saturating_sub(20), p + 80))
                } else {
                    let p = rng.range(20, 60);
                    pauses.before = p;
                    (p, rng.range(0, p))
                }
            }
            "inside-apply" => {
                let p = rng.range(20, 60);
                pauses.inside = p;
                (p, rng.range(0, p))
            }
            "after-apply" => {
                let p = rng.range(20, 60);
                pauses.after = p;
                (p, rng.range(0, p))
            }
            _ => {
                pauses = Pauses {
                    before: 5,
                    inside: 5,
                    after: 5,
                };
                // Over an unkilled child's lifetime and a bit beyond.
                (5, rng.range(0, child_ms + child_ms / 5 + 15))
            }
        };
        let mut it = IterationReport {
            key: key.to_owned(),
            phase: phase.to_owned(),
            pause_ms,
            kill_after_ms,
            killed_at: String::new(),
            killed_child: None,
            steps: Vec::new(),
            ttl_waits: 0,
            counter_max: 0,
            counter_final: 0,
            end_state: "anomaly".into(),
            anomaly: None,
        };
        if let Err(why) = self.settle(&mut it, pauses) {
            it.anomaly = Some(why);
            it.end_state = "anomaly".into();
        }
        it.counter_final = counter_of(&self.counter_file, key).unwrap_or(u64::MAX);
        it.counter_max = it.counter_max.max(it.counter_final);
        if it.anomaly.is_none() && it.counter_final != 1 {
            it.anomaly = Some(format!(
                "settled, but the counter holds {} line(s)",
                it.counter_final
            ));
            it.end_state = "anomaly".into();
        }
        it
    }

    fn check_counter(&self, it: &mut IterationReport) -> Result<u64, String> {
        let n = counter_of(&self.counter_file, &it.key).map_err(|e| e.to_string())?;
        it.counter_max = it.counter_max.max(n);
        if n > 1 {
            return Err(format!("DOUBLE APPLY: {n} counter lines for {}", it.key));
        }
        Ok(n)
    }

    fn settle(&self, it: &mut IterationReport, pauses: Pauses) -> Result<(), String> {
        let (killed_at, report) = self.kill_in_phase(
            &it.key,
            &it.phase,
            pauses,
            Duration::from_millis(it.kill_after_ms),
        )?;
        it.killed_at = killed_at.to_owned();
        let abandoned = report.as_ref().is_some_and(|r| r.abandoned);
        it.killed_child = report;
        self.check_counter(it)?;

        let mut reconciled: Option<bool> = None;
        // Bounded: contended at most a few TTLs, one reconcile, then done.
        for _ in 0..8 {
            let run = self.run_to_end(&it.key)?;
            it.steps.push(run.outcome.clone());
            let counter = self.check_counter(it)?;
            match run.outcome.as_str() {
                "replayed" => {
                    it.end_state = match reconciled {
                        Some(true) => "uncertain-then-applied",
                        Some(false) => {
                            return Err("a key reconciled as not applied replayed".into())
                        }
                        None => "replayed",
                    }
                    .into();
                    return Ok(());
                }
                "applied" => {
                    it.end_state = match reconciled {
                        Some(false) => "uncertain-then-reapplied",
                        Some(true) => {
                            return Err("a key reconciled as applied was applied again".into())
                        }
                        None if abandoned => "abandoned-then-applied",
                        None => "applied-by-rerun",
                    }
                    .into();
                    return Ok(());
                }
                "contended" => {
                    // The killed child's lease is still live: wait it out.
                    it.ttl_waits += 1;
                    std::thread::sleep(Duration::from_millis(self.ttl_ms + 50));
                }
                "uncertain" => {
                    if reconciled.is_some() {
                        return Err("still uncertain after reconciling".into());
                    }
                    let applied = counter == 1;
                    self.reconcile(&it.key, applied)?;
                    it.steps.push(format!(
                        "reconcile:{}",
                        if applied { "applied" } else { "not-applied" }
                    ));
                    reconciled = Some(applied);
                }
                other => {
                    return Err(format!(
                        "rerun ended with {other}: {}",
                        run.error.unwrap_or_default()
                    ))
                }
            }
        }
        Err("the key did not settle".into())
    }
}

/// How a child met the point it was to be killed at.
enum Marker {
    /// It printed the point's marker.
    Reached,
    /// It ended with success before the point, without applying: for one,
    /// a stall on a loaded machine outlived its lease between the grant and
    /// the apply, and it abandoned the action, as it must.
    ExitedFirst,
}

fn wait_for_marker(
    rx: &mpsc::Receiver<String>,
    phase: &str,
    child: &mut Child,
) -> Result<Marker, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok(seen) if seen == phase => return Ok(Marker::Reached),
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() >= deadline {
                    return Err(format!("no {phase} marker within 20 s"));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return match child.wait() {
                    Ok(status) if status.success() => Ok(Marker::ExitedFirst),
                    status => Err(format!(
                        "child exited ({}) before reaching {phase}",
                        status.map(|s| s.to_string()).unwrap_or_default()
                    )),
                };
            }
        }
    }
}

fn print_summary(report: &DriveReport) {
    let mut table: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut waits: HashMap<usize, u64> = HashMap::new();
    let mut planned: BTreeMap<&str, u64> = BTreeMap::new();
    for it in &report.iterations {
        let k = KILL_POINTS
            .iter()
            .position(|p| *p == it.killed_at)
            .unwrap_or(0);
        let e = END_STATES
            .iter()
            .position(|s| *s == it.end_state)
            .unwrap_or(END_STATES.len() - 1);
        *table.entry((k, e)).or_default() += 1;
        *waits.entry(k).or_default() += u64::from(it.ttl_waits > 0);
        *planned.entry(it.phase.as_str()).or_default() += 1;
    }
    println!(
        "crash test on {}: {} iterations, seed {}, child lifetime ~{} ms, wall {:.1} s",
        report.store,
        report.iterations.len(),
        report.seed,
        report.child_millis,
        report.wall_millis as f64 / 1000.0
    );
    let planned: Vec<String> = PHASES
        .iter()
        .map(|p| format!("{p} {}", planned.get(p).copied().unwrap_or(0)))
        .collect();
    println!("planned kill phases: {}", planned.join(", "));
    let short = [
        "replayed",
        "rerun",
        "aband.",
        "unc>appl",
        "unc>reapp",
        "anomaly",
    ];
    print!("{:<13} {:>5}", "killed at", "runs");
    for s in short {
        print!(" {s:>9}");
    }
    println!(" {:>9}", "ttl-wait");
    let mut col_totals = [0u64; END_STATES.len()];
    for (k, point) in KILL_POINTS.iter().enumerate() {
        let row: Vec<u64> = (0..END_STATES.len())
            .map(|e| table.get(&(k, e)).copied().unwrap_or(0))
            .collect();
        print!("{point:<13} {:>5}", row.iter().sum::<u64>());
        for (e, n) in row.iter().enumerate() {
            col_totals[e] += n;
            print!(" {n:>9}");
        }
        println!(" {:>9}", waits.get(&k).copied().unwrap_or(0));
    }
    print!("{:<13} {:>5}", "total", report.iterations.len());
    for n in col_totals {
        print!(" {n:>9}");
    }
    println!();
    println!(
        "killed at: the last phase marker the child printed before dying (pre-prepare = none: \
         startup, connect or acquire; after-apply includes the complete call; exited = it had \
         finished). End states: replayed = the killed child had completed; rerun = the rerun \
         applied at once (nothing of the killed attempt was left: killed before the grant \
         committed, or after its own abandon); aband. = the child reported its abandon (ownership \
         check failed after an overlong prepare); unc>appl / unc>reapp = uncertain, resolved by \
         `coordctl reconcile` as applied / as not applied and then applied once"
    );
    println!(
        "double applies (counter > 1): {}   anomalies: {}",
        report.double_applies, report.anomalies
    );
    for it in report.iterations.iter().filter(|i| i.anomaly.is_some()) {
        println!(
            "  ANOMALY {} ({}): {} steps {:?}",
            it.key,
            it.phase,
            it.anomaly.as_deref().unwrap_or(""),
            it.steps
        );
    }
}

/// Blocking body of `crash-drive` (processes, sleeps, kills).
fn drive_blocking(args: DriveArgs) -> Result<ExitCode, Error> {
    if args.ttl_ms == 0 || args.iterations == 0 {
        return Err(Error::Config(
            "--ttl-ms and --iterations must be at least 1".into(),
        ));
    }
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        nanos ^ u64::from(std::process::id()).rotate_left(32)
    });
    let mut rng = Rng::new(seed);
    let run_id = format!("{:08x}", rng.next() as u32);
    let mut _temp = None;
    let counter_file = match args.counter_file.clone() {
        Some(path) => path,
        None => {
            let dir = std::env::temp_dir().join(format!("coord-crash-{run_id}"));
            std::fs::create_dir_all(&dir).map_err(config)?;
            _temp = Some(TempDir(dir.clone()));
            dir.join("counter.txt")
        }
    };
    let driver = Driver {
        exe: std::env::current_exe().map_err(config)?,
        store: args.store.clone(),
        counter_file: counter_file.clone(),
        ttl_ms: args.ttl_ms,
        retry_safety: args.retry_safety,
    };

    // Calibrate the random phase with one unkilled child.
    let warm_key = format!("crash-{run_id}-warmup");
    let t0 = Instant::now();
    let warm = driver.run_to_end(&warm_key).map_err(config)?;
    let child_millis = t0.elapsed().as_millis() as u64;
    if warm.outcome != "applied" {
        return Err(config(format!("the warm-up run did not apply: {warm:?}")));
    }

    let mut iterations = Vec::new();
    let mut order = PHASES;
    for i in 0..args.iterations {
        // Every block of four kills each phase once, in a random order.
        if i % 4 == 0 {
            for j in (1..order.len()).rev() {
                order.swap(j, rng.range(0, j as u64 + 1) as usize);
            }
        }
        let phase = order[i as usize % 4];
        let key = format!("crash-{run_id}-{i:04}");
        iterations.push(driver.iteration(&key, phase, &mut rng, child_millis));
    }
    let report = DriveReport {
        store: args.store.clone(),
        seed,
        counter_file,
        child_millis,
        wall_millis: started.elapsed().as_millis() as u64,
        double_applies: iterations.iter().filter(|i| i.counter_max > 1).count() as u64,
        anomalies: iterations
            .iter()
            .filter(|i| i.end_state == "anomaly")
            .count() as u64,
        iterations,
    };
    print_summary(&report);
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).map_err(config)?;
        std::fs::write(path, json)
            .map_err(|e| config(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(if report.double_applies == 0 && report.anomalies == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `coordctl crash-drive`: the kill loop on one store, summary table on stdout.
pub(crate) async fn drive(args: DriveArgs) -> Result<ExitCode, Error> {
    tokio::task::spawn_blocking(move || drive_blocking(args))
        .await
        .map_err(config)?
}

/// Removes the run's temporary directory at the end.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
