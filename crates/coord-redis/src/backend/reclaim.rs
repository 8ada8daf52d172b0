//! `Backend::reclaim` on Redis: the tombstone set and the floor.

use std::sync::LazyLock;

use coord_backend::{Error, ReclaimOptions, Reclaimed, Result};
use redis::Value;

use super::{array, bytes, tag, Call, Lua, Op, RedisBackend};
use crate::scripts;

static RECLAIM_CANDIDATES: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::RECLAIM_CANDIDATES));
static RECLAIM: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::RECLAIM));

impl RedisBackend {
    /// Two scripts: one lists the first members of the tombstone set, the
    /// next (naming them as its keys, so it is a valid Cluster script)
    /// deletes those still tombstones and raises the floor, atomically.
    pub(super) async fn reclaim_pass(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
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
        if candidates.is_empty() {
            return Ok(Reclaimed::new(0, false));
        }
        let mut run = Call::new(&RECLAIM);
        run.key(self.dead_key.as_slice())
            .key(self.floor_key.as_slice());
        for member in &candidates {
            let mut record = self.record_prefix.clone();
            record.extend_from_slice(member);
            run.key(record);
        }
        run.arg(self.record_prefix.len());
        // A reclaim changes nothing a reader can see: an unknown outcome is
        // only "try again later".
        let reply = match self.call(&run, Op::Txn, "reclaim").await {
            Err(Error::Indeterminate { message, source }) => {
                return Err(Error::Unavailable { message, source })
            }
            other => other?,
        };
        let reply = array(reply).map_err(|e| self.malformed_reply(e, &dead))?;
        match reply.as_slice() {
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
