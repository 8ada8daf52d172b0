//! The metrics the scheduler emits, through the `metrics` facade (a no-op
//! until the program installs a recorder). Documented in docs/operations.md.

/// Counter `coord_scheduler_runs_total{result}`: what this instance did with
/// scheduled slots (manual runs are not counted).
///
/// Counted when a run starts: `ran` (a slot claimed fresh, or a local run)
/// or `takeover` (a slot taken over from a holder whose lease ran out);
/// when a slot is given up: `skipped_late` (too late to start; a batch of
/// late slots skipped without being listed counts once) or
/// `skipped_overlap` (still blocked by a running slot when it became late);
/// and when a run this instance started ends badly: `failed` (the handler
/// failed or timed out; such a run was counted as `ran` or `takeover` too).
pub const SCHEDULER_RUNS_TOTAL: &str = "coord_scheduler_runs_total";

/// Every value of the `result` label of [`SCHEDULER_RUNS_TOTAL`].
pub const SCHEDULER_RESULTS: [&str; 5] = [
    "ran",
    "takeover",
    "skipped_late",
    "skipped_overlap",
    "failed",
];

/// Describe [`SCHEDULER_RUNS_TOTAL`] to the current recorder and register
/// every `result` at 0, so an exporter shows them before the first run.
pub fn describe() {
    metrics::describe_counter!(
        SCHEDULER_RUNS_TOTAL,
        "Scheduled slots this instance started (ran, takeover), skipped (skipped_late, skipped_overlap), or whose run failed (failed)"
    );
    for result in SCHEDULER_RESULTS {
        metrics::counter!(SCHEDULER_RUNS_TOTAL, "result" => result).increment(0);
    }
}

pub(crate) fn run(result: &'static str) {
    metrics::counter!(SCHEDULER_RUNS_TOTAL, "result" => result).increment(1);
}
