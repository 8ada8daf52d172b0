//! When a job's slots are: fixed intervals and cron expressions with time zones.
//!
//! A **slot** is the scheduled instant in UTC milliseconds since the Unix
//! epoch. Every instance computes the same slots from the same schedule, so
//! `(job, slot)` names one run cluster-wide; the local clock only decides
//! *when* an instance looks at a slot, never *which* slot it is.
//!
//! - **Intervals** (`every 30s`) are aligned to the Unix epoch: the slots of
//!   `every 5m` are the multiples of 300 000 ms, whenever an instance started.
//! - **Cron** expressions have 6 or 7 fields (`sec min hour day month weekday
//!   [year]`, the [`cron`] crate's syntax, `@daily` etc. too); a 5-field
//!   expression is read as standard cron with `0` seconds. They are evaluated
//!   in an IANA time zone (default UTC).
//!
//! # Daylight saving time (policy)
//!
//! Cron fields describe wall-clock times; slots are instants. Where the two
//! do not map one to one:
//!
//! - **Fall back** (a wall time occurs twice, e.g. 01:30 on the first Sunday
//!   of November in `America/New_York`): a job whose hour field is fixed
//!   (`0 30 1 * * *`) fires **once**, at the first occurrence (the
//!   daylight-time instant). A job whose hour field is `*` runs hourly or more
//!   often, so it fires at both instants: they are an hour apart in real time.
//! - **Spring forward** (wall times that do not exist, e.g. 02:30 on the
//!   second Sunday of March in New York): a fixed-hour job fires once at the
//!   first instant after the gap (03:00 EDT), so a daily job never silently
//!   skips a day; several times in one gap collapse into that one slot. A
//!   job whose hour field is `*` simply has no slots in the gap (no real time
//!   passed there).
//!
//! Each distinct instant is one slot, and slots strictly increase, so no
//! calendar quirk can make one instant fire twice. The policy assumes a zone
//! changes its UTC offset by at most 3 hours at a time (true of every zone in
//! the tz database since 1970).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use cron::TimeUnitSpec;

use crate::Error;

/// Largest offset change the DST policy accounts for.
const MAX_OFFSET_STEP_SECS: i64 = 3 * 3600;
/// Safety bound on cron candidates examined for one `next_after`.
const MAX_CANDIDATES: usize = 200_000;

/// When a job runs. Cheap to clone.
///
/// ```
/// use coord_scheduler::Schedule;
///
/// let every = Schedule::parse("every 5m", None).unwrap();
/// assert_eq!(every.next_after(1), Some(300_000));
///
/// let nightly = Schedule::parse("0 30 1 * * *", Some("America/New_York")).unwrap();
/// // 2025-11-02 is the fall-back day in New York: 01:30 happens twice,
/// // the job fires once (at 01:30 EDT = 05:30 UTC), then 06:30 UTC next day.
/// let nov_2_0000_utc = 1_762_041_600_000;
/// let first = nightly.next_after(nov_2_0000_utc).unwrap();
/// assert_eq!(first, nov_2_0000_utc + 5 * 3_600_000 + 1_800_000);
/// assert_eq!(nightly.next_after(first).unwrap(), first + 25 * 3_600_000);
/// ```
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
    source: String,
}

#[derive(Clone)]
enum Kind {
    Interval {
        period_ms: u64,
    },
    Cron {
        expr: Box<cron::Schedule>,
        tz: Tz,
        /// The hour field matches every hour: the job runs hourly or more often.
        every_hour: bool,
    },
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Interval { .. } => write!(f, "Schedule({:?})", self.source),
            Kind::Cron { tz, .. } => write!(f, "Schedule({:?} in {})", self.source, tz.name()),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Interval { .. } => f.write_str(&self.source),
            Kind::Cron { tz, .. } => write!(f, "{} ({})", self.source, tz.name()),
        }
    }
}

impl Schedule {
    /// Slots every `period`, aligned to the Unix epoch (at least 1 ms).
    pub fn every(period: Duration) -> Result<Self, Error> {
        let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
        if period_ms == 0 {
            return Err(Error::InvalidSchedule {
                schedule: format!("{period:?}"),
                reason: "an interval must be at least 1 ms".into(),
            });
        }
        Ok(Schedule {
            kind: Kind::Interval { period_ms },
            source: format!("every {}", format_duration(period)),
        })
    }

    /// A cron expression evaluated in UTC.
    pub fn cron(expression: &str) -> Result<Self, Error> {
        Self::cron_in(expression, Tz::UTC)
    }

    /// A cron expression evaluated in the time zone `tz` (see the module's DST policy).
    pub fn cron_in(expression: &str, tz: Tz) -> Result<Self, Error> {
        let trimmed = expression.trim();
        let fields = trimmed.split_whitespace().count();
        // Standard 5-field cron has no seconds: run at second 0.
        let full = if fields == 5 && !trimmed.starts_with('@') {
            format!("0 {trimmed}")
        } else {
            trimmed.to_owned()
        };
        let expr = cron::Schedule::from_str(&full).map_err(|e| Error::InvalidSchedule {
            schedule: expression.to_owned(),
            reason: e.to_string(),
        })?;
        let every_hour = expr.hours().is_all();
        Ok(Schedule {
            kind: Kind::Cron {
                expr: Box::new(expr),
                tz,
                every_hour,
            },
            source: trimmed.to_owned(),
        })
    }

    /// Parse `every <duration>` (e.g. `every 1s`, `every 1h30m`) or a cron
    /// expression in `time_zone` (an IANA name such as `Europe/Paris`; default UTC).
    /// A time zone given with an interval is refused: intervals are zone-free.
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Self, Error> {
        let trimmed = schedule.trim();
        if let Some(rest) = trimmed.strip_prefix("every ") {
            if let Some(tz) = time_zone {
                return Err(Error::InvalidSchedule {
                    schedule: schedule.to_owned(),
                    reason: format!("time zone {tz:?} given for an interval (intervals are aligned to the Unix epoch)"),
                });
            }
            let period = parse_duration(rest).map_err(|reason| Error::InvalidSchedule {
                schedule: schedule.to_owned(),
                reason,
            })?;
            return Self::every(period);
        }
        let tz = match time_zone {
            None => Tz::UTC,
            Some(name) => parse_time_zone(name).map_err(|reason| Error::InvalidSchedule {
                schedule: schedule.to_owned(),
                reason,
            })?,
        };
        Self::cron_in(trimmed, tz)
    }

    /// The schedule as written (`every 5m`, or the cron expression).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The time zone of a cron schedule (`None` for intervals).
    pub fn time_zone(&self) -> Option<Tz> {
        match &self.kind {
            Kind::Interval { .. } => None,
            Kind::Cron { tz, .. } => Some(*tz),
        }
    }

    /// The first slot strictly after `after_ms` (UTC milliseconds), or `None`
    /// when the schedule has no more slots.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        match &self.kind {
            Kind::Interval { period_ms } => (after_ms / period_ms)
                .checked_add(1)
                .and_then(|n| n.checked_mul(*period_ms)),
            Kind::Cron {
                expr,
                tz,
                every_hour,
            } => cron_next_after(expr, *tz, *every_hour, after_ms),
        }
    }

    /// The first slot at or after `at_ms`.
    pub fn next_at_or_after(&self, at_ms: u64) -> Option<u64> {
        // Slot 0 (the epoch itself) is never produced: no job runs in 1970.
        self.next_after(at_ms.saturating_sub(1))
    }

    /// Every slot in `[from_ms, to_ms)`, in order (for previews and tests).
    pub fn slots_between(&self, from_ms: u64, to_ms: u64) -> Vec<u64> {
        let mut slots = Vec::new();
        let mut next = self.next_at_or_after(from_ms);
        while let Some(slot) = next {
            if slot >= to_ms {
                break;
            }
            slots.push(slot);
            next = self.next_after(slot);
        }
        slots
    }
}

fn cron_next_after(expr: &cron::Schedule, tz: Tz, every_hour: bool, after_ms: u64) -> Option<u64> {
    let after_ms = i64::try_from(after_ms).ok()?;
    let after = Utc.timestamp_millis_opt(after_ms).single()?;
    let local_after = after.with_timezone(&tz).naive_local();
    // Wall times before `local_after` can only map to later instants when the
    // clock is set back soon after `after`; look back only then.
    let offset_now = tz.offset_from_utc_datetime(&after.naive_utc()).fix();
    let later = after + chrono::Duration::seconds(MAX_OFFSET_STEP_SECS);
    let offset_later = tz.offset_from_utc_datetime(&later.naive_utc()).fix();
    let start = if offset_now == offset_later {
        local_after
    } else {
        local_after - chrono::Duration::seconds(MAX_OFFSET_STEP_SECS)
    };
    // Iterate wall times with UTC as a zone without DST: `naive_utc()` of each
    // candidate is the wall time in `tz`. Cron works in whole seconds, so
    // start from the second that contains `start`.
    let start_utc = Utc.from_utc_datetime(&start) - chrono::Duration::milliseconds(1);
    let mut best: Option<DateTime<Utc>> = None;
    for (examined, candidate) in expr.after(&start_utc).enumerate() {
        if examined >= MAX_CANDIDATES {
            break;
        }
        let wall = candidate.naive_utc();
        if let Some(best) = best {
            let best_wall = best.with_timezone(&tz).naive_local();
            if wall > best_wall + chrono::Duration::seconds(MAX_OFFSET_STEP_SECS) {
                break;
            }
        }
        for instant in instants_for(tz, every_hour, wall) {
            let better = match best {
                None => true,
                Some(b) => instant < b,
            };
            if instant > after && better {
                best = Some(instant);
            }
        }
    }
    best.and_then(|b| u64::try_from(b.timestamp_millis()).ok())
}

/// The instants one matching wall time stands for, under the DST policy.
fn instants_for(tz: Tz, every_hour: bool, wall: NaiveDateTime) -> Vec<DateTime<Utc>> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(t) => vec![t.with_timezone(&Utc)],
        LocalResult::Ambiguous(earlier, later) if every_hour => {
            vec![earlier.with_timezone(&Utc), later.with_timezone(&Utc)]
        }
        LocalResult::Ambiguous(earlier, _) => vec![earlier.with_timezone(&Utc)],
        LocalResult::None if every_hour => Vec::new(),
        LocalResult::None => gap_end(tz, wall).into_iter().collect(),
    }
}

/// The first instant after the spring-forward gap containing `wall`.
fn gap_end(tz: Tz, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
    // Find the first existing wall minute after the gap.
    let mut probe = wall;
    let mut found = None;
    for _ in 0..(MAX_OFFSET_STEP_SECS / 60 + 2) {
        probe += chrono::Duration::minutes(1);
        if let Some(t) = tz.from_local_datetime(&probe).earliest() {
            found = Some(t.with_timezone(&Utc));
            break;
        }
    }
    let mut end = found?;
    // Transitions are on whole minutes in practice; refine to the second anyway.
    let post_offset = tz.offset_from_utc_datetime(&end.naive_utc()).fix();
    for _ in 0..60 {
        let earlier = end - chrono::Duration::seconds(1);
        if tz.offset_from_utc_datetime(&earlier.naive_utc()).fix() != post_offset {
            break;
        }
        end = earlier;
    }
    Some(end)
}

/// Parse an IANA time zone name (`UTC`, `Europe/Paris`, `America/New_York`).
pub fn parse_time_zone(name: &str) -> Result<Tz, String> {
    name.trim()
        .parse::<Tz>()
        .map_err(|_| format!("unknown time zone {name:?} (use an IANA name such as Europe/Paris)"))
}

/// Parse a duration such as `500ms`, `30s`, `5m`, `1h30m`, `1h 30m`, `2d`
/// (the `humantime` crate's syntax, which also reads `5min`, `2days`, `1week`).
///
/// ```
/// use coord_scheduler::parse_duration;
/// use std::time::Duration;
///
/// assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
/// assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
/// assert!(parse_duration("5 parsecs").is_err());
/// assert!(parse_duration("30").is_err()); // a unit is required
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty duration".into());
    }
    humantime::parse_duration(trimmed)
        .map_err(|e| format!("duration {text:?}: {e} (write e.g. 500ms, 30s, 5m, 1h30m, 2d)"))
}

/// Format a duration the way [`parse_duration`] reads it (`1h 30m`).
pub(crate) fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// The deterministic jitter of one `(job, slot)`: the same on every instance,
/// spread uniformly over `[0, max]` (FNV-1a of the job name and the slot).
///
/// ```
/// use coord_scheduler::jitter_for;
/// use std::time::Duration;
///
/// let a = jitter_for("report", 60_000, Duration::from_secs(5));
/// assert_eq!(a, jitter_for("report", 60_000, Duration::from_secs(5)));
/// assert!(a <= 5_000);
/// assert_eq!(jitter_for("report", 60_000, Duration::ZERO), 0);
/// ```
pub fn jitter_for(job: &str, slot: u64, max: Duration) -> u64 {
    let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    if max_ms == 0 {
        return 0;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in job.bytes().chain([0xff]).chain(slot.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // One more avalanche round so consecutive slots spread out.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash % max_ms.saturating_add(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> u64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .unwrap()
            .timestamp_millis() as u64
    }

    #[test]
    fn intervals_are_epoch_aligned() {
        let s = Schedule::parse("every 1s", None).unwrap();
        assert_eq!(s.next_after(0), Some(1_000));
        assert_eq!(s.next_after(1_999), Some(2_000));
        assert_eq!(s.next_after(2_000), Some(3_000));
        assert_eq!(s.slots_between(1_000, 4_000), vec![1_000, 2_000, 3_000]);
        assert!(Schedule::parse("every 0s", None).is_err());
        assert!(Schedule::parse("every 1s", Some("UTC")).is_err());
        assert!(Schedule::parse("every soon", None).is_err());
    }

    #[test]
    fn cron_with_seconds_and_five_fields() {
        let s = Schedule::parse("*/5 * * * * *", None).unwrap();
        assert_eq!(s.next_after(1_000), Some(5_000));
        assert_eq!(s.next_after(5_000), Some(10_000));
        let five = Schedule::parse("*/15 * * * *", None).unwrap();
        assert_eq!(five.next_after(0), Some(15 * 60_000));
        assert!(Schedule::parse("61 * * * * *", None).is_err());
        assert!(Schedule::parse("0 0 * * * *", Some("Mars/Olympus")).is_err());
    }

    #[test]
    fn fall_back_fixed_hour_fires_once() {
        // 2025-11-02: New York falls back from EDT (-4) to EST (-5) at 06:00 UTC.
        let s = Schedule::parse("0 30 1 * * *", Some("America/New_York")).unwrap();
        let slots = s.slots_between(utc(2025, 11, 1, 0, 0, 0), utc(2025, 11, 4, 0, 0, 0));
        assert_eq!(
            slots,
            vec![
                utc(2025, 11, 1, 5, 30, 0), // 01:30 EDT
                utc(2025, 11, 2, 5, 30, 0), // 01:30 EDT, first occurrence only
                utc(2025, 11, 3, 6, 30, 0), // 01:30 EST
            ]
        );
    }

    #[test]
    fn fall_back_every_hour_fires_at_both_instants() {
        let s = Schedule::parse("0 30 * * * *", Some("America/New_York")).unwrap();
        let slots = s.slots_between(utc(2025, 11, 2, 4, 0, 0), utc(2025, 11, 2, 8, 0, 0));
        assert_eq!(
            slots,
            vec![
                utc(2025, 11, 2, 4, 30, 0), // 00:30 EDT
                utc(2025, 11, 2, 5, 30, 0), // 01:30 EDT
                utc(2025, 11, 2, 6, 30, 0), // 01:30 EST
                utc(2025, 11, 2, 7, 30, 0), // 02:30 EST
            ]
        );
        // Every 5 minutes keeps running through the repeated hour: 12 slots per real hour.
        let s = Schedule::parse("0 */5 * * * *", Some("America/New_York")).unwrap();
        let slots = s.slots_between(utc(2025, 11, 2, 5, 0, 0), utc(2025, 11, 2, 7, 0, 0));
        assert_eq!(slots.len(), 24);
        assert!(slots.windows(2).all(|w| w[1] - w[0] == 5 * 60_000));
    }

    #[test]
    fn spring_forward_fixed_hour_fires_after_the_gap() {
        // 2025-03-09: New York springs forward at 07:00 UTC (02:00 EST -> 03:00 EDT).
        let s = Schedule::parse("0 30 2 * * *", Some("America/New_York")).unwrap();
        let slots = s.slots_between(utc(2025, 3, 8, 0, 0, 0), utc(2025, 3, 11, 0, 0, 0));
        assert_eq!(
            slots,
            vec![
                utc(2025, 3, 8, 7, 30, 0),  // 02:30 EST
                utc(2025, 3, 9, 7, 0, 0),   // gap: 03:00 EDT, the first instant after it
                utc(2025, 3, 10, 6, 30, 0), // 02:30 EDT
            ]
        );
        // Several wall times in one gap collapse into one slot, and a real 03:00 is the same instant.
        let s = Schedule::parse("0 0,30 2,3 * * *", Some("America/New_York")).unwrap();
        let slots = s.slots_between(utc(2025, 3, 9, 6, 0, 0), utc(2025, 3, 9, 9, 0, 0));
        assert_eq!(
            slots,
            vec![utc(2025, 3, 9, 7, 0, 0), utc(2025, 3, 9, 7, 30, 0)]
        );
    }

    #[test]
    fn spring_forward_every_hour_skips_the_gap() {
        let s = Schedule::parse("0 30 * * * *", Some("America/New_York")).unwrap();
        let slots = s.slots_between(utc(2025, 3, 9, 5, 0, 0), utc(2025, 3, 9, 9, 0, 0));
        assert_eq!(
            slots,
            vec![
                utc(2025, 3, 9, 5, 30, 0), // 00:30 EST
                utc(2025, 3, 9, 6, 30, 0), // 01:30 EST
                utc(2025, 3, 9, 7, 30, 0), // 03:30 EDT
                utc(2025, 3, 9, 8, 30, 0), // 04:30 EDT
            ]
        );
    }

    #[test]
    fn slots_strictly_increase_across_a_year_of_transitions() {
        for zone in [
            "America/New_York",
            "Europe/London",
            "Australia/Lord_Howe",
            "UTC",
        ] {
            let s = Schedule::parse("0 */20 * * * *", Some(zone)).unwrap();
            // The weeks around each transition of these zones (March/April, October/November).
            for (month, day) in [(3, 7), (3, 27), (10, 1), (10, 24)] {
                let from = utc(2025, month, day, 0, 0, 0);
                let slots = s.slots_between(from, from + 10 * 24 * HOUR);
                assert!(slots.windows(2).all(|w| w[0] < w[1]), "{zone}");
                assert!(slots.len() >= 10 * 72 - 3, "{zone}: {} slots", slots.len());
            }
            let from = utc(2025, 1, 1, 0, 0, 0);
            let s = Schedule::parse("0 15 2 * * *", Some(zone)).unwrap();
            let daily = s.slots_between(from, from + 365 * 24 * HOUR);
            assert_eq!(
                daily.len(),
                365,
                "{zone}: a fixed daily time fires once per day"
            );
        }
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration(" 1m 5s ").unwrap(), Duration::from_secs(65));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        for d in [
            Duration::from_millis(1500),
            Duration::from_secs(90_061),
            Duration::ZERO,
        ] {
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }

    #[test]
    fn jitter_spreads_and_is_deterministic() {
        let max = Duration::from_millis(1000);
        let values: Vec<u64> = (0..200).map(|i| jitter_for("job", i * 1000, max)).collect();
        assert!(values.iter().all(|v| *v <= 1000));
        let distinct: std::collections::BTreeSet<_> = values.iter().collect();
        assert!(
            distinct.len() > 150,
            "jitter does not spread: {} distinct",
            distinct.len()
        );
    }
}
