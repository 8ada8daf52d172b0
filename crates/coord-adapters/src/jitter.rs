//! Backoff jitter: random by default; a deterministic simulation seeds it.
//!
//! Backoffs are randomised so that contending clients spread out. A
//! simulation that replays a run from its seed needs those draws to repeat,
//! so a thread may swap the random source for a seeded one. The swap is per
//! thread on purpose: it only makes sense on a current-thread runtime, where
//! every task of the run draws from the same thread in a fixed order.

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// A uniform draw in `[0, 1)` for a backoff.
pub(crate) fn unit() -> f64 {
    SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
        Some(rng) => rng.random(),
        None => rand::random(),
    })
}

/// A uniform draw in `[lo, hi]` (`lo` when `hi <= lo`), for a backoff
/// whose randomness must replay under a seeded simulation.
pub fn uniform(lo: std::time::Duration, hi: std::time::Duration) -> std::time::Duration {
    match hi.checked_sub(lo) {
        Some(span) if !span.is_zero() => lo + span.mul_f64(unit()),
        _ => lo,
    }
}

/// Make this thread's backoff jitter the sequence seeded by `seed`
/// (`None`: random again). For deterministic simulations on a
/// current-thread runtime; production code never needs it.
pub fn seed_thread_jitter(seed: Option<u64>) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(StdRng::seed_from_u64));
}
