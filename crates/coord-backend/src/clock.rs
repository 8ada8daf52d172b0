use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where adapters read the time from when they write or judge an expiry.
///
/// Production uses [`SystemClock`]; tests inject a [`ManualClock`] and move it.
/// Instances of one deployment must agree on time within the skew bound the
/// docs state; fencing tokens keep safety independent of clocks, clocks only
/// affect liveness.
pub trait Clock: Send + Sync + Debug {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;

    /// The current time in milliseconds since the Unix epoch (the unit written into records).
    fn now_millis(&self) -> u64 {
        self.now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to: for tests of expiry and takeover.
///
/// ```
/// use coord_backend::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::at_millis(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now_millis(), 3_000);
/// ```
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A clock showing `millis` since the Unix epoch.
    pub fn at_millis(millis: u64) -> Self {
        ManualClock {
            now: Mutex::new(UNIX_EPOCH + Duration::from_millis(millis)),
        }
    }

    /// A clock starting at the current system time.
    pub fn starting_now() -> Self {
        ManualClock {
            now: Mutex::new(SystemTime::now()),
        }
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }

    /// Set the clock to an instant (also backwards: tests of clock jumps).
    pub fn set(&self, to: SystemTime) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}
