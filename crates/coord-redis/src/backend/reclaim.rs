//! `Backend::reclaim` on Redis: the tombstone set and the floor; and the
//! announcements of storage formats a reclaim checks (see
//! `coord_backend::reclaim`, "Mixed versions").

use std::sync::LazyLock;

use coord_backend::reclaim::{self as floor};
use coord_backend::{Error, ReclaimOptions, Reclaimed, Result};
use redis::Value;

use super::{array, bytes, tag, text, Call, Lua, Op, RedisBackend};
use crate::scripts;

static RECLAIM_CANDIDATES: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::RECLAIM_CANDIDATES));
static RECLAIM: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::RECLAIM));
static ANNOUNCE: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::ANNOUNCE));

/// A reclaim or an announcement changes nothing a reader can see: an
/// unknown outcome is only "try again later".
fn harmless(error: Error) -> Error {
    match error {
        Error::Indeterminate { message, source } => Error::Unavailable { message, source },
        other => other,
    }
}

/// A decimal reply field as a number (`None` when empty or not one).
fn number<T: std::str::FromStr>(value: &Value) -> Option<T> {
    text(value.clone()).parse().ok()
}

impl RedisBackend {
    /// Announce this client's storage format when it is due (one script).
    pub(super) async fn announce(&self) -> Result<()> {
        if !self.announcer.due() {
            return Ok(());
        }
        let sent = std::time::Instant::now();
        let now = floor::now_ms();
        let clients = String::from_utf8_lossy(&self.clients_key).into_owned();
        let mut call = Call::new(&ANNOUNCE);
        call.key(self.clients_key.as_slice())
            .key(self.index_key.as_slice())
            .key(self.dead_key.as_slice())
            .key(self.floor_key.as_slice())
            .arg(self.announcer.id())
            .arg(self.announcer.format())
            .arg(now)
            .arg(floor::recent_since(now));
        let reply = self
            .call(&call, Op::Txn, "announce")
            .await
            .map_err(harmless)?;
        let reply = array(reply).map_err(|e| self.malformed_reply(e, &clients))?;
        match reply.as_slice() {
            [ok, _] if tag(ok) == Some(b"ok") => {}
            [newer, required] if tag(newer) == Some(b"newer") => {
                let required = number(required).unwrap_or(u32::MAX);
                floor::check_announce(self.announcer.format(), required)?;
                return Err(self.malformed_reply(reply, &clients));
            }
            _ => return Err(self.malformed_reply(reply, &clients)),
        }
        self.announcer.announced(sent);
        Ok(())
    }

    /// Two scripts: one lists the first members of the tombstone set, the
    /// next (naming them as its keys, so it is a valid Cluster script)
    /// deletes those still tombstones and raises the floor, atomically.
    pub(super) async fn reclaim_pass(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.announce().await?;
        let dead = String::from_utf8_lossy(&self.dead_key).into_owned();
        let mut list = Call::new(&RECLAIM_CANDIDATES);
        list.key(self.dead_key.as_slice())
            .arg(options.max_tombstones.clamp(1, 1000) + 1);
        let reply = self.call(&list, Op::Read, "reclaim").await?;
        let reply = array(reply).map_err(|e| self.malformed_reply(e, &dead))?;
        if reply.first().and_then(tag) != Some(b"ok") {
            return Err(self.malformed_reply(reply, &dead));
        }
        let candidates: Vec<Vec<u8>> = reply
            .into_iter()
            .skip(1)
            .filter_map(bytes)
            .filter(|member| !member.is_empty())
            .collect();
        // With nothing to remove the script still runs when the operator
        // says older clients are stopped: it raises the required format.
        if candidates.is_empty() && !options.older_clients_stopped {
            return Ok(Reclaimed::new(0, false));
        }
        let mut run = Call::new(&RECLAIM);
        run.key(self.dead_key.as_slice())
            .key(self.floor_key.as_slice())
            .key(self.clients_key.as_slice());
        for member in &candidates {
            let mut record = self.record_prefix.clone();
            record.extend_from_slice(member);
            run.key(record);
        }
        let now = floor::now_ms();
        run.arg(self.record_prefix.len())
            .arg(self.announcer.format())
            .arg(floor::recent_since(now))
            .arg(if options.older_clients_stopped {
                "1"
            } else {
                "0"
            });
        let reply = self
            .call(&run, Op::Txn, "reclaim")
            .await
            .map_err(harmless)?;
        let reply = array(reply).map_err(|e| self.malformed_reply(e, &dead))?;
        match reply.as_slice() {
            [refused, required, older, older_at] if tag(refused) == Some(b"refused") => {
                let older = number(older).zip(number(older_at));
                floor::check_reclaim(
                    self.announcer.format(),
                    number(required).unwrap_or(0),
                    older,
                    options.older_clients_stopped,
                )?;
                Err(self.malformed_reply(reply, &dead))
            }
            [ok, removed, left] if tag(ok) == Some(b"ok") => {
                let number = |v: &Value| match v {
                    Value::Int(n) => Some(*n),
                    _ => None,
                };
                match (number(removed), number(left)) {
                    (Some(removed), Some(left)) => {
                        Ok(Reclaimed::new(removed.max(0) as u64, left > 0))
                    }
                    _ => Err(self.malformed_reply(reply, &dead)),
                }
            }
            _ => Err(self.malformed_reply(reply, &dead)),
        }
    }
}
