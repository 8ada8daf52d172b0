//! Typed payloads and results: a task's bytes as the JSON of a serde type.
//!
//! # Contract
//!
//! - [`TaskSpec::json`] encodes a payload with `serde_json`;
//!   [`ClaimedTask::payload_json`] and [`Task::payload_json`] decode it,
//!   [`Task::result_json`] decodes a completed task's result, and
//!   [`TypedBoard::complete_json`] completes a task with an encoded result.
//! - A value that does not encode (a map with non-string keys, a failing
//!   `Serialize`) or bytes that are not the JSON of the asked type give
//!   [`BoardError::Payload`], naming the task: nothing is written, and the
//!   stored bytes are left as they are (raw-byte readers still see them).
//! - The bytes are plain JSON, so a task added with a typed payload can be
//!   read as raw bytes and the other way round.
//!
//! # Boundary
//!
//! The type is not stored: the reader names it, and a payload written by an
//! older version of a type decodes only as far as serde's rules for that
//! type allow (`#[serde(default)]` on new fields keeps old tasks readable).

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Board, BoardError, ClaimedTask, Task, TaskSpec, TaskState};

fn encode<T: Serialize + ?Sized>(id: &str, value: &T) -> Result<Vec<u8>, BoardError> {
    serde_json::to_vec(value).map_err(|e| BoardError::Payload {
        id: id.to_owned(),
        reason: format!("cannot encode as JSON: {e}"),
    })
}

fn decode<T: DeserializeOwned>(id: &str, what: &str, bytes: &[u8]) -> Result<T, BoardError> {
    serde_json::from_slice(bytes).map_err(|e| BoardError::Payload {
        id: id.to_owned(),
        reason: format!(
            "its {what} is not the JSON of {}: {e}",
            std::any::type_name::<T>()
        ),
    })
}

impl TaskSpec {
    /// A task without dependencies whose payload is `payload` as JSON.
    ///
    /// ```
    /// use coord_adapters::board::TaskSpec;
    /// #[derive(serde::Serialize)]
    /// struct Resize { image: String, width: u32 }
    ///
    /// let spec = TaskSpec::json("resize-1", &Resize { image: "a.png".into(), width: 64 })?
    ///     .in_queue("images");
    /// assert_eq!(spec.payload, br#"{"image":"a.png","width":64}"#);
    /// # Ok::<(), coord_adapters::board::BoardError>(())
    /// ```
    pub fn json<T: Serialize + ?Sized>(
        id: impl Into<String>,
        payload: &T,
    ) -> Result<Self, BoardError> {
        let id = id.into();
        let payload = encode(&id, payload)?;
        Ok(TaskSpec::new(id, payload))
    }
}

impl ClaimedTask {
    /// The payload, decoded from JSON as a `T`.
    pub fn payload_json<T: DeserializeOwned>(&self) -> Result<T, BoardError> {
        decode(&self.id, "payload", &self.payload)
    }
}

impl Task {
    /// The payload, decoded from JSON as a `T`.
    pub fn payload_json<T: DeserializeOwned>(&self) -> Result<T, BoardError> {
        decode(&self.id, "payload", &self.payload)
    }

    /// The result of a completed task, decoded from JSON as an `R`;
    /// `Ok(None)` while the task is not completed.
    pub fn result_json<R: DeserializeOwned>(&self) -> Result<Option<R>, BoardError> {
        match &self.state {
            TaskState::Completed { result, .. } => decode(&self.id, "result", result).map(Some),
            _ => Ok(None),
        }
    }
}

/// Typed conveniences over any [`Board`] (implemented for every one).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::board::{Board, BoardAdapter, TaskSpec, TypedBoard};
/// use coord_memory::SingleProcessMemoryBackend;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Resize { image: String, width: u32 }
/// #[derive(Serialize, Deserialize, Debug, PartialEq)]
/// struct Resized { bytes: u64 }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let board = BoardAdapter::new(Arc::new(SingleProcessMemoryBackend::new("typed")?));
/// board.add(TaskSpec::json("r1", &Resize { image: "a.png".into(), width: 64 })?.in_queue("images")).await?;
///
/// let task = board.claim_next("images", "worker-1", Duration::from_secs(30)).await?.unwrap();
/// let job: Resize = task.payload_json()?;
/// board.complete_json(&task.id, &task.token, &Resized { bytes: u64::from(job.width) * 100 }).await?;
///
/// let done = board.get("r1").await?;
/// assert_eq!(done.result_json::<Resized>()?, Some(Resized { bytes: 6400 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[async_trait]
pub trait TypedBoard: Board {
    /// [`Board::complete`] with `result` encoded as JSON.
    async fn complete_json<R: Serialize + Sync + ?Sized>(
        &self,
        id: &str,
        token: &str,
        result: &R,
    ) -> Result<(), BoardError> {
        let bytes = encode(id, result)?;
        self.complete(id, token, bytes).await
    }
}

impl<B: Board + ?Sized> TypedBoard for B {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use coord_memory::SingleProcessMemoryBackend;
    use serde::{Deserialize, Serialize};

    use super::super::{Board, BoardAdapter, BoardError, TaskSpec, TypedBoard};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Job {
        n: u32,
    }

    fn board() -> BoardAdapter {
        BoardAdapter::new(Arc::new(SingleProcessMemoryBackend::new("typed").unwrap()))
    }

    #[tokio::test]
    async fn a_payload_of_another_type_is_a_typed_error_and_the_task_stays() {
        let board = board();
        board
            .add(TaskSpec::new("raw", b"not json".to_vec()))
            .await
            .unwrap();
        let claimed = board
            .claim("raw", "a", Duration::from_secs(30))
            .await
            .unwrap();
        match claimed.payload_json::<Job>() {
            Err(BoardError::Payload { id, reason }) => {
                assert_eq!(id, "raw");
                assert!(reason.contains("payload"), "{reason}");
            }
            other => panic!("expected a payload error, got {other:?}"),
        }
        // Nothing changed: the raw bytes are still there, the claim still holds.
        assert_eq!(board.get("raw").await.unwrap().payload, b"not json");
        board
            .complete_json("raw", &claimed.token, &Job { n: 7 })
            .await
            .unwrap();
        let done = board.get("raw").await.unwrap();
        assert_eq!(done.result_json::<Job>().unwrap(), Some(Job { n: 7 }));
        assert!(matches!(
            done.result_json::<Vec<String>>(),
            Err(BoardError::Payload { .. })
        ));
    }

    #[tokio::test]
    async fn a_result_that_does_not_encode_completes_nothing() {
        let board = board();
        board
            .add(TaskSpec::json("t", &Job { n: 1 }).unwrap())
            .await
            .unwrap();
        let claimed = board
            .claim("t", "a", Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(claimed.payload_json::<Job>().unwrap(), Job { n: 1 });
        // JSON object keys must be strings.
        let unencodable: BTreeMap<Vec<u8>, u8> = [(vec![1u8], 1u8)].into_iter().collect();
        assert!(matches!(
            board.complete_json("t", &claimed.token, &unencodable).await,
            Err(BoardError::Payload { .. })
        ));
        assert_eq!(
            board.get("t").await.unwrap().result_json::<Job>().unwrap(),
            None
        );
        assert!(matches!(
            TaskSpec::json("bad", &unencodable),
            Err(BoardError::Payload { .. })
        ));
    }
}
