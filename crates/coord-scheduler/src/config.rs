//! TOML configuration of a scheduler: the store, the instance, the jobs.
//!
//! ```toml
//! [store]                      # omit for local-only scheduling
//! url = "sqlite://coord.db"    # swapping stores is this one line (memory://, redis://, postgres://, etcd://)
//! forget_claims_after = "7d"   # optional; default: remember claims forever
//! history_size = 50            # optional
//!
//! [scheduler]                  # optional
//! instance_id = "web-1"
//! poll_interval = "500ms"
//!
//! [[job]]
//! name = "report"
//! schedule = "0 */5 * * * *"   # cron (6 or 7 fields, or 5 without seconds), or "every 1s"
//! time_zone = "Europe/Paris"   # cron only; default UTC
//! hint = "require_global"      # node_local | require_global | prefer_global (default)
//! timeout = "30s"
//! max_late = "1m"
//! lease_ttl = "30s"
//! jitter = "2s"
//! allow_overlap = false
//! max_attempts = 3             # retry a failed run: 3 attempts in all (default 1: no retry)
//! retry_backoff = "10s"        # wait after the 1st failure, doubled after each (default 1s), jittered
//! retry_backoff_max = "1m"     # cap of the wait (default 16 x retry_backoff)
//! command = "echo report"      # run by `coordctl cron` with `sh -c`
//! ```
//!
//! `max_attempts` is [`JobOptions::with_retry`] (retries start only within
//! the slot's `max_late`; a takeover counts as an attempt).
//!
//! Durations are strings: `500ms`, `30s`, `5m`, `1h30m`, `2d`. Unknown keys
//! are errors (a typo must not silently drop a setting). The store URL is
//! only parsed here ([`StoreUrl`]); opening it is the caller's business (the
//! `coord` facade maps schemes to stores), so this crate depends on no store.

use std::collections::BTreeSet;
use std::time::Duration;

use coord_backend::StoreUrl;
use serde::Deserialize;

use crate::schedule::parse_duration;
use crate::validate_job_name;
use crate::{
    Backoff, Handler, Job, JobOptions, LockingHint, RunStoreOptions, Schedule, SchedulerOptions,
};

/// Why a configuration was refused. Every variant names where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not valid TOML, or a key of the wrong type / unknown key (with its position).
    #[error("invalid TOML: {0}")]
    Toml(String),
    /// The store URL could not be parsed.
    #[error("[store] url: {0}")]
    StoreUrl(coord_backend::Error),
    /// A field had a value out of its domain.
    #[error("{at} {field}: {message}")]
    InvalidField {
        /// `[store]`, `[scheduler]` or `[[job]] NAME`.
        at: String,
        /// The key.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Two jobs share a name.
    #[error("[[job]] {0:?} is defined twice")]
    DuplicateJob(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    store: Option<RawStore>,
    scheduler: Option<RawScheduler>,
    #[serde(default)]
    job: Vec<RawJob>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: String,
    forget_claims_after: Option<String>,
    history_size: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScheduler {
    instance_id: Option<String>,
    poll_interval: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: String,
    schedule: String,
    time_zone: Option<String>,
    hint: Option<String>,
    timeout: Option<String>,
    max_late: Option<String>,
    lease_ttl: Option<String>,
    jitter: Option<String>,
    allow_overlap: Option<bool>,
    max_attempts: Option<u32>,
    retry_backoff: Option<String>,
    retry_backoff_max: Option<String>,
    command: Option<String>,
}

/// The `[store]` table.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Where the store is.
    pub url: StoreUrl,
    /// Options for the [`crate::RunStore`] over it.
    pub options: RunStoreOptions,
}

/// The `[scheduler]` table.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// This instance's id (default: generated).
    pub instance_id: Option<String>,
    /// The loop's poll interval.
    pub poll_interval: Option<Duration>,
}

impl SchedulerConfig {
    /// The [`SchedulerOptions`] this table describes.
    pub fn options(&self) -> SchedulerOptions {
        let mut options = match &self.instance_id {
            Some(id) => SchedulerOptions::instance(id.clone()),
            None => SchedulerOptions::default(),
        };
        if let Some(poll) = self.poll_interval {
            options = options.with_poll_interval(poll);
        }
        options
    }
}

/// One `[[job]]`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobConfig {
    /// The job's name.
    pub name: String,
    /// When it runs.
    pub schedule: Schedule,
    /// How it runs.
    pub options: JobOptions,
    /// The shell command to run, if any (`coordctl cron` runs it with `sh -c`;
    /// a program using this crate picks its own handler with [`JobConfig::job`]).
    pub command: Option<String>,
}

impl JobConfig {
    /// This job with `handler` as its work.
    pub fn job(&self, handler: Handler) -> Job {
        Job::new(self.name.clone(), self.schedule.clone(), handler)
            .with_options(self.options.clone())
    }
}

/// A parsed configuration.
///
/// ```
/// use coord_scheduler::{Config, LockingHint};
///
/// let config = Config::from_toml_str(r#"
///     [store]
///     url = "sqlite://coord.db"
///
///     [[job]]
///     name = "report"
///     schedule = "*/5 * * * * *"
///     hint = "require_global"
///     max_late = "10s"
///     command = "echo report"
///
///     [[job]]
///     name = "gc"
///     schedule = "every 1s"
///     hint = "node_local"
///     command = "true"
/// "#).unwrap();
/// assert_eq!(config.store.as_ref().unwrap().url.scheme(), "sqlite");
/// assert_eq!(config.jobs[0].options.hint, LockingHint::RequireGlobal);
/// assert_eq!(config.jobs[1].command.as_deref(), Some("true"));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The run store, if any (`None`: local-only scheduling).
    pub store: Option<StoreConfig>,
    /// Instance settings.
    pub scheduler: SchedulerConfig,
    /// The jobs, in file order.
    pub jobs: Vec<JobConfig>,
}

fn duration_field(
    at: &str,
    field: &'static str,
    value: Option<&str>,
) -> Result<Option<Duration>, ConfigError> {
    value
        .map(|v| {
            parse_duration(v).map_err(|message| ConfigError::InvalidField {
                at: at.to_owned(),
                field,
                message,
            })
        })
        .transpose()
}

impl Config {
    /// Parse and validate a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        let store = match raw.store {
            None => None,
            Some(s) => {
                let url = StoreUrl::parse(&s.url).map_err(ConfigError::StoreUrl)?;
                let mut options = RunStoreOptions::default();
                if let Some(size) = s.history_size {
                    if size == 0 {
                        return Err(ConfigError::InvalidField {
                            at: "[store]".into(),
                            field: "history_size",
                            message: "must be at least 1".into(),
                        });
                    }
                    options = options.with_history_size(size);
                }
                let forget = duration_field(
                    "[store]",
                    "forget_claims_after",
                    s.forget_claims_after.as_deref(),
                )?;
                if forget == Some(Duration::ZERO) {
                    return Err(ConfigError::InvalidField {
                        at: "[store]".into(),
                        field: "forget_claims_after",
                        message: "must be positive (omit it to remember forever)".into(),
                    });
                }
                options = options.with_forget_claims_after(forget);
                Some(StoreConfig { url, options })
            }
        };
        let scheduler = match raw.scheduler {
            None => SchedulerConfig::default(),
            Some(s) => {
                if s.instance_id
                    .as_deref()
                    .is_some_and(|id| id.is_empty() || id.len() > 128)
                {
                    return Err(ConfigError::InvalidField {
                        at: "[scheduler]".into(),
                        field: "instance_id",
                        message: "must be 1 to 128 bytes".into(),
                    });
                }
                SchedulerConfig {
                    instance_id: s.instance_id,
                    poll_interval: duration_field(
                        "[scheduler]",
                        "poll_interval",
                        s.poll_interval.as_deref(),
                    )?,
                }
            }
        };
        let mut names = BTreeSet::new();
        let mut jobs = Vec::new();
        for j in raw.job {
            let at = format!("[[job]] {:?}", j.name);
            let invalid = |field: &'static str, message: String| ConfigError::InvalidField {
                at: at.clone(),
                field,
                message,
            };
            validate_job_name(&j.name).map_err(|e| invalid("name", e.to_string()))?;
            if !names.insert(j.name.clone()) {
                return Err(ConfigError::DuplicateJob(j.name));
            }
            let schedule = Schedule::parse(&j.schedule, j.time_zone.as_deref())
                .map_err(|e| invalid("schedule", e.to_string()))?;
            let mut options = JobOptions::default();
            if let Some(hint) = &j.hint {
                options.hint = hint
                    .parse::<LockingHint>()
                    .map_err(|m| invalid("hint", m))?;
            }
            if let Some(t) = duration_field(&at, "timeout", j.timeout.as_deref())? {
                if t.is_zero() {
                    return Err(invalid("timeout", "must be positive".into()));
                }
                options.timeout = Some(t);
            }
            if let Some(d) = duration_field(&at, "max_late", j.max_late.as_deref())? {
                options.max_late = d;
            }
            if let Some(d) = duration_field(&at, "lease_ttl", j.lease_ttl.as_deref())? {
                if d.is_zero() {
                    return Err(invalid("lease_ttl", "must be positive".into()));
                }
                options.lease_ttl = d;
            }
            if let Some(d) = duration_field(&at, "jitter", j.jitter.as_deref())? {
                options.jitter = d;
            }
            if let Some(allow) = j.allow_overlap {
                options.allow_overlap = allow;
            }
            let backoff = duration_field(&at, "retry_backoff", j.retry_backoff.as_deref())?;
            let backoff_max =
                duration_field(&at, "retry_backoff_max", j.retry_backoff_max.as_deref())?;
            match j.max_attempts {
                Some(max_attempts) => {
                    let initial = backoff.unwrap_or(Duration::from_secs(1));
                    let max = backoff_max.unwrap_or(initial.saturating_mul(16));
                    options = options.with_retry(max_attempts, Backoff::exponential(initial, max));
                    if let Some(Err(message)) = options.retry.map(|r| r.check()) {
                        let field = match message.starts_with("max_attempts") {
                            true => "max_attempts",
                            false => "retry_backoff",
                        };
                        return Err(invalid(field, message));
                    }
                }
                None if backoff.is_some() || backoff_max.is_some() => {
                    return Err(invalid(
                        "retry_backoff",
                        "needs max_attempts (how many attempts in all)".into(),
                    ));
                }
                None => {}
            }
            if j.command.as_deref().is_some_and(|c| c.trim().is_empty()) {
                return Err(invalid("command", "is empty".into()));
            }
            jobs.push(JobConfig {
                name: j.name,
                schedule,
                options,
                command: j.command,
            });
        }
        Ok(Config {
            store,
            scheduler,
            jobs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_and_full_configs() {
        let c = Config::from_toml_str("").unwrap();
        assert!(c.store.is_none() && c.jobs.is_empty());
        let c = Config::from_toml_str(
            r#"
            [store]
            url = "redis://127.0.0.1:6379?namespace=billing"
            forget_claims_after = "1d"
            history_size = 7
            [scheduler]
            instance_id = "web-1"
            poll_interval = "250ms"
            [[job]]
            name = "nightly"
            schedule = "0 30 1 * * *"
            time_zone = "America/New_York"
            timeout = "5m"
            max_late = "10m"
            lease_ttl = "1m"
            jitter = "3s"
            allow_overlap = true
            max_attempts = 3
            retry_backoff = "10s"
            "#,
        )
        .unwrap();
        let store = c.store.as_ref().unwrap();
        assert_eq!(store.url.namespace(), "billing");
        assert_eq!(
            store.options.forget_claims_after,
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(store.options.history_size, 7);
        assert_eq!(c.scheduler.options().instance_id, "web-1");
        let j = &c.jobs[0];
        assert_eq!(j.options.timeout, Some(Duration::from_secs(300)));
        assert_eq!(j.options.max_late, Duration::from_secs(600));
        assert_eq!(j.options.lease_ttl, Duration::from_secs(60));
        assert_eq!(j.options.jitter, Duration::from_secs(3));
        assert!(j.options.allow_overlap);
        let retry = j.options.retry.unwrap();
        assert_eq!(retry.max_attempts, 3);
        assert_eq!(
            retry.backoff,
            Backoff::exponential(Duration::from_secs(10), Duration::from_secs(160))
        );
        assert_eq!(j.options.hint, LockingHint::PreferGlobal);
        assert_eq!(j.schedule.time_zone(), Some(chrono_tz::America::New_York));
        assert!(c.jobs[0].command.is_none());
    }

    #[test]
    fn errors_are_typed_and_located() {
        let cases: &[(&str, &str)] = &[
            ("[store]\nurl = \"nourl\"", "url"),
            ("[store]\nurl = \"memory://\"\nbogus = 1", "bogus"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nhint = \"global\"", "hint"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\ntimeout = \"10\"", "timeout"),
            ("[[job]]\nname = \"a\"\nschedule = \"nope\"", "schedule"),
            ("[[job]]\nname = \"a\"\nschedule = \"0 * * * * *\"\ntime_zone = \"Nowhere/City\"", "time zone"),
            ("[[job]]\nname = \"a b\"\nschedule = \"every 1s\"", "name"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\n[[job]]\nname = \"a\"\nschedule = \"every 2s\"", "twice"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nallow_overlap = \"yes\"", "allow_overlap"),
            ("[store]\nurl = \"memory://\"\nforget_claims_after = \"0s\"", "forget_claims_after"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nmax_attempts = 0", "max_attempts"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nmax_attempts = -1", "max_attempts"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nmax_attempts = 2\nretry_backoff = \"0s\"", "retry_backoff"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nmax_attempts = 2\nretry_backoff = \"1m\"\nretry_backoff_max = \"1s\"", "retry_backoff"),
            ("[[job]]\nname = \"a\"\nschedule = \"every 1s\"\nretry_backoff = \"1s\"", "needs max_attempts"),
        ];
        for (text, needle) in cases {
            let err = Config::from_toml_str(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
