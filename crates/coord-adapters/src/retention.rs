//! Retention: removing records that reached a final state long ago, without
//! reading the live ones.
//!
//! An adapter that moves a record into a final state (a completed side
//! effect) writes, in the same txn, an **index entry**
//! `<index>/<minute>/<key>`, where `<minute>` is the completion time in
//! minutes since the Unix epoch, zero-padded so keys sort by time. A
//! **cursor** record `<index>/cursor` holds the oldest minute that may still
//! have entries; the first completion creates it.
//!
//! A prune pass walks the minutes from the cursor up to `now - retention`,
//! listing one minute at a time, and for each entry removes the record and
//! the entry in one txn, asserting the record as it read it (so a record
//! that changed, or was re-created by a later run, stays; only its stale
//! entry goes). A minute left empty moves the cursor on (a CAS: several
//! pruners may run at once). A pass does at most `max_records` removals and
//! `max_minutes` listings, and says whether more is left.
//!
//! **Removals only move forward.** Every removal of a record that a
//! decision may create over "missing" (a board task) also rewrites the
//! index's removal counter `<index>/removed` in its txn, and the decision
//! that creates the record asserts that counter. A creation whose answer
//! was lost is settled by resending it (docs/shapes.md, "Fault model"):
//! that is sound only while the asserted state cannot come back, and a
//! removal brings "missing" back. The counter never does: a copy of the
//! creation held back in the server until after the record was created,
//! completed and pruned is rejected when it lands.
//!
//! **Clocks.** An entry is written with the completing instance's clock,
//! but never below the cursor (the completion's txn asserts the cursor, so
//! it sees where the cursor is): an instance whose clock is behind indexes
//! under the cursor's minute instead of its own, and its record is removed
//! when a prune reaches that minute. An entry written under the cursor's
//! own minute also rewrites the cursor, and a prune moves the cursor past a
//! minute only if the cursor is still at the version it read before
//! listing that minute, so an entry landing between a prune's listing and
//! its move is listed again, never skipped. Records completed before the index
//! existed have no entry and are kept.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use coord_backend::{Error, InvalidInput, Mutation};

use crate::cas::{CasEngine, Decision, View};

/// Minutes since the Unix epoch of `at_ms`, as an index component.
fn minute_of(at_ms: u64) -> u64 {
    at_ms / 60_000
}

/// Where one adapter's index lives: `<prefix>` + `cursor`, and
/// `<prefix><minute>/<key>` per entry.
#[derive(Clone, Debug)]
pub(crate) struct RetentionIndex {
    prefix: Cow<'static, str>,
}

impl RetentionIndex {
    /// An index under `prefix` (ends with `/`).
    pub(crate) const fn new(prefix: &'static str) -> Self {
        RetentionIndex {
            prefix: Cow::Borrowed(prefix),
        }
    }

    /// An index under a prefix known at run time (ends with `/`).
    pub(crate) fn under(prefix: String) -> Self {
        RetentionIndex {
            prefix: Cow::Owned(prefix),
        }
    }

    /// The cursor record's key.
    pub(crate) fn cursor(&self) -> String {
        format!("{}cursor", self.prefix)
    }

    /// The removal counter's key (see the [module docs](self)).
    pub(crate) fn removals(&self) -> String {
        format!("{}removed", self.prefix)
    }

    /// The write counting one more removal, given a view holding the counter.
    pub(crate) fn count_removal(&self, view: &View) -> Result<Mutation, Error> {
        let key = self.removals();
        let removed = match view.value(&key) {
            None => 0,
            Some(bytes) => cursor_minute(Some(bytes))
                .ok_or_else(|| Error::malformed(key.clone(), "not a removal count"))?,
        };
        Ok(Mutation::put(
            key.as_str(),
            removed.saturating_add(1).to_string().into_bytes(),
        ))
    }

    /// The entry of `key` under `minute`.
    fn entry(&self, minute: u64, key: &str) -> String {
        format!("{}{minute:010}/{key}", self.prefix)
    }

    fn minute_prefix(&self, minute: u64) -> String {
        format!("{}{minute:010}/", self.prefix)
    }

    /// The writes that index `key` as final at `at_ms`, given a view that
    /// holds the cursor: the cursor when it does not exist yet (a key of the
    /// view, so asserted missing) or when the entry goes under its minute
    /// (see below), and the entry, written unasserted (its
    /// key is named by the record's own final write: rewriting it with the
    /// same empty value is right whatever it holds).
    ///
    /// The entry goes under the minute of `at_ms`, or under the cursor's
    /// when that is later: an instance whose clock is behind the one that
    /// created or moved the cursor would otherwise index below it, where no
    /// prune looks (the record keeps its true time, which is what a prune
    /// judges; its removal only comes that much later).
    pub(crate) fn final_writes(
        &self,
        view: &View,
        at_ms: u64,
        key: &str,
    ) -> (Option<Mutation>, Mutation) {
        let cursor = self.cursor();
        let at_minute = minute_of(at_ms);
        let (cursor_write, minute) = match view.value(&cursor) {
            // Created a minute back: the cursor only says where entries may
            // start, and one below the present keeps the completions of this
            // minute from each rewriting it (a hot key while a new index
            // fills, as every completion of the minute would contend on it).
            None => (
                Some(Mutation::put(
                    cursor.as_str(),
                    at_minute.saturating_sub(1).to_string().into_bytes(),
                )),
                at_minute,
            ),
            Some(stored) => match cursor_minute(Some(stored)) {
                // Indexed under the cursor's own minute, which a prune may
                // have listed as empty a moment ago and be about to move
                // past: rewrite the cursor (same minute, new version) so
                // that move is refused and the minute listed again.
                Some(at) if at >= at_minute => {
                    (Some(Mutation::put(cursor.as_str(), stored.to_vec())), at)
                }
                _ => (None, at_minute),
            },
        };
        (
            cursor_write,
            Mutation::put(self.entry(minute, key), Vec::new()),
        )
    }
}

/// Options of one prune pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneOptions {
    /// How long a record stays after it became final (at least one minute).
    pub retention: Duration,
    /// Most records one pass removes.
    pub max_records: usize,
    /// Most minutes of the index one pass lists.
    pub max_minutes: usize,
}

impl PruneOptions {
    /// Remove what became final more than `retention` ago, at most 1,000
    /// records and 1,440 minutes per pass.
    pub const fn after(retention: Duration) -> Self {
        PruneOptions {
            retention,
            max_records: 1000,
            max_minutes: 1440,
        }
    }

    /// With another record budget per pass (at least 1).
    pub const fn with_max_records(mut self, max: usize) -> Self {
        self.max_records = if max == 0 { 1 } else { max };
        self
    }

    fn check(&self) -> Result<(), Error> {
        if self.retention < Duration::from_secs(60) {
            return Err(Error::InvalidInput(InvalidInput::Argument(format!(
                "retention must be at least one minute (got {:?})",
                self.retention
            ))));
        }
        Ok(())
    }
}

/// What one prune pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Records removed.
    pub removed: u64,
    /// Whether the pass stopped at a budget (run it again).
    pub more: bool,
}

/// What to do with the record an entry points to.
pub(crate) enum Verdict {
    /// Final since before the cutoff: remove it (and the entry).
    Remove,
    /// Missing, or not the record this entry was written for: drop the entry.
    Stale,
    /// Final, but not long enough yet: keep both.
    Keep,
}

/// Where a pass at `now_ms` starts, once `options` are checked: the cutoff
/// (ms), the last minute the pass may reach, and the minute the index's
/// cursor names (`None`: nothing was ever indexed, or it is unreadable).
async fn pass_start(
    engine: &CasEngine,
    index: &RetentionIndex,
    now_ms: u64,
    options: &PruneOptions,
) -> Result<(u64, u64, Option<u64>), Error> {
    options.check()?;
    let cutoff_ms = now_ms.saturating_sub(crate::cas::whole_millis(options.retention));
    let cursor = engine.snapshot(&[index.cursor()]).await?;
    let first = cursor
        .first()
        .and_then(|e| cursor_minute(e.value.as_deref()));
    Ok((cutoff_ms, minute_of(cutoff_ms), first))
}

/// The number (a cursor's minute, a removal count) a stored value names,
/// if it is readable.
fn cursor_minute(value: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(value?).ok()?.parse().ok()
}

/// How many index entries a prune at `now_ms` would look at: the entries of
/// the minutes from the cursor up to the cutoff, at most
/// `options.max_minutes` of them (then `more`). An upper bound of what it
/// removes (a stale entry goes without a removal); nothing is written.
pub(crate) async fn due(
    engine: &CasEngine,
    index: &RetentionIndex,
    now_ms: u64,
    options: &PruneOptions,
) -> Result<Pruned, Error> {
    let (_, last, first) = pass_start(engine, index, now_ms, options).await?;
    let mut counted = Pruned::default();
    let Some(first) = first else {
        return Ok(counted);
    };
    for (listed, minute) in (first..=last).enumerate() {
        if listed >= options.max_minutes {
            counted.more = true;
            break;
        }
        counted.removed += engine
            .backend()
            .keys(&index.minute_prefix(minute))
            .await?
            .len() as u64;
    }
    Ok(counted)
}

/// What removing one entry's record came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// The record and its entry are gone.
    Removed,
    /// Final, but not long enough yet: both stay (the entry holds its minute).
    Kept,
    /// The entry was stale or another pruner took it: nothing to count.
    Gone,
}

/// Remove `record` and `entry` in one txn when `judge` says so; the
/// removal of adapters whose records have nothing depending on them.
pub(crate) async fn remove_if<J>(
    engine: &CasEngine,
    record: &str,
    entry: &str,
    cutoff_ms: u64,
    judge: J,
) -> Result<Removal, Error>
where
    J: Fn(&View, &str, u64) -> Result<Verdict, Error>,
{
    let keys = [record.to_owned(), entry.to_owned()];
    engine
        .decide(&keys, |view| -> Result<Decision<Removal>, Error> {
            if view.value(entry).is_none() {
                return Ok(Decision::Return(Removal::Gone)); // another pruner took it
            }
            match judge(view, record, cutoff_ms)? {
                Verdict::Keep => Ok(Decision::Return(Removal::Kept)),
                Verdict::Stale => Ok(Decision::Commit {
                    mutations: vec![Mutation::delete(entry)],
                    then: Removal::Gone,
                }),
                Verdict::Remove => Ok(Decision::Commit {
                    mutations: vec![Mutation::delete(record), Mutation::delete(entry)],
                    then: Removal::Removed,
                }),
            }
        })
        .await
}

/// One prune pass over `index` at `now_ms`. `record_of` names the record an
/// entry's key points to; `remove(record, entry, cutoff_ms)` removes it
/// (usually [`remove_if`]), asserting what it read.
pub(crate) async fn prune<R, F>(
    engine: &CasEngine,
    index: &RetentionIndex,
    now_ms: u64,
    options: &PruneOptions,
    record_of: impl Fn(&str) -> String,
    remove: R,
) -> Result<Pruned, Error>
where
    R: Fn(String, String, u64) -> F,
    F: Future<Output = Result<Removal, Error>>,
{
    let (cutoff_ms, last, first) = pass_start(engine, index, now_ms, options).await?;
    let cursor_key = index.cursor();
    let mut pruned = Pruned::default();
    let mut listed = 0usize;
    let Some(mut minute) = first else {
        // Nothing was ever indexed (or the cursor is unreadable: keep all).
        return Ok(pruned);
    };
    while minute <= last {
        if listed >= options.max_minutes {
            pruned.more = true;
            return Ok(pruned);
        }
        listed += 1;
        // The cursor as it is before the listing: an entry written under
        // the cursor's minute after this read rewrites the cursor.
        let seen = engine.snapshot(std::slice::from_ref(&cursor_key)).await?[0].version;
        let prefix = index.minute_prefix(minute);
        let entries = engine.backend().keys(&prefix).await?;
        let mut left = false;
        for entry in &entries {
            if pruned.removed >= options.max_records as u64 {
                pruned.more = true;
                return Ok(pruned);
            }
            let record = record_of(&entry[prefix.len()..]);
            match remove(record, entry.clone(), cutoff_ms).await {
                Ok(Removal::Removed) => pruned.removed += 1,
                Ok(Removal::Kept) => left = true,
                Ok(Removal::Gone) => {}
                // A delete whose answer was lost: the next pass decides again.
                Err(e) if e.is_indeterminate() || e.is_retryable() => {
                    left = true;
                    pruned.more = true;
                }
                Err(e) => return Err(e),
            }
        }
        if left || minute == last {
            // The cutoff's own minute may still receive entries; a kept
            // entry holds its minute.
            return Ok(pruned);
        }
        // Move the cursor past the emptied minute (unless another pruner
        // did), if nothing was indexed under it since the listing.
        let step = engine
            .decide(
                std::slice::from_ref(&cursor_key),
                |view| -> Result<Decision<u64>, Error> {
                    let now_at = cursor_minute(view.value(&cursor_key)).unwrap_or(minute);
                    if now_at > minute {
                        return Ok(Decision::Return(now_at));
                    }
                    if view.version(&cursor_key) != seen {
                        // Rewritten by an entry of this minute: list it again.
                        return Ok(Decision::Return(minute));
                    }
                    Ok(Decision::Commit {
                        mutations: vec![Mutation::put(
                            cursor_key.as_str(),
                            format!("{}", minute + 1).into_bytes(),
                        )],
                        then: minute + 1,
                    })
                },
            )
            .await;
        minute = match step {
            Ok(next) => next,
            Err(e) if e.is_indeterminate() || e.is_retryable() => {
                pruned.more = true;
                return Ok(pruned);
            }
            Err(e) => return Err(e),
        };
    }
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use coord_backend::{Backend, ManualClock};
    use coord_memory::SingleProcessMemoryBackend;

    use super::PruneOptions;
    use crate::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};

    /// The count a dry run shows: every completion past the window, before
    /// a prune; none after it; none inside the window.
    #[tokio::test]
    async fn candidates_count_what_a_prune_removes() {
        let backend: Arc<dyn Backend> =
            Arc::new(SingleProcessMemoryBackend::new("candidates").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
        let adapter = Arc::new(SideEffectAdapter::with_clock(backend, clock.clone()));
        let runner = Runner::new(adapter.clone());
        for i in 0..3 {
            runner
                .execute(
                    &Action::new(format!("k{i}"), "r"),
                    Duration::from_secs(30),
                    |_| async { Ok::<_, std::io::Error>(EffectResult::from(&b"ok"[..])) },
                )
                .await
                .unwrap();
        }
        let window = PruneOptions::after(Duration::from_secs(3600));
        assert_eq!(adapter.prune_candidates(&window).await.unwrap().removed, 0);
        clock.advance(Duration::from_secs(2 * 3600));
        assert_eq!(adapter.prune_candidates(&window).await.unwrap().removed, 3);
        assert_eq!(adapter.prune(&window).await.unwrap().removed, 3);
        assert_eq!(adapter.prune_candidates(&window).await.unwrap().removed, 0);
    }
}
