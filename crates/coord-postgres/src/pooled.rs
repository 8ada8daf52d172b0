//! Transaction-pooled mode: every call is one simple-protocol `Query`
//! message holding one explicit transaction, for poolers (PgBouncer
//! `pool_mode = transaction`) that lend a server session per transaction.
//!
//! Such a pooler keeps nothing of a session for its client: a named
//! prepared statement, a `SET`, a `LISTEN` or a startup parameter may be on
//! another server session at the next call (docs/shapes.md, "Poolers").
//! The extended protocol with an unnamed statement does not help either:
//! sqlx sends Parse/Describe/Sync, waits, then Bind/Execute/Sync, and
//! outside a transaction the pooler may hand the session on at the first
//! Sync. So each call here is one message,
//!
//! ```text
//! BEGIN ISOLATION LEVEL READ COMMITTED; [SET LOCAL …;] <statement>; COMMIT
//! ```
//!
//! with its parameters written as literals ([`inline`]): the pooler gives
//! the whole message to one server session, the transaction carries its own
//! isolation level, statement timeout and `coord.notify` (the startup
//! parameters a pooler drops), and the call costs one round trip, as a
//! prepared statement does in session mode.
//!
//! The commit point is the `COMMIT`: an error before the statement's
//! CommandComplete aborted the transaction (the server skips the rest of
//! the message), one after it arose at COMMIT (see `errors::txn`).

use std::time::Duration;

use futures_util::StreamExt;
use sqlx::postgres::PgRow;
use sqlx::{Either, Executor, PgConnection};

/// What a pooled transaction sets for itself (a pooler drops the startup
/// parameters that set it for a session).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Envelope {
    /// `SET LOCAL statement_timeout`.
    pub(crate) statement_timeout: Option<Duration>,
    /// `false`: `SET LOCAL coord.notify = 'off'` (read by `coord_notify`, schema r4).
    pub(crate) notify: bool,
}

impl Envelope {
    /// The commands before the statement, ending in `; `, and how many
    /// CommandCompletes they answer.
    pub(crate) fn prelude(&self) -> (String, usize) {
        let mut sql = String::from("BEGIN ISOLATION LEVEL READ COMMITTED; ");
        let mut commands = 1;
        if let Some(timeout) = self.statement_timeout {
            sql.push_str(&format!(
                "SET LOCAL statement_timeout = {}; ",
                timeout.as_millis().max(1)
            ));
            commands += 1;
        }
        if !self.notify {
            sql.push_str("SET LOCAL coord.notify = 'off'; ");
            commands += 1;
        }
        (sql, commands)
    }

    /// Run `statement` (no placeholders left) in its own transaction: its
    /// rows, or the error and whether the statement had completed (its
    /// CommandComplete arrived, so the error arose at COMMIT or later).
    pub(crate) async fn run(
        &self,
        conn: &mut PgConnection,
        statement: &str,
    ) -> Result<Vec<PgRow>, (sqlx::Error, bool)> {
        let (mut sql, before) = self.prelude();
        sql.push_str(statement);
        sql.push_str("; COMMIT");
        let mut done = 0;
        let mut rows = Vec::new();
        let mut stream = conn.fetch_many(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)));
        while let Some(step) = stream.next().await {
            match step {
                Ok(Either::Left(_)) => done += 1,
                Ok(Either::Right(row)) => rows.push(row),
                Err(error) => return Err((error, done > before)),
            }
        }
        if done != before + 2 {
            // Not the answer of this message: the outcome cannot be read.
            return Err((
                sqlx::Error::Protocol(format!(
                    "expected {} command completions, got {done}",
                    before + 2
                )),
                done > before,
            ));
        }
        Ok(rows)
    }
}

/// A parameter written as a literal.
pub(crate) enum Param<'a> {
    Text(&'a str),
    Bytea(Option<&'a [u8]>),
    Int(i64),
    TextArray(&'a [&'a str]),
    ByteaArray(&'a [&'a [u8]]),
    IntArray(&'a [i64]),
}

/// `'…'` as an escape string: its meaning does not depend on the server's
/// `standard_conforming_strings`. Only `\` and `'` are special there.
/// coord validates every key, prefix and namespace to hold no NUL (which a
/// simple-protocol message cannot carry), so none reaches here; `None` if
/// one does.
fn text(s: &str) -> Option<String> {
    if s.contains('\0') {
        return None;
    }
    let mut out = String::with_capacity(s.len() + 4);
    out.push_str("E'");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push('\'');
    Some(out)
}

/// Hex form: only `\x` and hex digits inside the quotes.
fn bytea(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(b.len() * 2 + 14);
    out.push_str("E'\\\\x");
    for byte in b {
        out.push(HEX[usize::from(byte >> 4)] as char);
        out.push(HEX[usize::from(byte & 15)] as char);
    }
    out.push_str("'::bytea");
    out
}

/// Quoted: `-9223372036854775808::bigint` would negate an out-of-range
/// positive number.
fn int(i: i64) -> String {
    format!("'{i}'::bigint")
}

fn array(items: impl Iterator<Item = Option<String>>, of: &str) -> Option<String> {
    let items: Option<Vec<String>> = items.collect();
    Some(format!("ARRAY[{}]::{of}[]", items?.join(",")))
}

impl Param<'_> {
    fn literal(&self) -> Option<String> {
        Some(match self {
            Param::Text(s) => format!("{}::text", text(s)?),
            Param::Bytea(Some(b)) => bytea(b),
            Param::Bytea(None) => "NULL::bytea".to_owned(),
            Param::Int(i) => int(*i),
            Param::TextArray(a) => array(a.iter().map(|s| text(s)), "text")?,
            Param::ByteaArray(a) => array(a.iter().map(|b| Some(bytea(b))), "bytea")?,
            Param::IntArray(a) => array(a.iter().map(|i| Some(int(*i))), "bigint")?,
        })
    }
}

/// `sql` with `$1`, `$2`, … replaced by the literals of `params`; `None`
/// when a text holds a NUL. The statements given here hold no `$` but
/// their placeholders (no dollar quotes, none in their string constants).
pub(crate) fn inline(sql: &str, params: &[Param<'_>]) -> Option<String> {
    let literals: Option<Vec<String>> = params.iter().map(Param::literal).collect();
    let literals = literals?;
    let mut out =
        String::with_capacity(sql.len() + literals.iter().map(String::len).sum::<usize>());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let n: usize = rest[at + 1..at + 1 + digits].parse().ok()?;
        out.push('(');
        out.push_str(literals.get(n.checked_sub(1)?)?);
        out.push(')');
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_quotes_and_backslashes() {
        assert_eq!(text("a'b\\c").unwrap(), r"E'a''b\\c'");
        assert_eq!(text("x\0"), None);
        assert_eq!(bytea(&[0, 0xab, 0xff]), r"E'\\x00abff'::bytea");
        assert_eq!(bytea(&[]), r"E'\\x'::bytea");
        assert_eq!(Param::TextArray(&[]).literal().unwrap(), "ARRAY[]::text[]");
    }

    #[test]
    fn inline_replaces_every_placeholder() {
        let sql = inline(
            "SELECT $1::text, $2, $10 FROM f($3)",
            &[
                Param::Text("n"),
                Param::Int(-1),
                Param::IntArray(&[1, 2]),
                Param::Int(4),
                Param::Int(5),
                Param::Int(6),
                Param::Int(7),
                Param::Int(8),
                Param::Int(9),
                Param::Bytea(None),
            ],
        )
        .unwrap();
        assert_eq!(
            sql,
            "SELECT (E'n'::text)::text, ('-1'::bigint), (NULL::bytea) \
             FROM f((ARRAY['1'::bigint,'2'::bigint]::bigint[]))"
        );
        assert_eq!(inline("SELECT $2", &[Param::Int(1)]), None);
        assert_eq!(inline("SELECT $0", &[Param::Int(1)]), None);
    }
}
