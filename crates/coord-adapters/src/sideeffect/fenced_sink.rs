//! [`FencedSink`]: the downstream half of fencing, and [`BackendFencedSink`]
//! over the primitives.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use coord_backend::{Backend, Mutation};
use serde::{Deserialize, Serialize};

use super::adapter::Step;
use super::error::SideEffectError;
use super::record::sink_key;
use super::types::Fence;
use crate::cas::{record_kind, Nonce, Record};
use crate::{CasEngine, Decision};

/// A downstream resource that refuses writes from stale holders.
///
/// Contract (every implementation):
/// 1. `presented` **lower** than the highest fence seen for the resource →
///    [`SideEffectError::FenceStale`] and **no write at all** (nothing partial);
/// 2. otherwise the write is applied and the highest seen becomes `presented`;
///    an **equal** fence is allowed (several writes of one holder);
/// 3. the comparison and the write (fence update included) are **one atomic
///    step**. "Read the highest, compare, then write" in three steps lets two
///    holders pass the check together and the older write land last.
///
/// In SQL the comparison belongs in the same statement as the data write:
///
/// ```sql
/// UPDATE accounts
///    SET balance = $3, fence = $1
///  WHERE id = $2 AND fence <= $1;
/// -- 0 rows updated (and the row exists) → the presented fence is stale:
/// -- report FenceStale; nothing was written.
/// ```
///
/// The [`Store`](super::SideEffectStore) decides who may act; the sink decides
/// whether an act's result may land. They are independent.
#[async_trait]
pub trait FencedSink: Send + Sync + Debug {
    /// What one write carries (mutations, a SQL statement, ...).
    type Write: Send + 'static;

    /// Apply `write` to `resource` if `presented` is not lower than the
    /// highest fence seen there, updating the highest seen in the same step.
    async fn write_fenced(
        &self,
        resource: &str,
        presented: Fence,
        write: Self::Write,
    ) -> Result<(), SideEffectError>;
}

#[derive(Serialize, Deserialize)]
struct SinkRecord {
    fence: u64,
    #[serde(alias = "w")]
    nonce: Nonce,
}

record_kind!(SinkRecord, "a fenced sink record");

/// A [`FencedSink`] over the three primitives: the highest fence seen lives
/// in `se/sink/<resource>`, and one txn asserts it and applies the data
/// mutations together with the fence update.
///
/// Data keys are the caller's (any key outside the reserved `se/` prefix);
/// they are asserted too, so a concurrent write to them makes the txn decide
/// again instead of overwriting blindly.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use coord_adapters::sideeffect::{BackendFencedSink, Fence, FencedSink, SideEffectError};
/// use coord_backend::Mutation;
/// use coord_memory::SingleProcessMemoryBackend;
///
/// let sink = BackendFencedSink::new(Arc::new(SingleProcessMemoryBackend::new("sink-docs")?));
/// sink.write_fenced("ledger", Fence(7), vec![Mutation::put("ledger/total", "70")]).await?;
/// sink.write_fenced("ledger", Fence(7), vec![Mutation::put("ledger/total", "71")]).await?; // equal: allowed
/// let late = sink.write_fenced("ledger", Fence(6), vec![Mutation::put("ledger/total", "60")]).await;
/// assert!(matches!(late, Err(SideEffectError::FenceStale)));
/// assert_eq!(sink.highest_seen("ledger").await?, Some(Fence(7)));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct BackendFencedSink {
    engine: CasEngine,
}

impl BackendFencedSink {
    /// A sink over `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_engine(CasEngine::new(backend))
    }

    /// A sink deciding through `engine`.
    pub fn with_engine(engine: CasEngine) -> Self {
        BackendFencedSink { engine }
    }

    /// The CAS engine (round-trip counters).
    pub fn engine(&self) -> &CasEngine {
        &self.engine
    }

    /// The highest fence accepted for `resource` (`None`: no write yet).
    pub async fn highest_seen(&self, resource: &str) -> Result<Option<Fence>, SideEffectError> {
        let key = sink_key(resource);
        let entries = self.engine.snapshot(std::slice::from_ref(&key)).await?;
        let record = SinkRecord::from_value(&key, entries[0].value.as_deref())?;
        Ok(record.map(|r| Fence(r.fence)))
    }
}

#[async_trait]
impl FencedSink for BackendFencedSink {
    type Write = Vec<Mutation>;

    #[tracing::instrument(name = "sideeffect.write_fenced", skip_all, fields(
        key = %resource, store = self.engine.store_name(), fence = presented.0,
    ))]
    async fn write_fenced(
        &self,
        resource: &str,
        presented: Fence,
        write: Vec<Mutation>,
    ) -> Result<(), SideEffectError> {
        if resource.is_empty() {
            return Err(SideEffectError::InvalidAction("empty resource".into()));
        }
        if let Some(reserved) = write.iter().find(|m| m.key().starts_with("se/")) {
            return Err(SideEffectError::InvalidAction(format!(
                "key {:?} is in the reserved se/ prefix",
                reserved.key()
            )));
        }
        let fk = sink_key(resource);
        let mut keys = vec![fk.clone()];
        keys.extend(write.iter().map(|m| m.key().to_owned()));
        // The fence record's nonce makes every commit distinguishable
        // (indeterminate txns), even when the data repeats.
        self.engine
            .decide(&keys, |view| -> Step<()> {
                let seen = SinkRecord::read(view, &fk)?;
                if seen.is_some_and(|s| presented.0 < s.fence) {
                    return Err(SideEffectError::FenceStale);
                }
                let mut mutations = write.clone();
                let mut fenced = SinkRecord {
                    fence: presented.0,
                    nonce: Nonce::default(),
                };
                mutations.push(fenced.put(&fk));
                Ok(Decision::Commit {
                    mutations,
                    then: (),
                })
            })
            .await
    }
}
