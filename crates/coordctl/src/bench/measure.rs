//! The measuring loop shared by `coordctl bench` and coordctl's cargo benches
//! (which include this file with `#[path]`: coordctl has no library target).
//!
//! Contract: every measurement is one caller issuing one operation at a time
//! on a warm client; its budget (a time or a number of calls) is split in
//! slices interleaved with the other measurements of the same comparison, so
//! drifting load on a shared machine hits a subject and its baseline alike.
//! Only the time spent inside the operations is counted. An operation that
//! fails stops the measurement with its error: a number is never reported for
//! work that did not happen.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an operation reports when it could not do its work.
pub(crate) type Failure = String;

/// One operation, boxed so that unlike subjects can be measured side by side.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = Result<(), Failure>> + Send>>;

/// A repeatable operation (a txn, a lock cycle, ...).
pub(crate) type OpFn = Arc<dyn Fn() -> BoxFuture + Send + Sync>;

/// How much of one slice to run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Budget {
    /// Run until this much time has passed (at least one call).
    Time(Duration),
    /// Run exactly this many calls.
    Calls(u64),
}

impl Budget {
    /// The budget of slice `index` of `slices` equal slices of `self`: calls
    /// are spread so that the slices add up to exactly the total.
    pub(crate) fn slice(self, index: u32, slices: u32) -> Budget {
        let slices = slices.max(1);
        match self {
            Budget::Time(total) => Budget::Time(total / slices),
            Budget::Calls(total) => {
                let (each, extra) = (total / u64::from(slices), total % u64::from(slices));
                Budget::Calls(each + u64::from(u64::from(index) < extra))
            }
        }
    }

    /// Whether a slice that started at `started` and made `calls` calls is done.
    pub(crate) fn done(self, started: Instant, calls: u64) -> bool {
        match self {
            Budget::Time(time) => calls > 0 && started.elapsed() >= time,
            Budget::Calls(n) => calls >= n,
        }
    }
}

/// Calls and time of one measurement, summed over its slices.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Operations completed.
    pub(crate) calls: u64,
    /// Time spent inside them.
    pub(crate) busy: Duration,
    /// Store round trips counted by a CAS engine (0 when not counted).
    pub(crate) round_trips: u64,
    /// Txns the store rejected (counted by a CAS engine).
    pub(crate) rejections: u64,
    /// Each call's latency.
    pub(crate) latencies: Vec<Duration>,
}

impl Tally {
    /// Operations per second of busy time.
    pub(crate) fn rate(&self) -> f64 {
        self.calls as f64 / self.busy.as_secs_f64().max(f64::EPSILON)
    }

    /// Mean latency in microseconds.
    pub(crate) fn mean_us(&self) -> f64 {
        self.busy.as_secs_f64() * 1e6 / self.calls.max(1) as f64
    }

    /// 99th percentile latency in microseconds (0 when nothing ran).
    pub(crate) fn p99_us(&mut self) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() as f64) * 0.99).ceil() as usize;
        self.latencies[i.clamp(1, self.latencies.len()) - 1].as_secs_f64() * 1e6
    }

    /// `n` per completed call.
    pub(crate) fn per_call(&self, n: u64) -> f64 {
        n as f64 / self.calls.max(1) as f64
    }

    /// Count one call that took `latency`.
    pub(crate) fn record(&mut self, latency: Duration) {
        self.calls += 1;
        self.busy += latency;
        self.latencies.push(latency);
    }
}

/// Run `op` for one slice of `budget`, adding to `tally`.
pub(crate) async fn run_slice(op: &OpFn, budget: Budget, tally: &mut Tally) -> Result<(), Failure> {
    let started = Instant::now();
    let mut calls = 0;
    while !budget.done(started, calls) {
        let t = Instant::now();
        op().await?;
        tally.record(t.elapsed());
        calls += 1;
    }
    Ok(())
}

/// Measure `ops` side by side: `warmup` calls each, then `slices` rounds in
/// which each op runs one slice of `budget` in turn. `on_slice` is called
/// after every slice (progress). Returns one tally per op, in order.
pub(crate) async fn interleaved(
    ops: &[OpFn],
    budget: Budget,
    slices: u32,
    warmup: u32,
    mut on_slice: impl FnMut(),
) -> Result<Vec<Tally>, Failure> {
    for op in ops {
        for _ in 0..warmup {
            op().await?;
        }
    }
    let mut tallies = vec![Tally::default(); ops.len()];
    for index in 0..slices.max(1) {
        for (op, tally) in ops.iter().zip(tallies.iter_mut()) {
            run_slice(op, budget.slice(index, slices), tally).await?;
            on_slice();
        }
    }
    Ok(tallies)
}

/// Box an async closure into an [`OpFn`].
pub(crate) fn op<F, Fut>(f: F) -> OpFn
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Failure>> + Send + 'static,
{
    Arc::new(move || Box::pin(f()) as BoxFuture)
}
