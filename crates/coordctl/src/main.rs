//! coordctl (work in progress).
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
fn main() {}
