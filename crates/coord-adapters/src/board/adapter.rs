//! [`BoardAdapter`]: the task board decided over the three primitives of any backend.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{Backend, Error, InvalidInput, Mutation};

use super::record::{ClaimRecord, DoneRecord, TaskRecord};
use super::{
    validate_claim, validate_spec, validate_task_id, validate_ttl, Board, BoardError, ClaimedTask,
    Task, TaskSpec,
};
use crate::cas::record::time_at;
use crate::cas::{
    record_options, whole_millis, CasStats, Decision, LeaseRecord, Nonce, Record, RecordSpace, View,
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
    space: RecordSpace,
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
        }
    }

    /// Store calls made so far (for tests and benchmarks).
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    fn tasks_prefix(&self) -> String {
        format!("{}task/", self.space.prefix())
    }

    fn task_key(&self, id: &str) -> String {
        format!("{}task/{id}", self.space.prefix())
    }

    /// Where completions are indexed by minute, for [`BoardAdapter::prune`].
    fn done_index(&self) -> RetentionIndex {
        RetentionIndex::under(format!("{}done/", self.space.prefix()))
    }

    /// The prefix of `dep`'s reverse-dependency entries. The id's length
    /// comes first, so the prefix of `a` is not a prefix of `a/b`'s.
    fn dependents_prefix(&self, dep: &str) -> String {
        format!("{}rdep/{}:{dep}/", self.space.prefix(), dep.len())
    }

    /// The entry saying `id` depends on `dep`, which was not completed when
    /// `id` was added: it exists from then until `id` completes, so a prune
    /// of `dep` finds every task still waiting on it.
    fn dependent_key(&self, dep: &str, id: &str) -> String {
        format!("{}{id}", self.dependents_prefix(dep))
    }

    fn read(&self, view: &View, id: &str) -> Result<Option<TaskRecord>, Error> {
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
                let mut redefined = TaskRecord {
                    payload: spec.payload.clone(),
                    deps: spec.deps.clone(),
                    met,
                    claim: None,
                    nonce: Nonce::default(),
                    ..record
                };
                // Entries are named by this task, whose record this txn
                // rewrites (asserted).
                Ok(Decision::CommitWithUnasserted {
                    mutations: vec![redefined.put(&key)],
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
        let per_txn = (self.space.keys_per_call().saturating_sub(3) / 2).max(1);
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
                    let at_ms = match self.read(view, id)? {
                        Some(TaskRecord {
                            done:
                                Some(DoneRecord {
                                    at_ms: Some(at), ..
                                }),
                            ..
                        }) => at,
                        // Not completed (added again since), or completed
                        // before completions had a time: a stale entry.
                        _ => {
                            return Ok(Decision::Commit {
                                mutations: vec![Mutation::delete(entry)],
                                then: Step::Done(Removal::Gone),
                            })
                        }
                    };
                    if at_ms > cutoff_ms {
                        return Ok(Decision::Return(Step::Done(Removal::Kept)));
                    }
                    let mut mutations = Vec::new();
                    for waiter in batch {
                        if view.value(waiter).is_none() {
                            continue;
                        }
                        let dependent = &waiter[prefix.len()..];
                        if let Some(mut record) = self.read(view, dependent)? {
                            let waits = record.done.is_none()
                                && record.deps.iter().any(|d| d == id)
                                && !record.met.iter().any(|d| d == id);
                            if waits {
                                record.met.push(id.to_owned());
                                mutations.push(record.put(self.task_key(dependent)));
                            }
                        }
                        mutations.push(Mutation::delete(waiter.as_str()));
                    }
                    if last {
                        mutations.push(Mutation::delete(key.as_str()));
                        mutations.push(Mutation::delete(entry));
                        // "Missing" comes back: count it, so a late copy of
                        // the add that created the task cannot land now.
                        mutations.push(self.done_index().count_removal(view)?);
                        return Ok(Decision::Commit {
                            mutations,
                            then: Step::Done(Removal::Removed),
                        });
                    }
                    if mutations.is_empty() {
                        // Every listed entry went meanwhile: list again.
                        return Ok(Decision::Return(Step::More));
                    }
                    Ok(Decision::Commit {
                        mutations,
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
        let count = 2 + 2 * spec.deps.len();
        if count > max {
            return Err(BoardError::Invalid(InvalidInput::TooManyKeys {
                count,
                max,
            }));
        }
        Ok(())
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

/// Write `record` (at `key`) holding `claim`, and answer the claim to its
/// holder: what a claim and a renewal decide once they may.
fn grant(key: &str, record: TaskRecord, claim: ClaimRecord) -> Decision<ClaimedTask> {
    let mut granted = TaskRecord {
        claim: Some(claim.clone()),
        nonce: Nonce::default(),
        ..record
    };
    Decision::Commit {
        mutations: vec![granted.put(key)],
        then: granted.claimed_task(claim),
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
        let (spec, key, mut keys) = self.prepare(task)?;
        keys.push(self.done_index().removals());
        self.space
            .engine()
            .decide::<(), BoardError, _>(&keys, |view| {
                match self.read(view, &spec.id) {
                    Ok(Some(existing)) => {
                        if existing.payload == spec.payload && existing.deps == spec.deps {
                            Ok(Decision::Return(()))
                        } else {
                            Err(BoardError::AlreadyExists {
                                id: spec.id.clone(),
                            })
                        }
                    }
                    Ok(None) => {
                        let (met, entries) = self.settle_deps(view, &spec.id, &spec.deps, &[])?;
                        let mut record = TaskRecord {
                            id: spec.id.clone(),
                            payload: spec.payload.clone(),
                            deps: spec.deps.clone(),
                            met,
                            fence: 0,
                            claim: None,
                            done: None,
                            nonce: Nonce::default(),
                        };
                        // The entries are fresh by construction: named by this
                        // task, whose record this txn creates (asserted missing).
                        Ok(Decision::CommitWithUnasserted {
                            mutations: vec![record.put(&key)],
                            unasserted: entries,
                            then: (),
                        })
                    }
                    Err(e) => Err(e.into()),
                }
            })
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
            .decide::<ClaimedTask, BoardError, _>(std::slice::from_ref(&key), |view| {
                let Some(record) = self.read(view, id)? else {
                    return Err(BoardError::NotFound { id: id.to_owned() });
                };
                if record.done.is_some() {
                    return Err(BoardError::Completed { id: id.to_owned() });
                }
                if let Some(claim) = record.live_claim(now) {
                    return Err(BoardError::AlreadyClaimed {
                        id: id.to_owned(),
                        agent: claim.agent.clone(),
                        expires_at: time_at(claim.lease.expires_ms),
                    });
                }
                // The dependency list lives in the record, so its keys are only
                // known now. Whatever the list says in THIS view is read and
                // asserted; if it changed since an earlier round, the new keys
                // are added here (and stale extra keys are merely asserted too).
                let unread: Vec<String> = record
                    .deps
                    .iter()
                    .filter(|d| !record.met.contains(d))
                    .map(|d| self.task_key(d))
                    .filter(|k| !view.contains(k))
                    .collect();
                if !unread.is_empty() {
                    return Ok(Decision::Expand(unread));
                }
                let mut pending = Vec::new();
                for dep in record.deps.iter().filter(|d| !record.met.contains(d)) {
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
                // A first claim takes the record's version: a record
                // added again after a prune has a version above every
                // version (so every fence) its earlier life had.
                let fence = if record.fence == 0 {
                    view.version(&key).0.max(1)
                } else {
                    record.fence + 1
                };
                let claim = ClaimRecord {
                    agent: agent.to_owned(),
                    lease: LeaseRecord::new(token.clone(), expires_ms),
                };
                Ok(grant(&key, TaskRecord { fence, ..record }, claim))
            })
            .await;
        with_fence(answer)
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
                Ok(grant(&key, record, ClaimRecord { lease, ..claim }))
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
                let mut released = TaskRecord {
                    claim: None,
                    nonce: Nonce::default(),
                    ..record
                };
                Ok(Decision::Commit {
                    mutations: vec![released.put(&key)],
                    then: (),
                })
            })
            .await
    }

    #[tracing::instrument(name = "board.complete", skip_all, fields(
        key = %id, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn complete(&self, id: &str, token: &str, result: Vec<u8>) -> Result<(), BoardError> {
        validate_task_id(id)?;
        if token.is_empty() {
            return Err(BoardError::Invalid(InvalidInput::Argument(
                "empty claim token".into(),
            )));
        }
        let key = self.task_key(id);
        let index = self.done_index();
        let keys = [key.clone(), index.cursor()];
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<(), BoardError, _>(&keys, |view| {
                let record = self.read(view, id)?;
                // A retry of the completion that already landed is a no-op.
                if let Some(done) = record.as_ref().and_then(|r| r.done.as_ref()) {
                    if done.token == token && done.result == result {
                        return Ok(Decision::Return(()));
                    }
                }
                let record = self.holder_check(record.as_ref(), id, token, now)?.clone();
                let agent = record
                    .claim
                    .as_ref()
                    .map(|c| c.agent.clone())
                    .unwrap_or_default();
                // The task no longer waits on anything: its reverse-dependency
                // entries go (nothing writes them again once it is completed).
                // (A task stored before entries existed may list more
                // dependencies than fit: it has no entries to delete.)
                let budget = self.space.keys_per_call().saturating_sub(3);
                let mut unasserted: Vec<Mutation> = record
                    .deps
                    .iter()
                    .filter(|d| !record.met.contains(d))
                    .take(budget)
                    .map(|d| Mutation::delete(self.dependent_key(d, id)))
                    .collect();
                let (cursor, entry) = index.final_writes(view, now, id);
                unasserted.push(entry);
                let mut completed = TaskRecord {
                    claim: None,
                    done: Some(DoneRecord {
                        agent,
                        token: token.to_owned(),
                        result: result.clone(),
                        at_ms: Some(now),
                    }),
                    nonce: Nonce::default(),
                    ..record
                };
                let mut mutations = vec![completed.put(&key)];
                mutations.extend(cursor);
                Ok(Decision::CommitWithUnasserted {
                    mutations,
                    unasserted,
                    then: (),
                })
            })
            .await
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
        // The task, each dependency and its reverse-dependency entry.
        let fit = (max - 1) / 2;
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
