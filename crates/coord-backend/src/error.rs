use std::error::Error as StdError;

/// Errors of every coord layer that touches a store.
///
/// Variants name outcomes a caller acts on differently:
/// retry later ([`Error::Unavailable`]), re-read to learn what happened
/// ([`Error::Indeterminate`]), stop and alert ([`Error::MalformedRecord`]),
/// fix the call ([`Error::InvalidInput`], [`Error::Config`]).
/// A rejected txn is **not** an error (see [`crate::TxnOutcome`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store could not be reached or refused the request before doing
    /// anything (connection refused, timeout before sending, pool exhausted).
    /// Nothing was written; retrying is safe.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The underlying client error, when there is one.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },

    /// A txn was sent but its answer was lost (connection broken, timeout
    /// after sending, failure during COMMIT): the store may or may not have
    /// applied it. Never report this as `applied = false` and never retry it
    /// blindly; re-read the keys and look for a token of your own write.
    #[error("txn outcome indeterminate: {message}")]
    Indeterminate {
        /// What failed.
        message: String,
        /// The underlying client error, when there is one.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync>>,
    },

    /// The bytes stored under a key are not what this layer wrote (another
    /// writer shares the namespace, or the store's own bookkeeping is damaged).
    /// Acting on them would decide from someone else's state.
    #[error("malformed record at {key:?}: {reason}")]
    MalformedRecord {
        /// The key whose record could not be decoded.
        key: String,
        /// Why it could not be decoded.
        reason: String,
    },

    /// A compare-and-swap loop kept losing races and gave up after a bounded
    /// number of attempts (very high contention, or a store that is not atomic).
    #[error("conflict: gave up after {attempts} attempts")]
    ConflictRetriesExhausted {
        /// How many txns were tried.
        attempts: u32,
    },

    /// The call was refused before touching the store; nothing changed.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),

    /// The store does not offer this operation (for example
    /// [`crate::Backend::reclaim`] on a store that does not implement it).
    /// Nothing changed.
    #[error("{store} does not support {what}")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// The store's [`crate::Backend::store_name`].
        store: &'static str,
    },

    /// A URL or configuration could not be understood.
    #[error("configuration error: {0}")]
    Config(String),

    /// Clients of different storage formats write the namespace, and going
    /// on could hand a version out twice: a reclaim while an older client
    /// was seen (or records from before formats were announced are there),
    /// or a client older than the format the namespace requires (see
    /// [`crate::reclaim`], "Mixed versions"). Nothing changed; `action` says
    /// what to do (upgrade or stop the older clients).
    #[error(
        "storage format mismatch (this client writes format {ours}, found {theirs}): {action}"
    )]
    FormatMismatch {
        /// The format this client writes.
        ours: u32,
        /// The other format: an announced older client's, or the
        /// namespace's required one.
        theirs: u32,
        /// What happened and what to do.
        action: String,
    },
}

/// Why a call was refused as invalid. Nothing was stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// A key was the empty string.
    #[error("empty key")]
    EmptyKey,
    /// A key was longer than the store allows.
    #[error("key of {len} bytes is longer than the limit of {max} bytes")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The store's limit.
        max: usize,
    },
    /// A key (or prefix, or namespace) contained a NUL byte.
    #[error("NUL byte in {0:?}")]
    NulByte(String),
    /// A value was larger than the store's documented limit.
    #[error("value of {len} bytes for key {key:?} is larger than the limit of {max} bytes")]
    ValueTooLarge {
        /// The key being written.
        key: String,
        /// The value's length in bytes.
        len: usize,
        /// The store's limit.
        max: usize,
    },
    /// One txn wrote the same key twice (the result would be ambiguous).
    #[error("key {0:?} is written twice in one txn")]
    DuplicateMutation(String),
    /// One txn asserted the same key at two different versions (it can never apply).
    #[error("key {0:?} is asserted at two different versions in one txn")]
    ConflictingAsserts(String),
    /// A txn or snapshot named more keys than the store accepts at once.
    #[error("{count} keys in one call; the limit is {max}")]
    TooManyKeys {
        /// How many keys were named.
        count: usize,
        /// The store's limit.
        max: usize,
    },
    /// A namespace was empty, too long or used a reserved character.
    #[error("invalid namespace {namespace:?}: {reason}")]
    Namespace {
        /// The namespace given.
        namespace: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An argument of a higher layer was invalid (empty lock key, zero TTL, ...).
    #[error("{0}")]
    Argument(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A store that could not be reached; `source` is the client's error.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A txn whose outcome is unknown; `source` is the client's error.
    pub fn indeterminate(
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        Error::Indeterminate {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A record that could not be decoded.
    pub fn malformed(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::MalformedRecord {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// Whether retrying the same call later may succeed without any other
    /// action ([`Error::Unavailable`] and [`Error::ConflictRetriesExhausted`]).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::ConflictRetriesExhausted { .. }
        )
    }

    /// Whether this is [`Error::Indeterminate`].
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Error::Indeterminate { .. })
    }
}
