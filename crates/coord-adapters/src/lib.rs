//! The one copy of coord's decision logic, over any [`coord_backend::Backend`].
//!
//! Every adapter decides the same way (see [`cas`]): read a view of the keys
//! it needs, decide, then commit with a txn that asserts the version of
//! EVERY key the decision read; when the txn is rejected, decide again from
//! the entries it returned. Stores only make the primitives atomic; no
//! adapter knows which store it runs on.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

pub mod board;
pub mod cas;
pub mod lock;
pub mod sideeffect;
pub mod token;

pub use cas::{CasEngine, CasOptions, CasStats, Decision, View};
pub use token::mint_token;
