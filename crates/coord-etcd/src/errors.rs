//! Mapping etcd client errors onto coord's outcomes.
//!
//! The one distinction that matters for a txn: did etcd certainly NOT apply
//! it? `Unavailable` promises exactly that (safe to retry); anything else
//! after the request may have left the client is `Indeterminate` (it may
//! have applied, or may still apply later). Only these prove "not applied":
//!
//! - the connection was never established (`tonic::ConnectError` in the
//!   error chain): nothing was sent;
//! - etcd answered with one of the refusals listed in [`known_refusal`],
//!   each of which etcd makes before its raft proposal (or, for the auth
//!   checks, in the applier before any op of the txn runs). They are told
//!   apart by etcd's exact message, decoded from the server's trailers: the
//!   gRPC code alone proves nothing. etcd uses `Unavailable` both for "no
//!   leader" (refused up front) and for "request timed out" (proposed, may
//!   still commit), `Canceled` for a request whose proposal was already
//!   handed to raft when its context ended, and `ResourceExhausted` for
//!   "database space exceeded", which its quota applier returns AFTER
//!   applying the txn.
//!
//! Every other failure of a write (reset connection, HTTP/2 error, local
//! timeout, `etcdserver: request timed out`, `leader changed`, `server
//! stopped`, `request canceled`, `corrupt cluster`, a message this code does
//! not know) may have committed → [`Error::Indeterminate`]. Reads (snapshot,
//! keys) change nothing, so their failures are [`Error::Unavailable`]
//! unless the request or the credentials are at fault.
//! See docs/shapes.md (etcd) for the guarantee this gives callers.

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

/// An etcd refusal that leaves nothing applied, by what the caller can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// The same request may succeed later.
    Retryable,
    /// The request itself is refused (size, op count, duplicate keys).
    Invalid,
    /// The credentials or permissions are refused.
    Credentials,
}

/// etcd's messages (api/v3rpc/rpctypes/error.go) for the refusals that
/// certainly leave nothing applied, and why each does, from etcd's server
/// source (server/etcdserver/v3_server.go, api/v3rpc/, apply/, auth/).
/// Everything missing here is treated as "may have been proposed".
fn known_refusal(message: &str) -> Option<Refusal> {
    Some(match message {
        // `processInternalRaftRequestOnce` returns it when the applied index
        // lags the committed one too far: its first check, before the
        // request is even marshalled, let alone given to `Propose`. (etcd
        // wraps it in a type gRPC does not recognize: it arrives as Unknown,
        // so only the message identifies it.)
        "etcdserver: too many requests" => Refusal::Retryable,
        // The unary interceptor refuses these before the KV handler runs:
        // V3 capability not enabled yet, a learner member, and no leader when
        // the client asked for one (the `hasleader` metadata). For a write,
        // "no leader" has no other source: a write waiting for a leader
        // times out instead ("request timed out", indeterminate).
        "etcdserver: not capable"
        | "etcdserver: rpc not supported for learner"
        | "etcdserver: no leader" => Refusal::Retryable,
        // The auth applier checks every key of the txn against the token's
        // auth revision before running any op, and auth changes are raft
        // entries themselves, so every member refuses this entry alike: not
        // applied, and a fresh token (the client refreshes it) may pass.
        "etcdserver: revision of auth store is old" => Refusal::Retryable,
        // `processInternalRaftRequestOnce` checks the marshalled size before
        // `Propose`; the KV server's `checkTxnRequest` rejects too many ops,
        // duplicate keys and empty keys before calling the server at all.
        "etcdserver: request is too large"
        | "etcdserver: too many operations in txn request"
        | "etcdserver: duplicate key given in txn request"
        | "etcdserver: key is not provided" => Refusal::Invalid,
        // A bad token is refused by `AuthInfoFromCtx` before `Propose`;
        // permissions by the auth applier before any op runs (see above);
        // the rest are answers to `Authenticate` (connecting).
        "etcdserver: invalid auth token"
        | "etcdserver: permission denied"
        | "etcdserver: user name is empty"
        | "etcdserver: authentication failed, invalid user ID or password"
        | "etcdserver: authentication is not enabled" => Refusal::Credentials,
        // gRPC's own limit, enforced while decoding the request, before any
        // etcd code sees it.
        m if m.starts_with("grpc: received message larger than max") => Refusal::Invalid,
        _ => return None,
    })
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
        // A KV call itself only fails with a status. Other errors come from
        // setting up a connection or from refreshing an expired token, which
        // the client does only after etcd refused the request for that token
        // ("invalid auth token", before any proposal) and before re-sending it.
        _ => return Error::unavailable(format!("etcd {what}: {error}"), error),
    };
    if never_connected(status) {
        return Error::unavailable(format!("etcd {what}: cannot connect"), error);
    }
    // A status decoded from the server's trailers carries no local source;
    // tonic's own statuses for I/O and HTTP/2 failures always do, so a
    // broken connection is never mistaken for an etcd refusal.
    let from_server = status.source().is_none();
    let message = status.message();
    let refusal = if from_server {
        known_refusal(message)
    } else {
        None
    };
    match (refusal, call) {
        (Some(Refusal::Credentials), _) => Error::Config(format!(
            "etcd refused the credentials for {what}: {message}"
        )),
        (Some(Refusal::Invalid), Call::Connect) => {
            Error::Config(format!("etcd refused to {what}: {message}"))
        }
        (Some(Refusal::Invalid), _) => Error::InvalidInput(InvalidInput::Argument(format!(
            "etcd refused {what}: {message} (check EtcdOptions::max_request_bytes / max_txn_ops \
             against the server's --max-request-bytes / --max-txn-ops)"
        ))),
        (Some(Refusal::Retryable), _) => {
            Error::unavailable(format!("etcd refused {what}: {message}"), error)
        }
        // Anything else may have been proposed, and a proposal may still commit.
        (None, Call::Write) => Error::indeterminate(
            format!(
                "etcd {what}: failed after sending, may have applied ({}: {message})",
                status.code()
            ),
            error,
        ),
        (None, call)
            if from_server
                && (matches!(
                    status.code(),
                    Code::Unauthenticated | Code::PermissionDenied
                ) || (call == Call::Connect && message.starts_with("auth: "))) =>
        {
            Error::Config(format!(
                "etcd refused the credentials for {what}: {message}"
            ))
        }
        (None, Call::Read | Call::Connect) => {
            Error::unavailable(format!("etcd {what} failed: {message}"), error)
        }
    }
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
        (
            Code::DeadlineExceeded,
            "etcdserver: context deadline exceeded",
        ),
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
        (
            Code::Unknown,
            "etcdserver: too many requests",
            "Unavailable",
        ),
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
            (
                Code::Unavailable,
                "etcdserver: request timed out",
                "Unavailable",
            ),
            (
                Code::Unknown,
                "etcdserver: too many requests",
                "Unavailable",
            ),
            (
                Code::Unavailable,
                "etcdserver: leader changed",
                "Unavailable",
            ),
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
