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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every gRPC code, `Ok` included (a status is an error whatever its code says).
    const ALL_CODES: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// A status as decoded from the server's trailers (no local source).
    fn from_server(code: Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    fn kind(error: &Error) -> &'static str {
        match error {
            Error::Unavailable { .. } => "Unavailable",
            Error::Indeterminate { .. } => "Indeterminate",
            Error::InvalidInput(_) => "InvalidInput",
            Error::Config(_) => "Config",
            _ => "other",
        }
    }

    fn classified(code: Code, message: &str, call: Call) -> &'static str {
        kind(&classify(from_server(code, message), "txn", call))
    }

    /// What etcd answers once a write may be in the raft log (after
    /// `Propose`, or from the applier after the write ran): the write may
    /// have applied, or may still apply.
    const AFTER_PROPOSAL: &[(Code, &str)] = &[
        (Code::Unavailable, "etcdserver: request timed out"),
        (
            Code::Unavailable,
            "etcdserver: request timed out, possibly due to previous leader failure",
        ),
        (
            Code::Unavailable,
            "etcdserver: request timed out, possibly due to connection lost",
        ),
        (
            Code::Unavailable,
            "etcdserver: request timed out, waiting for the applied index took too long",
        ),
        (Code::Unavailable, "etcdserver: leader changed"),
        (Code::Unavailable, "etcdserver: server stopped"),
        (Code::Unavailable, "etcdserver: unhealthy cluster"),
        (Code::Cancelled, "etcdserver: request canceled"),
        (Code::Unknown, "etcdserver: request cancelled"),
        (Code::DeadlineExceeded, "etcdserver: context deadline exceeded"),
        (Code::Cancelled, "context canceled"),
        (Code::DeadlineExceeded, "context deadline exceeded"),
        (Code::DataLoss, "etcdserver: corrupt cluster"),
        (
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded",
        ),
        (Code::FailedPrecondition, "etcdserver: not leader"),
        (Code::Unknown, "raft proposal dropped"),
        (Code::Unknown, "raft: stopped"),
        (Code::Unavailable, "transport is closing"),
    ];

    #[test]
    fn write_failures_that_may_follow_a_proposal_are_indeterminate() {
        for (code, message) in AFTER_PROPOSAL {
            assert_eq!(
                classified(*code, message, Call::Write),
                "Indeterminate",
                "txn failing with {code:?} {message:?}"
            );
            assert_eq!(
                classified(*code, message, Call::Read),
                "Unavailable",
                "read failing with {code:?} {message:?}"
            );
        }
    }

    #[test]
    fn every_code_with_an_unknown_message_is_indeterminate_for_a_write() {
        for code in ALL_CODES {
            for message in [
                "",
                "some failure",
                "etcdserver: a refusal this version does not know",
                "auth: something",
            ] {
                assert_eq!(
                    classified(code, message, Call::Write),
                    "Indeterminate",
                    "txn failing with {code:?} {message:?}"
                );
                let read = classified(code, message, Call::Read);
                let expected = match code {
                    Code::Unauthenticated | Code::PermissionDenied => "Config",
                    _ => "Unavailable",
                };
                assert_eq!(read, expected, "read failing with {code:?} {message:?}");
            }
        }
    }

    /// Refusals etcd makes before proposing anything (or that its applier
    /// makes before running any op of the txn): nothing was applied.
    const NOT_APPLIED: &[(Code, &str, &str)] = &[
        (
            Code::ResourceExhausted,
            "etcdserver: too many requests",
            "Unavailable",
        ),
        // etcd wraps this one in a type gRPC does not recognize: it arrives as Unknown.
        (Code::Unknown, "etcdserver: too many requests", "Unavailable"),
        (Code::Unavailable, "etcdserver: no leader", "Unavailable"),
        (
            Code::FailedPrecondition,
            "etcdserver: not capable",
            "Unavailable",
        ),
        (
            Code::FailedPrecondition,
            "etcdserver: rpc not supported for learner",
            "Unavailable",
        ),
        (
            Code::InvalidArgument,
            "etcdserver: revision of auth store is old",
            "Unavailable",
        ),
        (
            Code::InvalidArgument,
            "etcdserver: request is too large",
            "InvalidInput",
        ),
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request",
            "InvalidInput",
        ),
        (
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request",
            "InvalidInput",
        ),
        (
            Code::InvalidArgument,
            "etcdserver: key is not provided",
            "InvalidInput",
        ),
        (
            Code::ResourceExhausted,
            "grpc: received message larger than max (2097152 vs. 1574400)",
            "InvalidInput",
        ),
        (
            Code::Unauthenticated,
            "etcdserver: invalid auth token",
            "Config",
        ),
        (
            Code::PermissionDenied,
            "etcdserver: permission denied",
            "Config",
        ),
        (
            Code::InvalidArgument,
            "etcdserver: user name is empty",
            "Config",
        ),
    ];

    #[test]
    fn refusals_before_a_proposal_are_not_indeterminate() {
        for (code, message, expected) in NOT_APPLIED {
            for call in [Call::Write, Call::Read] {
                assert_eq!(
                    classified(*code, message, call),
                    *expected,
                    "{call:?} failing with {code:?} {message:?}"
                );
            }
        }
    }

    #[test]
    fn local_statuses_are_never_taken_for_etcd_refusals() {
        // tonic's own statuses carry their cause: the request may have been
        // written before the connection broke, whatever the message says.
        let local = |message: &str| {
            etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(
                std::io::Error::new(std::io::ErrorKind::ConnectionReset, message.to_owned()),
            )))
        };
        for message in ["connection reset", "etcdserver: too many requests"] {
            let error = classify(local(message), "txn", Call::Write);
            assert_eq!(kind(&error), "Indeterminate", "{message:?}: {error:?}");
            let error = classify(local(message), "snapshot", Call::Read);
            assert_eq!(kind(&error), "Unavailable", "{message:?}: {error:?}");
        }
        // Never connected: nothing was sent.
        let never = etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(
            tonic::ConnectError(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            ))),
        )));
        assert_eq!(kind(&classify(never, "txn", Call::Write)), "Unavailable");
    }

    #[test]
    fn connecting_tells_refused_credentials_from_a_busy_server() {
        for (code, message, expected) in [
            (
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
                "Config",
            ),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
                "Config",
            ),
            (Code::Unavailable, "etcdserver: request timed out", "Unavailable"),
            (Code::Unknown, "etcdserver: too many requests", "Unavailable"),
            (Code::Unavailable, "etcdserver: leader changed", "Unavailable"),
            (Code::Unavailable, "etcdserver: no leader", "Unavailable"),
        ] {
            assert_eq!(
                classified(code, message, Call::Connect),
                expected,
                "connect failing with {code:?} {message:?}"
            );
        }
    }
}
