//! Seeded fault injection for any [`Backend`]: one decorator, [`FaultyBackend`],
//! whose rules decide which calls fail and how.
//!
//! The faults are the ones a networked store really produces (see
//! docs/shapes.md, "Fault model"):
//!
//! | [`Fault`] | the caller sees | the store |
//! | --- | --- | --- |
//! | [`Fault::Refuse`] | `Unavailable` | nothing applied |
//! | [`Fault::LoseReply`] | `Indeterminate` | applied |
//! | [`Fault::LateCommit`] | `Indeterminate` | applied *later*, after the next calls through this wrapper (e.g. the caller's own re-read) |
//! | [`Fault::Drop`] | `Indeterminate` | never applied |
//! | [`Fault::Hang`] | no answer, ever | never applied |
//! | [`Fault::Delay`] | the real answer, late | applied after the delay |
//! | [`Fault::Pause`] | the real answer, once resumed | applied after [`FaultyBackend::resume`] |
//!
//! Rules pick calls by [`Target`] (reads, txns, txns that write) and fire
//! once on the n-th matching call, on every call, or with a probability
//! drawn from the wrapper's seeded generator, so the same seed and the same
//! sequence of calls give the same faults. [`FaultyBackend::pause`] holds
//! every new call until [`FaultyBackend::resume`] (a stopped process, or a
//! partition seen from the caller). Every fault that fires is logged
//! ([`FaultyBackend::events`]) so a failing run can print what happened.
//!
//! ```
//! use std::sync::Arc;
//! use coord_backend::{Assert, Backend, BackendExt, Mutation};
//! use coord_conformance::faults::{Fault, FaultyBackend, Target};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("doc").unwrap());
//! let faulty = FaultyBackend::new(store.clone(), 7);
//! // The next txn that writes is answered "indeterminate" and lands after the caller's next call.
//! faulty.once(Target::WritingTxn, Fault::LateCommit { after_calls: 1 });
//! let lost = faulty.txn(&[Assert::missing("k")], &[Mutation::put("k", b"v".to_vec())]).await;
//! assert!(lost.unwrap_err().is_indeterminate());
//! assert!(!faulty.get("k").await.unwrap().exists()); // the re-read sees nothing yet...
//! assert!(store.get("k").await.unwrap().exists());   // ...and right after it, the txn landed
//! # });
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::lock::async_trait;
use coord_backend::{Assert, Backend, Entry, Error, Limits, Mutation, TxnOutcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;

/// What happens to a call a rule picked.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails before reaching the store: `Unavailable`, nothing applied.
    Refuse,
    /// The store applies the call, its answer is lost: `Indeterminate`.
    LoseReply,
    /// The answer is lost at once (`Indeterminate`) and the txn is applied
    /// only after `after_calls` further calls through this wrapper have
    /// completed (0: just before the next call reaches the store; 1: right
    /// after the caller's next read or resend), the way a server finishes a
    /// transaction after its client gave up. On a read, the same as
    /// [`Fault::Drop`].
    LateCommit {
        /// Calls to complete before the held-back txn is applied.
        after_calls: u32,
    },
    /// `Indeterminate`, and the call is never applied.
    Drop,
    /// The call never answers (its future stays pending) and never applies:
    /// a write partition where requests hang. Callers need their own timeout.
    Hang,
    /// The call is forwarded after this long, and answered normally.
    Delay(Duration),
    /// The wrapper pauses at this call (as [`FaultyBackend::pause`], a
    /// process stopped right before sending it): the call and every later
    /// one wait for [`FaultyBackend::resume`], then go on normally. Lets a
    /// check change the store inside a decision's read-decide-commit window.
    Pause,
}

/// Which calls a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Every call.
    Any,
    /// `snapshot` and `keys`.
    Read,
    /// Every `txn`, assert-only ones included.
    Txn,
    /// A `txn` with at least one mutation.
    WritingTxn,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Read,
    AssertOnly,
    Writing,
}

impl Target {
    fn matches(self, call: Call) -> bool {
        match self {
            Target::Any => true,
            Target::Read => call == Call::Read,
            Target::Txn => call != Call::Read,
            Target::WritingTxn => call == Call::Writing,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Fires on the n-th matching call from now (1 = the next), then retires.
    Nth(u64),
    Always,
    Probability(f64),
}

#[derive(Clone, Copy, Debug)]
struct Rule {
    target: Target,
    trigger: Trigger,
    fault: Fault,
}

struct Deferred {
    calls_left: u32,
    asserts: Vec<Assert>,
    mutations: Vec<Mutation>,
}

struct State {
    rng: StdRng,
    rules: Vec<Rule>,
    deferred: Vec<Deferred>,
    events: VecDeque<String>,
    calls: u64,
}

/// Events kept for [`FaultyBackend::events`] (older ones are dropped).
const EVENTS_KEPT: usize = 4096;

/// An on/off switch that tasks wait on while it is on: a process's pause.
/// Switched off, it wakes its waiters in the order they began to wait.
/// (tokio's `watch` channel wakes them in a random order, which made a
/// seeded simulation run now and then differ from its replay.)
#[derive(Debug, Default)]
pub struct PauseSwitch {
    on: AtomicBool,
    switched_off: Notify,
}

impl PauseSwitch {
    /// Switch on (new waits wait) or off (every waiter goes on).
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
        if !on {
            self.switched_off.notify_waiters();
        }
    }

    /// Whether the switch is on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Return once the switch is off (at once when it is).
    pub async fn wait_off(&self) {
        loop {
            // Registered before the check, so a switch-off in between is not missed.
            let notified = self.switched_off.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_on() {
                return;
            }
            notified.await;
        }
    }
}

/// A [`Backend`] decorator that injects seeded faults; see the [module docs](self).
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    label: String,
    state: Mutex<State>,
    paused: PauseSwitch,
    fired: AtomicU64,
    /// Calls answered `Indeterminate` whose txn applied or may still apply.
    answered_in_doubt: AtomicU64,
    /// Calls begun and not yet answered (or dropped).
    in_flight: AtomicU64,
}

impl fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("inner", &self.inner)
            .field("label", &self.label)
            .field("fired", &self.fired.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl FaultyBackend {
    /// Wrap `inner`; random rules draw from a generator seeded with `seed`.
    pub fn new(inner: Arc<dyn Backend>, seed: u64) -> Self {
        FaultyBackend {
            inner,
            label: String::new(),
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                rules: Vec::new(),
                deferred: Vec::new(),
                events: VecDeque::new(),
                calls: 0,
            }),
            paused: PauseSwitch::default(),
            fired: AtomicU64::new(0),
            answered_in_doubt: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }

    /// Name this wrapper in its events (e.g. the instance it belongs to).
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// The wrapped backend (calls to it bypass every fault).
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, target: Target, trigger: Trigger, fault: Fault) {
        self.state().rules.push(Rule {
            target,
            trigger,
            fault,
        });
    }

    /// `fault` on the next call matching `target`, once.
    pub fn once(&self, target: Target, fault: Fault) {
        self.nth(target, 1, fault);
    }

    /// `fault` on the `n`-th call matching `target` from now (1 = the next), once.
    pub fn nth(&self, target: Target, n: u64, fault: Fault) {
        self.add(target, Trigger::Nth(n.max(1)), fault);
    }

    /// `fault` on every call matching `target` until [`FaultyBackend::heal`].
    pub fn always(&self, target: Target, fault: Fault) {
        self.add(target, Trigger::Always, fault);
    }

    /// `fault` on each call matching `target` with probability `p` (seeded).
    pub fn sometimes(&self, target: Target, p: f64, fault: Fault) {
        self.add(target, Trigger::Probability(p.clamp(0.0, 1.0)), fault);
    }

    /// Remove every rule (held-back txns stay held back; see [`FaultyBackend::flush`]).
    pub fn heal(&self) {
        self.state().rules.clear();
    }

    /// Hold every new call until [`FaultyBackend::resume`] (calls already in the store finish).
    pub fn pause(&self) {
        self.paused.set(true);
        self.log("paused".into());
    }

    /// Let held calls through again.
    pub fn resume(&self) {
        self.paused.set(false);
        self.log("resumed".into());
    }

    /// Whether calls are held.
    pub fn is_paused(&self) -> bool {
        self.paused.is_on()
    }

    /// Whether a call through this wrapper may still change the store: one
    /// is under way (begun, not answered or dropped), or a txn is held back.
    /// A caller that drops its future while this is false changed nothing
    /// it did not already learn of.
    pub fn outcome_pending(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) > 0 || !self.state().deferred.is_empty()
    }

    /// How many calls so far were answered `Indeterminate` while their txn
    /// applied or may still apply ([`Fault::LoseReply`], [`Fault::LateCommit`]).
    /// A caller that drops a future between calls after this moved during
    /// the future's life cannot know what it left behind: the engine may
    /// have been settling that doubt (backing off before a resend) when
    /// it was dropped. See [`FaultyBackend::drop_leaves_doubt`].
    pub fn answered_in_doubt(&self) -> u64 {
        self.answered_in_doubt.load(Ordering::SeqCst)
    }

    /// Whether dropping a future that began when
    /// [`answered_in_doubt`](Self::answered_in_doubt) was `before` may leave
    /// a change nobody learned of: a call is under way or held back, or one
    /// of its calls was answered in doubt.
    pub fn drop_leaves_doubt(&self, before: u64) -> bool {
        self.outcome_pending() || self.answered_in_doubt() > before
    }

    /// How many faults fired so far.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// How many txns are held back by [`Fault::LateCommit`] and not applied yet.
    pub fn held_back(&self) -> usize {
        self.state().deferred.len()
    }

    /// Apply every held-back txn now (each as the store judges it: one whose
    /// asserts no longer hold is rejected, as it would be on the server).
    pub async fn flush(&self) {
        let due = std::mem::take(&mut self.state().deferred);
        for txn in due {
            self.apply_deferred(txn).await;
        }
    }

    /// The faults fired and late commits applied, oldest first (at most the
    /// last 4,096), each prefixed with the call number.
    pub fn events(&self) -> Vec<String> {
        self.state().events.iter().cloned().collect()
    }

    fn log(&self, event: String) {
        let mut state = self.state();
        let line = format!("{}#{} {event}", self.label, state.calls);
        if state.events.len() == EVENTS_KEPT {
            state.events.pop_front();
        }
        state.events.push_back(line);
    }

    /// The fault for this call, if any rule fires (rules are tried in order).
    fn pick(&self, call: Call) -> Option<Fault> {
        let mut state = self.state();
        state.calls += 1;
        let mut fault = None;
        let mut retire = None;
        let State { rng, rules, .. } = &mut *state;
        for (i, rule) in rules.iter_mut().enumerate() {
            if !rule.target.matches(call) {
                continue;
            }
            let fires = match &mut rule.trigger {
                Trigger::Always => true,
                Trigger::Probability(p) => rng.random_bool(*p),
                Trigger::Nth(n) => {
                    *n -= 1;
                    if *n == 0 {
                        retire = Some(i);
                    }
                    *n == 0
                }
            };
            if fires {
                fault = Some(rule.fault);
                break;
            }
        }
        if let Some(i) = retire {
            state.rules.remove(i);
        }
        fault
    }

    async fn wait_unpaused(&self) {
        self.paused.wait_off().await;
    }

    /// After a call completed at the store: count it against every
    /// held-back txn and apply those that are due.
    async fn after_call(&self) {
        for d in &mut self.state().deferred {
            d.calls_left = d.calls_left.saturating_sub(1);
        }
        self.apply_due().await;
    }

    /// Apply the held-back txns with no calls left to wait for.
    async fn apply_due(&self) {
        let due: Vec<Deferred> = {
            let mut state = self.state();
            if state.deferred.is_empty() {
                return;
            }
            let (due, kept) = std::mem::take(&mut state.deferred)
                .into_iter()
                .partition(|d| d.calls_left == 0);
            state.deferred = kept;
            due
        };
        for txn in due {
            self.apply_deferred(txn).await;
        }
    }

    async fn apply_deferred(&self, txn: Deferred) {
        let outcome = self.inner.raw_txn(&txn.asserts, &txn.mutations).await;
        let what = match outcome {
            Ok(o) if o.applied => "applied".to_owned(),
            Ok(_) => "rejected".to_owned(),
            Err(e) => format!("failed: {e}"),
        };
        self.log(format!("late commit {what}"));
    }

    fn fire(&self, fault: Fault, what: &str) {
        self.fired.fetch_add(1, Ordering::Relaxed);
        self.log(format!("{fault:?} on {what}"));
    }

    /// Run a call through the fault picked for it. `apply` is the real call;
    /// `defer` turns it into a held-back txn (reads cannot be held back).
    async fn run<T, F, Fut>(
        &self,
        call: Call,
        what: &str,
        apply: F,
        defer: Option<Deferred>,
    ) -> coord_backend::Result<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = coord_backend::Result<T>>,
    {
        // Counted until answered, or until the caller drops this future.
        struct InFlight<'a>(&'a AtomicU64);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight(&self.in_flight);
        self.wait_unpaused().await;
        self.apply_due().await;
        let fault = self.pick(call);
        if let Some(fault) = fault {
            self.fire(fault, what);
        }
        let result = match fault {
            None => apply().await,
            Some(Fault::Refuse) => Err(Error::Unavailable {
                message: "injected: refused before reaching the store".into(),
                source: None,
            }),
            Some(Fault::LoseReply) => {
                let _ = apply().await;
                self.answered_in_doubt.fetch_add(1, Ordering::SeqCst);
                Err(lost("injected: applied, reply lost"))
            }
            Some(Fault::LateCommit { after_calls }) => {
                if let Some(mut txn) = defer {
                    txn.calls_left = after_calls;
                    self.state().deferred.push(txn);
                    self.answered_in_doubt.fetch_add(1, Ordering::SeqCst);
                }
                // Not counted as a completed call: the held-back txn waits for later ones.
                return Err(lost("injected: reply lost, the txn lands later"));
            }
            Some(Fault::Drop) => Err(lost("injected: request lost, never applied")),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Delay(by)) => {
                tokio::time::sleep(by).await;
                apply().await
            }
            Some(Fault::Pause) => {
                self.pause();
                self.wait_unpaused().await;
                apply().await
            }
        };
        self.after_call().await;
        result
    }
}

fn lost(message: &str) -> Error {
    Error::Indeterminate {
        message: message.to_owned(),
        source: None,
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn store_name(&self) -> &'static str {
        self.inner.store_name()
    }

    // Wake-ups pass through untouched: faults act on the three primitives.
    fn changes(&self) -> Option<&dyn coord_backend::Changes> {
        self.inner.changes()
    }

    // Faults act between the checked calls and the store: input is checked
    // once, by the provided methods, before any fault is drawn.
    async fn raw_snapshot(&self, keys: &[&str]) -> coord_backend::Result<Vec<Entry>> {
        self.run(
            Call::Read,
            "snapshot",
            || self.inner.raw_snapshot(keys),
            None,
        )
        .await
    }

    async fn raw_txn(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<TxnOutcome> {
        let call = if mutations.is_empty() {
            Call::AssertOnly
        } else {
            Call::Writing
        };
        let defer = Deferred {
            calls_left: 1,
            asserts: asserts.to_vec(),
            mutations: mutations.to_vec(),
        };
        self.run(
            call,
            "txn",
            || self.inner.raw_txn(asserts, mutations),
            Some(defer),
        )
        .await
    }

    async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.run(Call::Read, "keys", || self.inner.raw_keys(prefix), None)
            .await
    }

    async fn raw_first_keys(
        &self,
        prefix: &str,
        limit: usize,
    ) -> coord_backend::Result<Vec<String>> {
        self.run(
            Call::Read,
            "keys",
            || self.inner.raw_first_keys(prefix, limit),
            None,
        )
        .await
    }

    // Maintenance, not one of the faulted primitives: passed through.
    async fn reclaim(
        &self,
        options: &coord_backend::ReclaimOptions,
    ) -> coord_backend::Result<coord_backend::Reclaimed> {
        self.inner.reclaim(options).await
    }
}
