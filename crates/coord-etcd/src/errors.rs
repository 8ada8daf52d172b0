//! Mapping etcd client errors onto coord's outcomes.
//!
//! The one distinction that matters for a txn: did etcd certainly NOT apply
//! it? Only two kinds of errors prove that:
//! - the connection was never established (`tonic::ConnectError` in the
//!   error chain): nothing was sent → [`Error::Unavailable`];
//! - etcd answered with a refusal it makes before proposing anything to raft
//!   (bad credentials, request too large, too many ops, no space): a gRPC
//!   status from the server (no local cause) whose message is etcd's own.
//!
//! Everything else after sending (reset connection, HTTP/2 error, deadline,
//! `etcdserver: request timed out`, leader lost) may or may not have
//! committed → [`Error::Indeterminate`]. Reads are always safe to retry, so
//! their failures are [`Error::Unavailable`].

use std::error::Error as StdError;

use coord_backend::{Error, InvalidInput};
use tonic::Code;

/// Whether the failed call could have changed anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// A read (snapshot, keys): failures are retryable.
    Read,
    /// A txn with writes: failures after sending are indeterminate.
    Write,
    /// Setting up the client (authenticating): a refusal is a configuration error.
    Connect,
}

fn never_connected(error: &(dyn StdError + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(err) = source {
        if err.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Map an etcd client error of a call (`what` names it in messages).
pub(crate) fn classify(error: etcd_client::Error, what: &str, call: Call) -> Error {
    let status = match &error {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::InvalidArgs(_)
        | etcd_client::Error::InvalidUri(_)
        | etcd_client::Error::EndpointError(_) => {
            return Error::Config(format!("etcd {what}: {error}"))
        }
        // Transport and I/O errors of the client come from setting up a
        // connection, before any request of ours was written.
        _ => return Error::unavailable(format!("etcd {what}: {error}"), error),
    };
    if never_connected(status) {
        return Error::unavailable(format!("etcd {what}: cannot connect"), error);
    }
    // A status decoded from the server's trailers carries no local source;
    // tonic's own statuses (I/O, HTTP/2, decoding) always do.
    let from_server = status.source().is_none();
    let message = status.message();
    let etcd_refusal = from_server
        && (message.starts_with("etcdserver: ")
            || message.starts_with("auth: ")
            || message.starts_with("grpc: received message larger than max"));
    if etcd_refusal && call == Call::Connect {
        return Error::Config(format!("etcd refused to {what}: {message}"));
    }
    if etcd_refusal || call != Call::Write {
        match status.code() {
            Code::Unauthenticated | Code::PermissionDenied if from_server => {
                return Error::Config(format!("etcd refused the credentials for {what}: {message}"))
            }
            Code::InvalidArgument if etcd_refusal => {
                return Error::InvalidInput(InvalidInput::Argument(format!(
                    "etcd refused {what}: {message} (check EtcdOptions::max_request_bytes / max_txn_ops \
                     against the server's --max-request-bytes / --max-txn-ops)"
                )))
            }
            // `etcdserver: request timed out` and friends: the request may be in the raft log.
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Internal
                if call == Call::Write => {}
            _ => return Error::unavailable(format!("etcd {what} failed: {message}"), error),
        }
    }
    Error::indeterminate(
        format!(
            "etcd {what}: the answer was lost after sending ({})",
            status.code()
        ),
        error,
    )
}

/// A request that ran out of time (`what` names it).
pub(crate) fn timed_out(what: &str, call: Call, after: std::time::Duration) -> Error {
    let message = format!("etcd {what}: no answer within {after:?}");
    match call {
        Call::Read | Call::Connect => Error::Unavailable {
            message,
            source: None,
        },
        Call::Write => Error::Indeterminate {
            message,
            source: None,
        },
    }
}
