//! [`BoardAdapter`]: the task board decided over the three primitives of any backend.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{Backend, Error, InvalidInput, Mutation};

use super::record::{BackoffRecord, ClaimRecord, Death, DoneRecord, TaskRecord};
use super::{
    validate_claim, validate_spec, validate_task_id, validate_ttl, Board, BoardError, ClaimedTask,
    Failed, RetryPolicy, Task, TaskSpec,
};
use crate::cas::record::time_at;
use crate::cas::{
    record_options, whole_millis, CasStats, Decision, Nonce, Record, RecordSpace, View,
};
use crate::mint_token;
use crate::retention::{PruneOptions, Pruned, Removal, RetentionIndex};

record_options! {
    /// Options of a [`BoardAdapter`].
    pub struct BoardOptions, prefix "board/" {}
}

/// A [`Board`] over any [`Backend`]: one record per task
/// (`<prefix>task/<id>`) holding its payload, dependencies, fence,
/// live claim and completion, decided through the [`CasEngine`](crate::CasEngine).
///
/// A claim costs one txn once the engine has seen the task and its
/// dependencies; a cold claim of a task with dependencies costs a few more
/// (each wrong guess is a rejected txn that returns the truth).
#[derive(Clone, Debug)]
pub struct BoardAdapter {
    pub(super) space: RecordSpace,
    pub(super) spread: Arc<super::queue::ClaimSpread>,
}

impl BoardAdapter {
    /// A board over `backend` with default options (system clock, prefix `board/`).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, BoardOptions::default())
    }

    /// A board over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: BoardOptions) -> Self {
        BoardAdapter {
            space: options.space(backend),
            spread: Arc::default(),
        }
    }

    /// Store calls made so far (for tests and benchmarks).
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    fn tasks_prefix(&self) -> String {
        format!("{}task/", self.space.prefix())
    }

    pub(super) fn task_key(&self, id: &str) -> String {
        format!("{}task/{id}", self.space.prefix())
    }

    /// Where completions are indexed by minute, for [`BoardAdapter::prune`].
    pub(super) fn done_index(&self) -> RetentionIndex {
        RetentionIndex::under(format!("{}done/", self.space.prefix()))
    }

    /// The prefix of `dep`'s reverse-dependency entries. The id's length
    /// comes first, so the prefix of `a` is not a prefix of `a/b`'s.
    pub(super) fn dependents_prefix(&self, dep: &str) -> String {
        format!("{}rdep/{}:{dep}/", self.space.prefix(), dep.len())
    }

    /// The entry saying `id` depends on `dep`, which was not completed when
    /// `id` was added: it exists from then until `id` completes, so a prune
    /// of `dep` finds every task still waiting on it.
    pub(super) fn dependent_key(&self, dep: &str, id: &str) -> String {
        format!("{}{id}", self.dependents_prefix(dep))
    }

    pub(super) fn read(&self, view: &View, id: &str) -> Result<Option<TaskRecord>, Error> {
        let key = self.task_key(id);
        view.value(&key)
            .map(|bytes| TaskRecord::decode(&key, id, bytes))
            .transpose()
    }

    /// Replace the payload and dependencies of a task that is neither
    /// completed nor held by a live claim (an operator's repair of a wrong
    /// topology). Its fence is kept; an expired claim is dropped.
    ///
    /// Claims racing this change are decided again on the new dependency
    /// list (their txn asserts the task record).
    pub async fn redefine(&self, spec: TaskSpec) -> Result<(), BoardError> {
        let (spec, key, keys) = self.prepare(spec)?;
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<(), BoardError, _>(&keys, |view| {
                let Some(record) = self.read(view, &spec.id)? else {
                    return Err(BoardError::NotFound {
                        id: spec.id.clone(),
                    });
                };
                if record.done.is_some() {
                    return Err(BoardError::Completed {
                        id: spec.id.clone(),
                    });
                }
                if record.dead.is_some() {
                    return Err(BoardError::Dead {
                        id: spec.id.clone(),
                    });
                }
                if let Some(claim) = record.live_claim(now) {
                    return Err(BoardError::AlreadyClaimed {
                        id: spec.id.clone(),
                        agent: claim.agent.clone(),
                        expires_at: time_at(claim.lease.expires_ms),
                    });
                }
                // A dependency met before stays met (its record may be
                // pruned); the new ones are settled as `add` does.
                let (met, mut entries) =
                    self.settle_deps(view, &spec.id, &spec.deps, &record.met)?;
                let mut written = BTreeSet::from([key.clone()]);
                entries.extend(self.register_queue(spec.queue.as_deref(), &mut written));
                // Entries of dropped dependencies go as far as the call has
                // room; one left behind only makes a later prune of that
                // dependency look at this task and leave it as it is.
                let room = self
                    .space
                    .keys_per_call()
                    .saturating_sub(keys.len() + entries.len());
                entries.extend(
                    record
                        .deps
                        .iter()
                        .filter(|d| !spec.deps.contains(d) && !record.met.contains(d))
                        .take(room)
                        .map(|d| Mutation::delete(self.dependent_key(d, &spec.id))),
                );
                let unmet: Vec<String> = spec
                    .deps
                    .iter()
                    .filter(|d| !met.contains(d))
                    .cloned()
                    .collect();
                let (dep_writes, marks) =
                    self.await_deps(view, spec.queue.is_some(), &unmet, &mut written)?;
                entries.extend(marks);
                let mut redefined = TaskRecord {
                    payload: spec.payload.clone(),
                    deps: spec.deps.clone(),
                    met,
                    claim: None,
                    queue: spec.queue.clone(),
                    priority: spec.priority,
                    max_attempts: spec.retry.max_attempts,
                    backoff: stored_backoff(&spec),
                    not_before_ms: spec.run_at.map(millis_at).or(record.not_before_ms),
                    nonce: Nonce::default(),
                    ..record
                };
                entries.extend(self.reindex(&mut redefined, now));
                let mut mutations = dep_writes;
                mutations.push(redefined.put(&key));
                // Entries are named by this task, whose record this txn
                // rewrites (asserted).
                Ok(Decision::CommitWithUnasserted {
                    mutations,
                    unasserted: entries,
                    then: (),
                })
            })
            .await
    }

    /// Remove tasks completed more than `options.retention` ago (by this
    /// board's clock), at most `options.max_records` per call; several
    /// pruners may run at once (see [`crate::retention`]). Open, claimed
    /// and expired tasks stay, whatever their age.
    ///
    /// **Tasks that depend on a pruned one stay claimable:** the txn that
    /// deletes a completed task marks it met in every task still waiting on
    /// it (found through the reverse-dependency entries `add` writes), so
    /// their claims no longer read it. **A task added after its dependency
    /// was pruned** waits for a task of that id, as a task naming a
    /// dependency that was never added does: add dependents within the
    /// retention. **An id added again after its task was pruned** is a new
    /// task; its claims' fences still start above every fence
    /// the id had. Without pruning (the default) nothing is removed.
    pub async fn prune(&self, options: &PruneOptions) -> Result<Pruned, BoardError> {
        let index = self.done_index();
        let now = self.space.now_millis();
        let pruned = crate::retention::prune(
            self.space.engine(),
            &index,
            now,
            options,
            str::to_owned,
            |id, entry, cutoff_ms| async move { self.remove_task(&id, &entry, cutoff_ms).await },
        )
        .await?;
        crate::telemetry::pruned("board", pruned.removed);
        Ok(pruned)
    }

    /// How many completed tasks [`prune`](Self::prune) would look at now
    /// (`removed`: an upper bound of what it removes; `more`: the count
    /// stopped at `options.max_minutes` minutes of the index). Writes nothing.
    pub async fn prune_candidates(&self, options: &PruneOptions) -> Result<Pruned, BoardError> {
        let now = self.space.now_millis();
        Ok(crate::retention::due(self.space.engine(), &self.done_index(), now, options).await?)
    }

    /// Remove task `id` (indexed by `entry`) if it was completed by
    /// `cutoff_ms`, first marking it met in the tasks waiting on it, as many
    /// per txn as the store allows; the last txn deletes the task with the
    /// last of them. No entry can appear for a completed task (`add`
    /// asserts the dependency's version), so the listing is complete.
    async fn remove_task(&self, id: &str, entry: &str, cutoff_ms: u64) -> Result<Removal, Error> {
        enum Step {
            Done(Removal),
            More,
        }
        let key = self.task_key(id);
        let removals = self.done_index().removals();
        // Each waiter: its entry, its record, its new queue index entry;
        // beside them the task, its retention entry, the removal counter and
        // its dead entry.
        let per_txn = (self.space.keys_per_call().saturating_sub(4) / 3).max(1);
        let prefix = self.dependents_prefix(id);
        loop {
            let waiting = self.space.engine().backend().keys(&prefix).await?;
            let batch = &waiting[..waiting.len().min(per_txn)];
            let last = batch.len() == waiting.len();
            let mut keys = vec![key.clone(), entry.to_owned()];
            if last {
                keys.push(removals.clone());
            }
            for waiter in batch {
                keys.push(waiter.clone());
                keys.push(self.task_key(&waiter[prefix.len()..]));
            }
            let step = self
                .space
                .engine()
                .decide(&keys, |view| -> Result<Decision<Step>, Error> {
                    if view.value(entry).is_none() {
                        return Ok(Decision::Return(Step::Done(Removal::Gone)));
                    }
                    let record = self.read(view, id)?;
                    let completed = record.as_ref().is_some_and(|r| r.done.is_some());
                    let dead_entry = record.as_ref().and_then(|r| r.dead_entry.clone());
                    let at_ms = match record.and_then(|r| r.final_at_ms()) {
                        Some(at) => at,
                        // Not completed or dead (added again, or retried,
                        // since), or completed before completions had a
                        // time: a stale entry.
                        None => {
                            return Ok(Decision::Commit {
                                mutations: vec![Mutation::delete(entry)],
                                then: Step::Done(Removal::Gone),
                            })
                        }
                    };
                    if at_ms > cutoff_ms {
                        return Ok(Decision::Return(Step::Done(Removal::Kept)));
                    }
                    let waiting: Vec<String> = batch
                        .iter()
                        .filter(|waiter| view.value(waiter).is_some())
                        .map(|waiter| waiter[prefix.len()..].to_owned())
                        .collect();
                    let now = self.space.now_millis();
                    // A dead or cancelled task leaves its dependents waiting
                    // (on a task of its id, as one never added would).
                    let (mut mutations, mut unasserted) = if completed {
                        self.mark_met(view, id, &waiting, now)?
                    } else {
                        (Vec::new(), Vec::new())
                    };
                    // The entries listed are in the view: delete them there.
                    unasserted.retain(|m| !view.contains(m.key()));
                    mutations.extend(
                        waiting
                            .iter()
                            .map(|w| Mutation::delete(self.dependent_key(id, w))),
                    );
                    if last {
                        mutations.push(Mutation::delete(key.as_str()));
                        mutations.push(Mutation::delete(entry));
                        // Its dead entry goes with the record that names it.
                        unasserted.extend(dead_entry.map(Mutation::delete));
                        // "Missing" comes back: count it, so a late copy of
                        // the add that created the task cannot land now.
                        mutations.push(self.done_index().count_removal(view)?);
                        return Ok(Decision::CommitWithUnasserted {
                            mutations,
                            unasserted,
                            then: Step::Done(Removal::Removed),
                        });
                    }
                    if mutations.is_empty() {
                        // Every listed entry went meanwhile: list again.
                        return Ok(Decision::Return(Step::More));
                    }
                    Ok(Decision::CommitWithUnasserted {
                        mutations,
                        unasserted,
                        then: Step::More,
                    })
                })
                .await?;
            if let Step::Done(removal) = step {
                return Ok(removal);
            }
        }
    }

    /// Adding a task reads it, every dependency and the removal counter,
    /// and writes a reverse-dependency entry per dependency, in one txn (a
    /// claim reads the task and its dependencies): refuse a task the store
    /// could never add or claim, rather than storing half of it.
    fn check_fits(&self, spec: &TaskSpec) -> Result<(), BoardError> {
        let max = self.space.keys_per_call();
        let count = Self::keys_to_add(spec);
        if count > max {
            return Err(BoardError::Invalid(InvalidInput::TooManyKeys {
                count,
                max,
            }));
        }
        Ok(())
    }

    /// The keys a txn adding `spec` names: the task, its marker, the
    /// removal counter, and per dependency its record and entry; queued,
    /// also its index entry, its queue's name and per dependency a marker.
    fn keys_to_add(spec: &TaskSpec) -> usize {
        if spec.queue.is_some() {
            5 + 3 * spec.deps.len()
        } else {
            3 + 2 * spec.deps.len()
        }
    }

    /// `spec` normalized and checked to fit (see [`Self::check_fits`]), its
    /// task's key, and the keys adding or redefining it reads: the task's,
    /// then its dependencies'.
    fn prepare(&self, spec: TaskSpec) -> Result<(TaskSpec, String, Vec<String>), BoardError> {
        let spec = normalize(spec)?;
        self.check_fits(&spec)?;
        let key = self.task_key(&spec.id);
        let keys = std::iter::once(key.clone())
            .chain(spec.deps.iter().map(|d| self.task_key(d)))
            .collect();
        Ok((spec, key, keys))
    }

    /// Which of `deps` are completed for good (in `met`, or completed in
    /// the view), and the reverse-dependency entries of the others.
    fn settle_deps(
        &self,
        view: &View,
        id: &str,
        deps: &[String],
        met_before: &[String],
    ) -> Result<(Vec<String>, Vec<Mutation>), Error> {
        let mut met = Vec::new();
        let mut entries = Vec::new();
        for dep in deps {
            let done = met_before.contains(dep)
                || matches!(self.read(view, dep)?, Some(d) if d.done.is_some());
            if done {
                met.push(dep.clone());
            } else {
                entries.push(Mutation::put(self.dependent_key(dep, id), Vec::new()));
            }
        }
        Ok((met, entries))
    }

    /// Write `record` (at `key`) holding `claim`, its queue entry moved to
    /// the lease's end, and answer the renewal to its holder.
    fn grant(
        &self,
        key: &str,
        record: TaskRecord,
        claim: ClaimRecord,
        now: u64,
    ) -> Decision<ClaimedTask> {
        let mut granted = TaskRecord {
            claim: Some(claim.clone()),
            nonce: Nonce::default(),
            ..record
        };
        let entry = self.reindex(&mut granted, now);
        Decision::CommitWithUnasserted {
            mutations: vec![granted.put(key)],
            unasserted: entry,
            then: granted.claimed_task(claim),
        }
    }

    /// The decision shared by `release` and `complete`: the token must hold the live claim.
    fn holder_check<'r>(
        &self,
        record: Option<&'r TaskRecord>,
        id: &str,
        token: &str,
        now: u64,
    ) -> Result<&'r TaskRecord, BoardError> {
        let record = record.ok_or_else(|| BoardError::NotFound { id: id.to_owned() })?;
        if record.done.is_some() {
            return Err(BoardError::Completed { id: id.to_owned() });
        }
        match record.live_claim(now) {
            Some(claim) if claim.lease.token == token => Ok(record),
            _ => Err(BoardError::LeaseLost { id: id.to_owned() }),
        }
    }
}

/// `answer`, its fence (if granted) recorded on the current span.
fn with_fence(answer: Result<ClaimedTask, BoardError>) -> Result<ClaimedTask, BoardError> {
    if let Ok(claimed) = &answer {
        tracing::Span::current().record("fence", claimed.fence);
    }
    answer
}

/// Validate a spec and drop duplicate dependencies (keeping their order).
fn normalize(mut spec: TaskSpec) -> Result<TaskSpec, BoardError> {
    validate_spec(&spec)?;
    let mut seen = HashSet::new();
    spec.deps.retain(|d| seen.insert(d.clone()));
    Ok(spec)
}

/// Writes of one decision: of keys in its view, of keys outside it.
type Writes = (Vec<Mutation>, Vec<Mutation>);

/// `at` in milliseconds since the Unix epoch (0 before it).
fn millis_at(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map(whole_millis)
        .unwrap_or(0)
}

/// The backoff a record keeps for `spec`: none when it is the default.
fn stored_backoff(spec: &TaskSpec) -> Option<BackoffRecord> {
    let default = BackoffRecord::from(RetryPolicy::default());
    Some(BackoffRecord::from(spec.retry)).filter(|b| *b != default)
}

/// Whether `record` holds what adding `spec` would store ("the same
/// content": payload, dependencies, queue, priority, retry policy).
fn same_content(record: &TaskRecord, spec: &TaskSpec) -> bool {
    record.payload == spec.payload
        && record.deps == spec.deps
        && record.queue == spec.queue
        && record.priority == spec.priority
        && record.max_attempts == spec.retry.max_attempts
        && record.backoff == stored_backoff(spec)
        && record.at_most_once == spec.at_most_once
}

impl BoardAdapter {
    /// The writes that add `spec` (normalized) in a view holding its key,
    /// its marker, its dependencies' and the removal counter (writes of
    /// viewed keys, writes of others); `None` when the same task is there
    /// already. `written` dedupes writes across one txn; `awaited_here`:
    /// ids a queued task of the same txn waits on.
    fn plan_add(
        &self,
        view: &View,
        spec: &TaskSpec,
        now: u64,
        written: &mut BTreeSet<String>,
        awaited_here: &HashSet<String>,
    ) -> Result<Option<Writes>, BoardError> {
        if let Some(existing) = self.read(view, &spec.id)? {
            return if same_content(&existing, spec) {
                Ok(None)
            } else {
                Err(BoardError::AlreadyExists {
                    id: spec.id.clone(),
                })
            };
        }
        let (met, mut unviewed) = self.settle_deps(view, &spec.id, &spec.deps, &[])?;
        let unmet: Vec<String> = spec
            .deps
            .iter()
            .filter(|d| !met.contains(d) && !awaited_here.contains(*d))
            .cloned()
            .collect();
        let (mut viewed, marks) = self.await_deps(view, spec.queue.is_some(), &unmet, written)?;
        unviewed.extend(marks);
        let marker = self.waiters_key(&spec.id);
        let awaited = view.value(&marker).is_some();
        if awaited {
            viewed.push(Mutation::delete(marker));
        }
        let mut record = TaskRecord {
            id: spec.id.clone(),
            payload: spec.payload.clone(),
            deps: spec.deps.clone(),
            met,
            fence: 0,
            claim: None,
            done: None,
            queue: spec.queue.clone(),
            priority: spec.priority,
            not_before_ms: spec.run_at.map(millis_at),
            attempts: 0,
            max_attempts: spec.retry.max_attempts,
            backoff: stored_backoff(spec),
            last_error: None,
            dead: None,
            awaited: awaited || awaited_here.contains(&spec.id),
            indexed: None,
            dead_entry: None,
            at_most_once: spec.at_most_once,
            nonce: Nonce::default(),
        };
        unviewed.extend(self.reindex(&mut record, now));
        unviewed.extend(self.register_queue(spec.queue.as_deref(), written));
        viewed.push(record.put(self.task_key(&spec.id)));
        Ok(Some((viewed, unviewed)))
    }

    /// Put every task of `tasks` on the board in ONE txn: all or none. The
    /// txn reads each task, each dependency and the removal counter, and
    /// writes each task, its index entry and its dependency entries, so
    /// it must fit the store's `max_keys_per_call` (42 on etcd, 128 on the
    /// other stores; a task without dependencies takes 3 keys, and the
    /// batch one more): a batch that does not is refused with
    /// `InvalidInput::TooManyKeys` before anything is written; split it
    /// (each part is then atomic on its own). A task of the batch may
    /// depend on another one of it. A task already there with the same
    /// content is left as it is; with other content the whole batch is
    /// refused ([`BoardError::AlreadyExists`]).
    pub async fn add_many(&self, tasks: Vec<TaskSpec>) -> Result<(), BoardError> {
        let specs = tasks
            .into_iter()
            .map(normalize)
            .collect::<Result<Vec<_>, _>>()?;
        let mut ids = HashSet::new();
        if let Some(twice) = specs.iter().find(|s| !ids.insert(s.id.clone())) {
            return Err(BoardError::Invalid(InvalidInput::Argument(format!(
                "task {:?} appears twice in one add_many",
                twice.id
            ))));
        }
        let mut keys: Vec<String> = specs
            .iter()
            .flat_map(|s| [self.task_key(&s.id), self.waiters_key(&s.id)])
            .collect();
        let mut seen: HashSet<String> = keys.iter().cloned().collect();
        // What a queued task of the batch waits on, created by it too.
        let awaited_here: HashSet<String> = specs
            .iter()
            .filter(|s| s.queue.is_some())
            .flat_map(|s| s.deps.iter().filter(|d| ids.contains(*d)).cloned())
            .collect();
        // The removal counter, and each queue's name once.
        let queues: HashSet<&str> = specs.iter().filter_map(|s| s.queue.as_deref()).collect();
        let mut count = 1 + queues.len();
        for spec in &specs {
            self.check_fits(spec)?;
            count += Self::keys_to_add(spec) - 1 - usize::from(spec.queue.is_some());
            for dep in &spec.deps {
                let key = self.task_key(dep);
                if seen.insert(key.clone()) {
                    keys.push(key);
                }
            }
        }
        let max = self.space.keys_per_call();
        if count > max {
            return Err(BoardError::Invalid(InvalidInput::TooManyKeys {
                count,
                max,
            }));
        }
        keys.push(self.done_index().removals());
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<(), BoardError, _>(&keys, |view| {
                let mut mutations = Vec::new();
                let mut unasserted = Vec::new();
                let mut written = BTreeSet::new();
                for spec in &specs {
                    let plan = self.plan_add(view, spec, now, &mut written, &awaited_here)?;
                    if let Some((viewed, others)) = plan {
                        mutations.extend(viewed);
                        unasserted.extend(others);
                    }
                }
                if mutations.is_empty() {
                    return Ok(Decision::Return(()));
                }
                Ok(Decision::CommitWithUnasserted {
                    mutations,
                    unasserted,
                    then: (),
                })
            })
            .await
    }

    /// Claim the next ready task of `queue`: see [`super::queue`].
    /// `claim_next_wait`: the same, waiting up to `timeout` for one, woken
    /// by the store's change notifications on the queue's index (polling
    /// every `poll` without them).
    pub async fn claim_next_wait_polling(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
        timeout: Duration,
        poll: Duration,
    ) -> Result<Option<ClaimedTask>, BoardError> {
        super::validate_queue(queue)?;
        let deadline = crate::wake::Deadline::after(timeout);
        let mut wake = self.space.watch(&format!("queue/{queue}/")).await;
        loop {
            if let Some(task) = self.claim_next(queue, agent, ttl).await? {
                return Ok(Some(task));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline.at {
                return Ok(None);
            }
            wake.until(crate::wake::later(now, poll).min(deadline.at))
                .await?;
        }
    }
}

#[async_trait]
impl Board for BoardAdapter {
    #[tracing::instrument(name = "board.add", skip_all, fields(
        key = %task.id, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn add(&self, task: TaskSpec) -> Result<(), BoardError> {
        // The dependencies are read (and asserted) too: one completed now is
        // met for good; the others get a reverse-dependency entry, which a
        // prune of a dependency will find (it can only complete after this
        // txn, which asserts its version). The removal counter is asserted
        // too: "missing" comes back once the task is pruned, the counter
        // never does, so a lost add's resend or late original cannot
        // create the task a second time (see `crate::retention`).
        let (spec, _key, mut keys) = self.prepare(task)?;
        keys.push(self.done_index().removals());
        keys.push(self.waiters_key(&spec.id));
        let now = self.space.now_millis();
        let none = HashSet::new();
        self.space
            .engine()
            .decide::<(), BoardError, _>(&keys, |view| {
                match self.plan_add(view, &spec, now, &mut BTreeSet::new(), &none)? {
                    None => Ok(Decision::Return(())),
                    // The entries are fresh by construction: named by this
                    // task, whose record this txn creates (asserted missing).
                    Some((mutations, unasserted)) => Ok(Decision::CommitWithUnasserted {
                        mutations,
                        unasserted,
                        then: (),
                    }),
                }
            })
            .await
    }

    async fn add_many(&self, tasks: Vec<TaskSpec>) -> Result<(), BoardError> {
        BoardAdapter::add_many(self, tasks).await
    }

    #[tracing::instrument(name = "board.claim_next", skip_all, fields(
        queue = %queue, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn claim_next(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
    ) -> Result<Option<ClaimedTask>, BoardError> {
        BoardAdapter::claim_next(self, queue, agent, ttl).await
    }

    async fn claim_next_wait(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Option<ClaimedTask>, BoardError> {
        self.claim_next_wait_polling(queue, agent, ttl, timeout, Duration::from_secs(1))
            .await
    }

    #[tracing::instrument(name = "board.claim", skip_all, fields(
        key = %id, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn claim(&self, id: &str, agent: &str, ttl: Duration) -> Result<ClaimedTask, BoardError> {
        validate_claim(id, agent, ttl)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        let expires_ms = now.saturating_add(whole_millis(ttl));
        let token = mint_token();
        let answer = self
            .space
            .engine()
            .decide::<Option<ClaimedTask>, BoardError, _>(std::slice::from_ref(&key), |view| {
                let Some(record) = self.read(view, id)? else {
                    return Err(BoardError::NotFound { id: id.to_owned() });
                };
                if record.done.is_some() {
                    return Err(BoardError::Completed { id: id.to_owned() });
                }
                if record.dead.is_some() {
                    return Err(BoardError::Dead { id: id.to_owned() });
                }
                if let Some(claim) = record.live_claim(now) {
                    return Err(BoardError::AlreadyClaimed {
                        id: id.to_owned(),
                        agent: claim.agent.clone(),
                        expires_at: time_at(claim.lease.expires_ms),
                    });
                }
                if let Some(at) = record.not_before_ms.filter(|at| *at > now) {
                    return Err(BoardError::NotReady {
                        id: id.to_owned(),
                        at: time_at(at),
                    });
                }
                // The dependency list lives in the record, so its keys are only
                // known now. Whatever the list says in THIS view is read and
                // asserted; if it changed since an earlier round, the new keys
                // are added here (and stale extra keys are merely asserted too).
                let unread: Vec<String> = record
                    .unmet()
                    .map(|d| self.task_key(d))
                    .filter(|k| !view.contains(k))
                    .collect();
                if !unread.is_empty() {
                    return Ok(Decision::Expand(unread));
                }
                let mut pending = Vec::new();
                for dep in record.unmet() {
                    match self.read(view, dep)? {
                        Some(d) if d.done.is_some() => {}
                        _ => pending.push(dep.clone()),
                    }
                }
                if !pending.is_empty() {
                    return Err(BoardError::DependenciesNotMet {
                        id: id.to_owned(),
                        pending,
                    });
                }
                // A queued task's dependencies completed meanwhile are met
                // for good: say so in the record (its queue entry depends on
                // it), and drop their reverse-dependency entries.
                let mut record = record;
                let mut dropped = Vec::new();
                if record.queue.is_some() {
                    let completed: Vec<String> = record.unmet().cloned().collect();
                    dropped = completed
                        .iter()
                        .map(|d| Mutation::delete(self.dependent_key(d, id)))
                        .collect();
                    record.met.extend(completed);
                }
                Ok(self
                    .take(view, &key, record, agent, &token, expires_ms, now)?
                    .with_unasserted(dropped))
            })
            .await;
        match answer {
            Ok(Some(claimed)) => {
                tracing::Span::current().record("fence", claimed.fence);
                Ok(claimed)
            }
            // Its last attempt had run out: it is dead now.
            Ok(None) => Err(BoardError::Dead { id: id.to_owned() }),
            Err(error) => Err(error),
        }
    }

    #[tracing::instrument(name = "board.renew", skip_all, fields(
        key = %id, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn renew(&self, id: &str, token: &str, ttl: Duration) -> Result<ClaimedTask, BoardError> {
        validate_task_id(id)?;
        validate_ttl(ttl)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        let answer = self
            .space
            .engine()
            .decide::<ClaimedTask, BoardError, _>(std::slice::from_ref(&key), |view| {
                let record = self.read(view, id)?;
                let record = self.holder_check(record.as_ref(), id, token, now)?.clone();
                let claim = record.claim.clone().expect("checked: a live claim");
                // A clock stepping back must not shorten a lease already granted.
                let mut lease = claim.lease.clone();
                lease.extend(now.saturating_add(whole_millis(ttl)));
                Ok(self.grant(&key, record, ClaimRecord { lease, ..claim }, now))
            })
            .await;
        with_fence(answer)
    }

    #[tracing::instrument(name = "board.release", skip_all, fields(
        key = %id, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn release(&self, id: &str, token: &str) -> Result<(), BoardError> {
        validate_task_id(id)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<(), BoardError, _>(std::slice::from_ref(&key), |view| {
                let record = self.read(view, id)?;
                let record = self.holder_check(record.as_ref(), id, token, now)?.clone();
                // Given back, not failed: the attempt is not counted.
                let mut released = TaskRecord {
                    claim: None,
                    attempts: record.attempts.saturating_sub(1),
                    nonce: Nonce::default(),
                    ..record
                };
                let entry = self.reindex(&mut released, now);
                Ok(Decision::CommitWithUnasserted {
                    mutations: vec![released.put(&key)],
                    unasserted: entry,
                    then: (),
                })
            })
            .await
    }

    #[tracing::instrument(name = "board.complete", skip_all, fields(
        key = %id, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn complete(&self, id: &str, token: &str, result: Vec<u8>) -> Result<(), BoardError> {
        enum Step {
            /// The tasks waiting on this one must be listed (its record
            /// was at this version when seen).
            List(coord_backend::Version),
            /// Completed; these waiting tasks had no room in its txn.
            Done(Vec<String>),
        }
        validate_task_id(id)?;
        if token.is_empty() {
            return Err(BoardError::Invalid(InvalidInput::Argument(
                "empty claim token".into(),
            )));
        }
        let key = self.task_key(id);
        let index = self.done_index();
        let mut listed: Option<(coord_backend::Version, Vec<String>)> = None;
        loop {
            let mut keys = vec![key.clone(), index.cursor()];
            let room = self.dependents_per_txn(self.space.keys_per_call() / 2);
            let (fit, rest): (&[String], &[String]) = match &listed {
                Some((_, all)) => all.split_at(all.len().min(room)),
                None => (&[], &[]),
            };
            keys.extend(fit.iter().map(|d| self.task_key(d)));
            let now = self.space.now_millis();
            let step = self
                .space
                .engine()
                .decide::<Step, BoardError, _>(&keys, |view| {
                    let record = self.read(view, id)?;
                    // A retry of the completion that already landed is a no-op.
                    if let Some(done) = record.as_ref().and_then(|r| r.done.as_ref()) {
                        if done.token == token && done.result == result {
                            return Ok(Decision::Return(Step::Done(Vec::new())));
                        }
                    }
                    let record = self.holder_check(record.as_ref(), id, token, now)?.clone();
                    // Queued tasks wait on this one: they are listed after
                    // the record was seen at this version (every add of one
                    // rewrites it, so none added before is missed, and one
                    // added since makes this txn fail), and marked met here.
                    let version = view.version(&key);
                    if record.awaited && listed.as_ref().is_none_or(|(at, _)| *at != version) {
                        return Ok(Decision::Return(Step::List(version)));
                    }
                    let agent = record
                        .claim
                        .as_ref()
                        .map(|c| c.agent.clone())
                        .unwrap_or_default();
                    // The task no longer waits on anything: its reverse-dependency
                    // entries go (nothing writes them again once it is completed).
                    // (A task stored before entries existed may list more
                    // dependencies than fit: it has no entries to delete.)
                    let budget = self.space.keys_per_call() / 2;
                    let mut unasserted: Vec<Mutation> = record
                        .unmet()
                        .take(budget)
                        .map(|d| Mutation::delete(self.dependent_key(d, id)))
                        .collect();
                    let (cursor, entry) = index.final_writes(view, now, id);
                    unasserted.push(entry);
                    let awaited = record.awaited;
                    let mut completed = TaskRecord {
                        claim: None,
                        done: Some(DoneRecord {
                            agent,
                            token: token.to_owned(),
                            result: result.clone(),
                            at_ms: Some(now),
                        }),
                        awaited: false,
                        nonce: Nonce::default(),
                        ..record
                    };
                    unasserted.extend(self.reindex(&mut completed, now));
                    let mut mutations = vec![completed.put(&key)];
                    mutations.extend(cursor);
                    let mut later = Vec::new();
                    if awaited {
                        let (marked, others) = self.mark_met(view, id, fit, now)?;
                        mutations.extend(marked);
                        unasserted.extend(others);
                        later = rest.to_vec();
                    }
                    Ok(Decision::CommitWithUnasserted {
                        mutations,
                        unasserted,
                        then: Step::Done(later),
                    })
                })
                .await?;
            match step {
                Step::List(at) => listed = Some((at, self.dependents_of(id).await?)),
                Step::Done(later) => {
                    if !later.is_empty() {
                        self.mark_met_later(id, &later).await?;
                    }
                    return Ok(());
                }
            }
        }
    }

    async fn fail(&self, id: &str, token: &str, error: &str) -> Result<Failed, BoardError> {
        validate_task_id(id)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        let error = error.to_owned();
        self.space
            .engine()
            .decide::<Failed, BoardError, _>(std::slice::from_ref(&key), |view| {
                let record = self.read(view, id)?;
                let record = self.holder_check(record.as_ref(), id, token, now)?.clone();
                let failed = TaskRecord {
                    claim: None,
                    last_error: Some(error.clone()),
                    ..record
                };
                if failed
                    .max_attempts
                    .is_some_and(|max| failed.attempts >= max)
                {
                    return Ok(self
                        .finish(view, &key, failed, now, Death::OutOfAttempts)?
                        .map(|()| Failed::Dead));
                }
                let backoff = failed
                    .backoff
                    .unwrap_or_else(|| RetryPolicy::default().into());
                let at =
                    now.saturating_add(super::queue::backoff_ms(backoff, failed.attempts.max(1)));
                let mut waiting = TaskRecord {
                    not_before_ms: Some(at),
                    ..failed
                };
                let entry = self.reindex(&mut waiting, now);
                Ok(Decision::CommitWithUnasserted {
                    mutations: vec![waiting.put(&key)],
                    unasserted: entry,
                    then: Failed::RetryAt(time_at(at)),
                })
            })
            .await
    }

    async fn mark_uncertain(&self, id: &str, token: &str, error: &str) -> Result<(), BoardError> {
        validate_task_id(id)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        let error = error.to_owned();
        self.space
            .engine()
            .decide::<(), BoardError, _>(std::slice::from_ref(&key), |view| {
                let record = self.read(view, id)?;
                let record = self.holder_check(record.as_ref(), id, token, now)?.clone();
                let unknown = TaskRecord {
                    last_error: Some(format!("outcome unknown: {error}")),
                    ..record
                };
                self.finish(view, &key, unknown, now, Death::Uncertain)
            })
            .await
    }

    async fn cancel(&self, id: &str) -> Result<(), BoardError> {
        validate_task_id(id)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<(), BoardError, _>(std::slice::from_ref(&key), |view| {
                let Some(record) = self.read(view, id)? else {
                    return Err(BoardError::NotFound { id: id.to_owned() });
                };
                if record.done.is_some() {
                    return Err(BoardError::Completed { id: id.to_owned() });
                }
                if record.dead.as_ref().is_some_and(|d| d.cancelled) {
                    return Ok(Decision::Return(()));
                }
                self.finish(view, &key, record, now, Death::Cancelled)
            })
            .await
    }

    async fn retry_dead(&self, id: &str) -> Result<(), BoardError> {
        validate_task_id(id)?;
        let key = self.task_key(id);
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<(), BoardError, _>(std::slice::from_ref(&key), |view| {
                let Some(record) = self.read(view, id)? else {
                    return Err(BoardError::NotFound { id: id.to_owned() });
                };
                match &record.dead {
                    Some(dead) if !dead.cancelled => {}
                    Some(_) => {
                        return Err(BoardError::Invalid(InvalidInput::Argument(format!(
                            "task {id:?} was cancelled, not dead: it is not retried"
                        ))))
                    }
                    None if record.done.is_some() => {
                        return Err(BoardError::Completed { id: id.to_owned() })
                    }
                    // Not dead (retried already, or never was): nothing to do.
                    None => return Ok(Decision::Return(())),
                }
                // Its retention entry stays behind: a prune finds the task
                // alive and drops only the entry.
                let mut revived = TaskRecord {
                    dead: None,
                    attempts: 0,
                    not_before_ms: None,
                    nonce: Nonce::default(),
                    ..record
                };
                let mut entry = self.reindex(&mut revived, now);
                // Out of its queue's dead index, in the same txn.
                entry.extend(self.redead(&mut revived));
                Ok(Decision::CommitWithUnasserted {
                    mutations: vec![revived.put(&key)],
                    unasserted: entry,
                    then: (),
                })
            })
            .await
    }

    async fn queues(&self, limit: usize) -> Result<super::QueueNames, BoardError> {
        BoardAdapter::queues(self, limit).await
    }

    async fn queue_depth(
        &self,
        queue: &str,
        limit: usize,
    ) -> Result<super::QueueDepth, BoardError> {
        BoardAdapter::queue_depth(self, queue, limit).await
    }

    async fn dead_tasks(&self, queue: &str, limit: usize) -> Result<super::DeadTasks, BoardError> {
        BoardAdapter::dead_tasks(self, queue, limit).await
    }

    async fn get(&self, id: &str) -> Result<Task, BoardError> {
        validate_task_id(id)?;
        let key = self.task_key(id);
        let entries = self
            .space
            .engine()
            .snapshot(std::slice::from_ref(&key))
            .await?;
        let now = self.space.now_millis();
        match entries.first().and_then(|e| e.value.as_deref()) {
            Some(bytes) => Ok(TaskRecord::decode(&key, id, bytes)?.to_task(now)),
            None => Err(BoardError::NotFound { id: id.to_owned() }),
        }
    }

    async fn list(&self) -> Result<Vec<Task>, BoardError> {
        let prefix = self.tasks_prefix();
        let keys = self.space.engine().backend().keys(&prefix).await?;
        let per_call = self.space.keys_per_call().max(1);
        let mut tasks = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(per_call) {
            let entries = self.space.engine().snapshot(chunk).await?;
            let now = self.space.now_millis();
            for entry in entries {
                // Records are never deleted; a key listed but gone is skipped, not invented.
                let Some(bytes) = entry.value.as_deref() else {
                    continue;
                };
                let id = &entry.key[prefix.len()..];
                tasks.push(TaskRecord::decode(&entry.key, id, bytes)?.to_task(now));
            }
        }
        tasks.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tasks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_backend::ManualClock;
    use coord_memory::SingleProcessMemoryBackend;

    /// A board over a fresh store, its clock standing still.
    fn board() -> BoardAdapter {
        let backend = Arc::new(SingleProcessMemoryBackend::new("b").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        BoardAdapter::with_options(backend, BoardOptions::default().with_clock(clock))
    }

    /// Task `id` claimed for 5 s (by "agent").
    async fn claimed(board: &BoardAdapter, id: &str) -> ClaimedTask {
        board
            .claim(id, "agent", Duration::from_secs(5))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn warm_uncontended_claim_costs_one_round_trip() {
        let board = board();
        board.add(TaskSpec::new("a", b"x".to_vec())).await.unwrap();
        board
            .add(TaskSpec::new("b", b"y".to_vec()).with_deps(["a"]))
            .await
            .unwrap();
        let a = claimed(&board, "a").await;
        board.complete("a", &a.token, vec![]).await.unwrap();
        let before = board.stats();
        let b = claimed(&board, "b").await;
        assert_eq!(board.stats().round_trips() - before.round_trips(), 1);
        assert_eq!(b.fence, 1);
    }

    #[tokio::test]
    async fn a_pruned_dead_task_leaves_its_dependents_waiting() {
        use crate::retention::PruneOptions;
        let backend = Arc::new(SingleProcessMemoryBackend::new("b").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000_000));
        let board =
            BoardAdapter::with_options(backend, BoardOptions::default().with_clock(clock.clone()));
        let once = super::super::RetryPolicy::attempts(1);
        board
            .add(TaskSpec::new("a", vec![]).in_queue("q").with_retry(once))
            .await
            .unwrap();
        board
            .add(TaskSpec::new("b", vec![]).in_queue("q").with_deps(["a"]))
            .await
            .unwrap();
        let a = board
            .claim_next("q", "w", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(board.fail("a", &a.token, "no").await.unwrap(), Failed::Dead);
        clock.advance(Duration::from_secs(7200));
        let pruned = board
            .prune(&PruneOptions::after(Duration::from_secs(3600)))
            .await
            .unwrap();
        assert_eq!(pruned.removed, 1);
        let next = board.claim_next("q", "w", Duration::from_secs(5)).await;
        assert!(matches!(next, Ok(None)), "{next:?}");
        assert!(matches!(
            board.claim("b", "w", Duration::from_secs(5)).await,
            Err(BoardError::DependenciesNotMet { .. })
        ));
    }

    #[tokio::test]
    async fn completing_twice_with_the_same_token_is_a_no_op() {
        let board = board();
        board.add(TaskSpec::new("a", b"x".to_vec())).await.unwrap();
        let a = claimed(&board, "a").await;
        board.complete("a", &a.token, b"r".to_vec()).await.unwrap();
        board.complete("a", &a.token, b"r".to_vec()).await.unwrap();
        assert!(matches!(
            board.complete("a", &a.token, b"other".to_vec()).await,
            Err(BoardError::Completed { .. })
        ));
    }

    #[tokio::test]
    async fn malformed_task_record_is_reported() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("b").unwrap());
        backend
            .txn(&[], &[Mutation::put("board/task/t", b"{}".to_vec())])
            .await
            .unwrap();
        let board = BoardAdapter::new(backend);
        let err = board
            .claim("t", "agent", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, BoardError::Store(Error::MalformedRecord { .. })),
            "{err:?}"
        );
        assert!(matches!(
            board.list().await,
            Err(BoardError::Store(Error::MalformedRecord { .. }))
        ));
    }

    #[tokio::test]
    async fn too_many_dependencies_for_one_txn_are_refused_up_front() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("b").unwrap());
        let max = backend.limits().max_keys_per_call;
        let board = BoardAdapter::new(backend);
        // The task, its marker, the removal counter, each dependency and
        // its reverse-dependency entry.
        let fit = (max - 3) / 2;
        let deps: Vec<String> = (0..=fit).map(|i| format!("d{i}")).collect();
        assert!(matches!(
            board
                .add(TaskSpec::new("t", vec![]).with_deps(deps.clone()))
                .await,
            Err(BoardError::Invalid(InvalidInput::TooManyKeys { .. }))
        ));
        assert!(matches!(
            board.get("t").await,
            Err(BoardError::NotFound { .. })
        ));
        board
            .add(TaskSpec::new("t", vec![]).with_deps(deps[..fit].to_vec()))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn duplicate_dependencies_are_stored_once_and_self_dependency_refused() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("b").unwrap());
        let board = BoardAdapter::new(backend);
        board
            .add(TaskSpec::new("t", vec![]).with_deps(["a", "a", "b"]))
            .await
            .unwrap();
        assert_eq!(board.get("t").await.unwrap().deps, vec!["a", "b"]);
        assert!(matches!(
            board.add(TaskSpec::new("s", vec![]).with_deps(["s"])).await,
            Err(BoardError::Invalid(_))
        ));
    }
}
