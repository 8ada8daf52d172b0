//! Which PostgreSQL server to talk to when a URL names several: libpq's
//! multi-host syntax, `postgres://user@h1:5432,h2:5433/db?target_session_attrs=read-write`.
//!
//! # Contract
//!
//! - Hosts are tried in the order written, starting from the one that
//!   answered last; the first that accepts a connection and passes the
//!   session check is used. A host that refuses, times out or fails the
//!   check is skipped, and the error, when none passes, names every host
//!   tried and why (never a password).
//! - `target_session_attrs`: `read-write` (or `primary`) checks each new
//!   session with one query (`pg_is_in_recovery()` and
//!   `transaction_read_only`), so a standby is never written to. `any`
//!   checks nothing. Other libpq values (`read-only`, `standby`,
//!   `prefer-standby`) are a `Config` error: coord always writes. The
//!   default is `read-write` when the URL names more than one host (a
//!   coord store on a standby could only fail), and `any` for one host
//!   (libpq's default; no extra query per connection).
//! - A failover is followed, not detected: when opening a session fails,
//!   [`Servers::find_writable`] walks the list again, and sessions opened
//!   before the switch are no longer handed out
//!   ([`Servers::opened_before_switch`]). A primary that is cut off but
//!   still alive keeps the sessions already open to it: with asynchronous
//!   replication that is the split brain every PostgreSQL failover must
//!   fence off (stop the old primary before promoting), not something a
//!   client can see.
//!
//! - `pooler=transaction` declares a pooler that lends a server session per
//!   transaction (PgBouncer `pool_mode = transaction`):
//!   [`Servers::shares_sessions`] then answers true without probing. The
//!   probe finds such a pooler only when it lends the probe's idle session
//!   to the probe's second connection at once (PgBouncer does while no
//!   other client takes it first): under load it misses, so the parameter
//!   is required behind a transaction pooler. Any other value is a
//!   `Config` error.
//!
//! Boundary: the choice is per process (each `Servers` value), made from
//! what each server says of itself; nothing here coordinates clients.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use coord_backend::{Error, Result};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

/// The query that tells a writable session from a standby's or a read-only one.
const READ_ONLY_SQL: &str =
    "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'";

/// What a walk of the list ([`Servers::find_writable`]) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// Another server passed and is current now.
    Moved,
    /// The current server still passes (or the URL names one server).
    Unchanged,
    /// No server passed: during a failover, before the standby is promoted.
    NoneWritable,
    /// Someone else walked the list after the caller's failure.
    WalkedSince,
}

/// The servers of one URL and the session each must offer.
pub struct Servers {
    candidates: Vec<Candidate>,
    check_writable: bool,
    /// `pooler=transaction` in the URL.
    declared_pooler: bool,
    /// Index of the candidate sessions are opened to now.
    current: AtomicUsize,
    /// When `current` last changed (sessions opened before are stale).
    switched_at: Mutex<Option<Instant>>,
    /// Held while the list is walked, so concurrent failures walk it once.
    walking: tokio::sync::Mutex<Option<Instant>>,
}

struct Candidate {
    /// `host:port`, for messages.
    label: String,
    options: PgConnectOptions,
}

impl fmt::Debug for Servers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Servers")
            .field(
                "hosts",
                &self
                    .candidates
                    .iter()
                    .map(|c| c.label.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("check_writable", &self.check_writable)
            .field("current", &self.current_label())
            .finish()
    }
}

impl Servers {
    /// Parse a `postgres://` URL (without coord's `namespace` parameter),
    /// one host or several, and apply `customize` to every host's options.
    pub fn parse(
        url: &str,
        customize: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<Self> {
        let config = |detail: String| {
            Error::Config(format!(
                "invalid PostgreSQL URL {:?}: {detail}",
                coord_backend::redact::url(url)
            ))
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| config("no scheme".into()))?;
        let (body, query) = match rest.split_once('?') {
            Some((body, query)) => (body, Some(query)),
            None => (rest, None),
        };
        let mut attrs = None;
        let mut declared_pooler = false;
        let mut kept = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("target_session_attrs", value)) => attrs = Some(value.to_owned()),
                Some(("pooler", "transaction")) => declared_pooler = true,
                Some(("pooler", other)) => {
                    return Err(config(format!(
                        "pooler={other} is not supported: pooler=transaction declares a \
                         transaction pooler (PgBouncer pool_mode = transaction); leave it out \
                         otherwise"
                    )))
                }
                _ => kept.push(pair),
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let (authority, path) = match body.find('/') {
            Some(at) => body.split_at(at),
            None => (body, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let hosts: Vec<&str> = if hosts.is_empty() {
            vec![""]
        } else {
            hosts.split(',').collect()
        };
        if hosts.len() > 1 && hosts.iter().any(|h| h.is_empty()) {
            return Err(config("an empty host in the host list".into()));
        }
        let check_writable = match attrs.as_deref() {
            None => hosts.len() > 1,
            Some("any") => false,
            Some("read-write" | "primary") => true,
            Some(other) => {
                return Err(config(format!(
                    "target_session_attrs={other} is not supported: coord writes, so it needs \
                     read-write (or primary) or any"
                )))
            }
        };
        let mut candidates = Vec::with_capacity(hosts.len());
        for host in hosts {
            let one = format!("{scheme}://{userinfo}{host}{path}{query}");
            let options = PgConnectOptions::from_str(&one).map_err(|e| config(e.to_string()))?;
            let label = if host.is_empty() {
                format!("{}:{}", options.get_host(), options.get_port())
            } else {
                host.to_owned()
            };
            candidates.push(Candidate {
                label,
                options: customize(options),
            });
        }
        Ok(Servers {
            candidates,
            check_writable,
            declared_pooler,
            current: AtomicUsize::new(0),
            switched_at: Mutex::new(None),
            walking: tokio::sync::Mutex::new(None),
        })
    }

    /// One server with explicit options (no list, no check).
    pub fn single(options: PgConnectOptions) -> Self {
        Servers {
            candidates: vec![Candidate {
                label: format!("{}:{}", options.get_host(), options.get_port()),
                options,
            }],
            check_writable: false,
            declared_pooler: false,
            current: AtomicUsize::new(0),
            switched_at: Mutex::new(None),
            walking: tokio::sync::Mutex::new(None),
        }
    }

    /// How many hosts the URL names.
    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    /// Always false: a URL names at least one host.
    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// Whether each new session is checked to be writable.
    pub fn checks_writable(&self) -> bool {
        self.check_writable
    }

    /// The connection options of the server sessions go to now.
    pub fn current_options(&self) -> PgConnectOptions {
        self.candidates[self.current.load(Ordering::SeqCst)]
            .options
            .clone()
    }

    /// `host:port` of the server sessions go to now.
    pub fn current_label(&self) -> &str {
        &self.candidates[self.current.load(Ordering::SeqCst)].label
    }

    /// Whether a session opened `age` ago predates the last switch of
    /// server (it may be talking to the old primary).
    pub fn opened_before_switch(&self, age: Duration) -> bool {
        let switched = *self.switched_at.lock().expect("switch time poisoned");
        switched.is_some_and(|at| at.elapsed() < age)
    }

    /// Whether the URL says `pooler=transaction`.
    pub fn declares_pooler(&self) -> bool {
        self.declared_pooler
    }

    /// Whether `conn` is a writable session (false: a standby, or
    /// `default_transaction_read_only` is on). One round trip, by the
    /// simple protocol: no prepared statement is left on a server session
    /// a transaction pooler lends to others.
    pub async fn is_writable(conn: &mut PgConnection) -> std::result::Result<bool, sqlx::Error> {
        let row = sqlx::raw_sql(READ_ONLY_SQL).fetch_one(conn).await?;
        let read_only: bool = sqlx::Row::try_get(&row, 0)?;
        Ok(!read_only)
    }

    /// The session check a pool runs on each new connection: `Err` when
    /// checking is on and the server is not writable (the pool discards it).
    pub async fn check(&self, conn: &mut PgConnection) -> std::result::Result<(), sqlx::Error> {
        if self.check_writable && !Self::is_writable(conn).await? {
            return Err(sqlx::Error::Io(std::io::Error::other(format!(
                "{} is read-only (a standby?); target_session_attrs=read-write",
                self.current_label()
            ))));
        }
        Ok(())
    }

    /// Open a checked session: the current server first, then the others
    /// in the order written. The one that passes becomes current.
    pub async fn connect(&self, timeout: Duration) -> Result<PgConnection> {
        let start = self.current.load(Ordering::SeqCst);
        let n = self.candidates.len();
        let mut failures = Vec::new();
        for index in (0..n).map(|i| (start + i) % n) {
            match self.try_one(index, timeout).await {
                Ok(conn) => {
                    self.make_current(index);
                    return Ok(conn);
                }
                Err(Failure::Config(message)) => return Err(Error::Config(message)),
                Err(Failure::Skipped(why)) => {
                    failures.push(format!("{} ({why})", self.candidates[index].label))
                }
            }
        }
        Err(Error::Unavailable {
            message: if self.check_writable {
                format!(
                    "no writable PostgreSQL server among {}",
                    failures.join(", ")
                )
            } else {
                format!("cannot connect to PostgreSQL: {}", failures.join(", "))
            },
            source: None,
        })
    }

    /// After a session could not be opened at `since`: walk the list (once
    /// for every caller that failed before the walk ended) and make the
    /// first server that passes current.
    pub async fn find_writable(&self, since: Instant, timeout: Duration) -> Walk {
        if self.candidates.len() == 1 {
            return Walk::Unchanged;
        }
        let mut walked = self.walking.lock().await;
        if walked.is_some_and(|at| at >= since) {
            return Walk::WalkedSince;
        }
        let before = self.current.load(Ordering::SeqCst);
        let walk = match self.connect(timeout).await {
            Ok(conn) => {
                let _ = conn.close().await;
                if self.current.load(Ordering::SeqCst) != before {
                    Walk::Moved
                } else {
                    Walk::Unchanged
                }
            }
            Err(error) => {
                tracing::debug!(%error, "coord-postgres: no server passed while following a failover");
                Walk::NoneWritable
            }
        };
        *walked = Some(Instant::now());
        walk
    }

    /// Whether the server `conn` talks to hands one server session to
    /// several client connections: a pooler (PgBouncer) in transaction or
    /// statement pooling mode. Session state (prepared statements, `LISTEN`,
    /// session advisory locks) does not survive such a pooler. Opens one
    /// more connection: after `conn`'s statement ends, a transaction pooler
    /// lends the idle server session it used to the next client (PgBouncer
    /// reuses the most recently used one), so both report the same backend;
    /// directly or through session pooling, two connections never share one.
    /// A false answer is not proof: another client of a busy pooler may take
    /// that session first (see the module docs). Simple-protocol statements
    /// only: they survive any pooler. True without a probe when the URL
    /// declares `pooler=transaction`.
    pub async fn shares_sessions(
        &self,
        conn: &mut PgConnection,
        timeout: Duration,
    ) -> Result<bool> {
        if self.declared_pooler {
            return Ok(true);
        }
        let probe = async {
            let first = backend_pid(&mut *conn).await?;
            let mut other = PgConnection::connect_with(&self.current_options()).await?;
            let second = backend_pid(&mut other).await;
            let _ = other.close().await;
            Ok::<_, sqlx::Error>(first == second?)
        };
        match tokio::time::timeout(timeout, probe).await {
            Ok(Ok(shared)) => Ok(shared),
            Ok(Err(e)) => Err(Error::unavailable(
                format!(
                    "PostgreSQL at {}: probing the session",
                    self.current_label()
                ),
                e,
            )),
            Err(_) => Err(Error::Unavailable {
                message: format!(
                    "PostgreSQL at {}: no answer within {timeout:?} while probing the session",
                    self.current_label()
                ),
                source: None,
            }),
        }
    }

    fn make_current(&self, index: usize) {
        if self.current.swap(index, Ordering::SeqCst) != index {
            *self.switched_at.lock().expect("switch time poisoned") = Some(Instant::now());
            tracing::info!(
                server = %self.candidates[index].label,
                "coord-postgres: sessions now go to another server"
            );
        }
    }

    async fn try_one(
        &self,
        index: usize,
        timeout: Duration,
    ) -> std::result::Result<PgConnection, Failure> {
        let options = &self.candidates[index].options;
        let attempt = async {
            let mut conn = PgConnection::connect_with(options).await?;
            if self.check_writable && !Self::is_writable(&mut conn).await? {
                let _ = conn.close().await;
                return Ok(None);
            }
            Ok(Some(conn))
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(Some(conn))) => Ok(conn),
            Ok(Ok(None)) => Err(Failure::Skipped("read-only: a standby".into())),
            Ok(Err(sqlx::Error::Configuration(e))) => Err(Failure::Config(format!(
                "PostgreSQL connection options: {e}"
            ))),
            // PgBouncer refuses startup parameters it does not know (coord
            // sends `options`, for the isolation level and timeouts).
            Ok(Err(e)) if e.to_string().contains("unsupported startup parameter") => {
                Err(Failure::Config(format!(
                    "{}: {e}; a pooler in front of PostgreSQL refuses coord's startup \
                     parameters: add `options` to PgBouncer's ignore_startup_parameters \
                     (coord_txn checks its isolation level itself)",
                    self.candidates[index].label
                )))
            }
            Ok(Err(e)) => Err(Failure::Skipped(e.to_string())),
            Err(_) => Err(Failure::Skipped(format!("no answer within {timeout:?}"))),
        }
    }
}

/// What a fence or a lock can lose on this deployment, as a sentence for
/// an operator, or `None`: the writable server `url` names streams to
/// standbys that are not synchronous, so a promotion can lose commits it
/// acknowledged and hand a version or a fence out twice (docs/shapes.md,
/// "PostgreSQL"). Best effort: a server that cannot be asked gives `None`.
pub async fn asynchronous_standbys_advice(url: &coord_backend::StoreUrl) -> Option<String> {
    let servers = Servers::parse(url.without_namespace(), |o| o).ok()?;
    let timeout = Duration::from_secs(3);
    let mut conn = servers.connect(timeout).await.ok()?;
    let row = tokio::time::timeout(
        timeout,
        sqlx::raw_sql(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state NOT IN ('sync', 'quorum')",
        )
        .fetch_one(&mut conn),
    )
    .await
    .ok()?
    .ok()?;
    let _ = conn.close().await;
    let standbys: i64 = sqlx::Row::try_get(&row, 0).ok()?;
    (standbys > 0).then(|| {
        format!(
            "the PostgreSQL primary {} streams to {standbys} standby(s) that are not synchronous: \
             a promotion can lose acknowledged commits and grant a lock or a fence twice; set \
             synchronous_standby_names (and synchronous_commit on) for locks that must never \
             double-grant",
            servers.current_label()
        )
    })
}

/// The server session's process id, by the simple query protocol.
async fn backend_pid(conn: &mut PgConnection) -> std::result::Result<i32, sqlx::Error> {
    let row = sqlx::raw_sql("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await?;
    sqlx::Row::try_get::<i32, _>(&row, 0)
}

enum Failure {
    Config(String),
    Skipped(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Servers> {
        Servers::parse(url, |o| o)
    }

    #[test]
    fn one_host_checks_nothing_by_default() {
        let s = parse("postgres://u:pw@db:5433/app?sslmode=disable").unwrap();
        assert_eq!(s.len(), 1);
        assert!(!s.checks_writable());
        assert_eq!(s.current_label(), "db:5433");
        assert_eq!(s.current_options().get_database(), Some("app"));
    }

    #[test]
    fn several_hosts_check_writable_by_default() {
        let s = parse("postgres://u@h1:5432,h2:5433,[::1]:5434/app").unwrap();
        assert_eq!(s.len(), 3);
        assert!(s.checks_writable());
        let labels: Vec<_> = s.candidates.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["h1:5432", "h2:5433", "[::1]:5434"]);
        assert_eq!(s.candidates[1].options.get_port(), 5433);
        assert_eq!(s.candidates[1].options.get_database(), Some("app"));
        assert_eq!(s.candidates[1].options.get_username(), "u");
    }

    #[test]
    fn target_session_attrs() {
        assert!(parse("postgres://h1/db?target_session_attrs=read-write")
            .unwrap()
            .checks_writable());
        assert!(parse("postgres://h1,h2/db?target_session_attrs=primary")
            .unwrap()
            .checks_writable());
        assert!(!parse("postgres://h1,h2/db?target_session_attrs=any")
            .unwrap()
            .checks_writable());
        for refused in ["read-only", "standby", "prefer-standby", "bogus"] {
            let url = format!("postgres://u:s3cret@h1,h2/db?target_session_attrs={refused}");
            let Err(Error::Config(message)) = parse(&url) else {
                panic!("{refused} accepted");
            };
            assert!(message.contains(refused), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn pooler_parameter() {
        assert!(!parse("postgres://h1/db").unwrap().declares_pooler());
        let s = parse("postgres://h1/db?pooler=transaction&sslmode=disable").unwrap();
        assert!(s.declares_pooler());
        let Err(Error::Config(message)) = parse("postgres://h1/db?pooler=statement") else {
            panic!("pooler=statement accepted");
        };
        assert!(message.contains("pooler=statement"), "{message}");
    }

    #[test]
    fn bad_host_lists_are_config_errors() {
        for bad in [
            "postgres://u:s3cret@h1,,h2/db",
            "postgres://u:s3cret@h1:notaport,h2/db",
        ] {
            let Err(Error::Config(message)) = parse(bad) else {
                panic!("{bad} accepted");
            };
            assert!(!message.contains("s3cret"), "{message}");
        }
    }
}
