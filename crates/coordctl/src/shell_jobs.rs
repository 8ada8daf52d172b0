//! The shell-command jobs of `coordctl cron`: each `[[job]]`'s `command`
//! runs through `sh -c`. This lives in the CLI, not in `coord-scheduler`:
//! a program embedding the scheduler picks its own handlers.

use coord_scheduler::{handler, Config, Handler, Job, RunContext};

/// **Runs a shell command**: a handler that executes `sh -c COMMAND` and
/// succeeds when it exits with status 0. Only for commands from trusted
/// configuration (whoever writes the config runs code on every instance).
///
/// The child sees `COORD_JOB`, `COORD_SLOT_MS`, `COORD_INSTANCE` and
/// `COORD_MANUAL` (`1` for `run_now`) in its environment; it is killed when
/// the run times out or the scheduler shuts down.
pub(crate) fn command_handler(command: impl Into<String>) -> Handler {
    let command = command.into();
    handler(move |ctx: RunContext| {
        let command = command.clone();
        async move {
            let status = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&command)
                .env("COORD_JOB", &ctx.job)
                .env("COORD_SLOT_MS", ctx.slot.to_string())
                .env("COORD_INSTANCE", &ctx.instance)
                .env("COORD_MANUAL", if ctx.manual { "1" } else { "0" })
                .kill_on_drop(true)
                .status()
                .await
                .map_err(|e| format!("could not start `sh -c {command}`: {e}"))?;
            if status.success() {
                Ok(())
            } else {
                Err(exit_description(status).into())
            }
        }
    })
}

/// How a command that did not succeed ended, for a run's error (shared
/// with `coordctl outbox run`).
pub(crate) fn exit_description(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("command exited with status {code}"),
        None => "command was killed by a signal".to_owned(),
    }
}

/// Every job of `config` with its command as its work; refused, naming
/// it, when a job has no `command`.
pub(crate) fn command_jobs(config: &Config) -> Result<Vec<Job>, String> {
    config
        .jobs
        .iter()
        .map(|j| match &j.command {
            Some(command) => Ok(j.job(command_handler(command.clone()))),
            None => Err(format!("[[job]] {:?} has no command", j.name)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use coord_backend::SystemClock;
    use coord_scheduler::{
        FinalStatus, JobOptions, LockingHint, Schedule, Scheduler, SchedulerOptions,
    };

    use super::*;

    /// Runs `command` as job `j` once through a local scheduler: how it ended.
    async fn run(command: &str) -> FinalStatus {
        let clock = Arc::new(SystemClock);
        let scheduler = Scheduler::new(None, clock, SchedulerOptions::instance("me"));
        let schedule = Schedule::parse("every 1h", None).unwrap();
        let job = Job::new("j", schedule, command_handler(command))
            .with_options(JobOptions::default().with_hint(LockingHint::NodeLocal));
        scheduler.add_job(job).unwrap();
        let report = scheduler.run_now("j").await.unwrap();
        scheduler.shutdown().await;
        report.status
    }

    #[tokio::test]
    async fn command_handler_reports_exit_status() {
        let seen = run("test \"$COORD_JOB:$COORD_INSTANCE:$COORD_MANUAL\" = \"j:me:1\"").await;
        assert_eq!(
            seen,
            FinalStatus::Succeeded,
            "the environment names the run"
        );
        match run("exit 3").await {
            FinalStatus::Failed(why) => assert!(why.contains("status 3"), "{why}"),
            other => panic!("exit 3 ended as {other:?}"),
        }
    }

    #[test]
    fn a_job_without_a_command_is_refused_by_name() {
        let config =
            Config::from_toml_str("[[job]]\nname = \"nightly\"\nschedule = \"every 1s\"\n")
                .unwrap();
        let refused = command_jobs(&config).unwrap_err();
        assert!(refused.contains("nightly"), "{refused}");
    }
}
