//! The three storage primitives every coord store implements, and nothing else.
//!
//! A backend stores `key -> (version, value bytes)` inside one **namespace** and
//! offers exactly three operations (see [`Backend`]):
//!
//! - **snapshot(keys)**: a consistent view of several keys at one instant;
//! - **txn(asserts, mutations)**: all asserted versions hold → apply every
//!   mutation and bump each written key's version by exactly 1; otherwise apply
//!   nothing and return the current entries of the asserted keys;
//! - **keys(prefix)**: every existing key under a literal prefix.
//!
//! Locks, task boards, side effects and the scheduler are decided once, in
//! `coord-adapters`, on top of these primitives. A store's only job is to make
//! them atomic. This crate knows nothing of adapters and nothing of any
//! concrete store.
//!
//! ```
//! use coord_backend::{Assert, Mutation, Version};
//!
//! // "create `job/1` only if it does not exist yet"
//! let asserts = [Assert::missing("job/1")];
//! let mutations = [Mutation::put("job/1", b"pending".to_vec())];
//! assert_eq!(asserts[0].version, Version::MISSING);
//! # let _ = mutations;
//! ```

mod backend;
mod changes;
mod clock;
mod error;
pub mod metered;
pub mod reclaim;
pub mod redact;
mod setters;
mod store_url;
mod types;
mod validate;

pub use backend::{Backend, BackendExt, Limits};
pub use changes::{ChangeFeed, ChangeWatch, Changed, Changes};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, InvalidInput, Result};
pub use metered::{Metered, TXN_SECONDS, TXN_TOTAL};
pub use reclaim::{ReclaimOptions, Reclaimed};
pub use store_url::{StoreUrl, DEFAULT_NAMESPACE};
pub use types::{Assert, Entry, Mutation, TxnOutcome, Version};
pub use validate::{
    distinct_keys, validate_keys, validate_namespace, validate_prefix, validate_txn,
};
