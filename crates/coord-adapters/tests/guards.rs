//! Every guard keeps the same promises (crate::guard): it renews while held
//! and keeps competitors out, a pause of the whole process longer than the
//! TTL makes `is_valid` false at once and fires the lost signal (and a
//! competitor then gets a higher fence), and dropping it releases. One set of
//! checks, run for each kind of grant: lock, semaphore permit, read lock,
//! write lock, leadership, board claim. The stores' own renew and release
//! are checked by each recipe's suite on every store; this is the guard.
//!
//! A "pause" blocks the runtime's only thread (`std::thread::sleep` on a
//! current-thread runtime): the renewal task is frozen with the rest of the
//! process, as under a GC pause or `SIGSTOP`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_adapters::board::{Board, BoardAdapter, BoardError, ClaimGuard, TaskSpec};
use coord_adapters::election::{Election, GenericElection, LeadershipGuard};
use coord_adapters::guard::{Guard, Renew};
use coord_adapters::lock::{
    GenericLock, GenericSemaphore, Lock, LockGuard, PermitGuard, Semaphore,
};
use coord_adapters::rwlock::{GenericRwLock, RwGuard, RwLock};
use coord_backend::Backend;
use coord_memory::SingleProcessMemoryBackend;

const TTL: Duration = Duration::from_secs(1);
const KEY: &str = "guarded";

fn store(name: &str) -> Arc<dyn Backend> {
    Arc::new(SingleProcessMemoryBackend::new(&format!("guards-{name}")).unwrap())
}

/// One kind of grant: how to take it under a guard, and whether a
/// competitor can take it now (its fence when it could; it gives it back).
#[async_trait(?Send)]
trait Kind {
    type Source: Renew + ?Sized + 'static;
    async fn guard(&self) -> Guard<Self::Source>;
    async fn competitor(&self) -> Option<u64>;
}

struct Locks(Arc<dyn Lock>);

#[async_trait(?Send)]
impl Kind for Locks {
    type Source = dyn Lock;
    async fn guard(&self) -> LockGuard {
        LockGuard::try_acquire(&self.0, KEY, TTL)
            .await
            .unwrap()
            .expect("free")
    }
    async fn competitor(&self) -> Option<u64> {
        let held = self.0.try_lock(KEY, TTL).await.unwrap()?;
        let fence = held.fence();
        self.0.release(held).await.unwrap();
        Some(fence)
    }
}

struct Permits(Arc<dyn Semaphore>);

#[async_trait(?Send)]
impl Kind for Permits {
    type Source = dyn Semaphore;
    async fn guard(&self) -> PermitGuard {
        PermitGuard::try_acquire(&self.0, KEY, 1, TTL)
            .await
            .unwrap()
            .expect("free")
    }
    async fn competitor(&self) -> Option<u64> {
        let permit = self.0.try_acquire(KEY, 1, TTL).await.unwrap()?;
        let fence = permit.fence();
        self.0.release(permit).await.unwrap();
        Some(fence)
    }
}

/// A read lock (`write = false`) or a write lock, kept out by a writer.
struct Rw(Arc<dyn RwLock>, bool);

#[async_trait(?Send)]
impl Kind for Rw {
    type Source = dyn RwLock;
    async fn guard(&self) -> RwGuard {
        let guard = if self.1 {
            RwGuard::try_write(&self.0, KEY, TTL).await
        } else {
            RwGuard::try_read(&self.0, KEY, TTL).await
        };
        guard.unwrap().expect("free")
    }
    async fn competitor(&self) -> Option<u64> {
        let handle = self.0.try_write(KEY, TTL).await.unwrap()?;
        let fence = handle.fence();
        self.0.release(handle).await.unwrap();
        Some(fence)
    }
}

struct Leaders(Arc<dyn Election>);

#[async_trait(?Send)]
impl Kind for Leaders {
    type Source = dyn Election;
    async fn guard(&self) -> LeadershipGuard {
        LeadershipGuard::try_campaign(&self.0, KEY, "a", "10.0.0.1", TTL)
            .await
            .unwrap()
            .expect("nobody leads")
    }
    async fn competitor(&self) -> Option<u64> {
        let lead = self
            .0
            .try_campaign(KEY, "b", "10.0.0.2", TTL)
            .await
            .unwrap()?;
        let term = lead.term();
        self.0.resign(lead).await.unwrap();
        Some(term)
    }
}

struct Claims(Arc<dyn Board>);

#[async_trait(?Send)]
impl Kind for Claims {
    type Source = dyn Board;
    async fn guard(&self) -> ClaimGuard {
        self.0
            .add(TaskSpec::new(KEY, b"payload".to_vec()))
            .await
            .unwrap();
        ClaimGuard::claim(&self.0, KEY, "a", TTL).await.unwrap()
    }
    async fn competitor(&self) -> Option<u64> {
        match self.0.claim(KEY, "b", TTL).await {
            Ok(claim) => {
                self.0.release(KEY, &claim.token).await.unwrap();
                Some(claim.fence)
            }
            Err(BoardError::AlreadyClaimed { .. }) => None,
            Err(other) => panic!("claim: {other}"),
        }
    }
}

async fn renews_and_holds<K: Kind>(kind: K) {
    let guard = kind.guard().await;
    let fence = guard.fence();
    // Four steps of 0.4 TTL: the grant outlives its TTL only by renewals.
    for _ in 0..4 {
        tokio::time::sleep(TTL * 2 / 5).await;
        assert_eq!(kind.competitor().await, None, "a competitor got in");
    }
    assert!(guard.is_valid() && !guard.is_lost());
    assert!(guard.renewals() >= 2, "{} renewals", guard.renewals());
    guard.release().await.unwrap();
    let next = kind.competitor().await.expect("free after release");
    assert!(next > fence, "fence {next} after {fence}");
}

async fn a_pause_longer_than_the_ttl_loses_it<K: Kind>(kind: K) {
    let guard = kind.guard().await;
    let fence = guard.fence();
    let signal = guard.lost_signal();
    assert!(guard.is_valid());
    // The whole process stops: the renewal task with it.
    std::thread::sleep(TTL * 2);
    assert!(!guard.is_valid(), "valid after a pause of twice the TTL");
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lost signal fired");
    assert!(signal.borrow().is_some(), "a cloned signal shows the loss");
    let next = kind
        .competitor()
        .await
        .unwrap_or_else(|| panic!("a competitor takes over after the loss ({reason})"));
    assert!(next > fence, "fence {next} after {fence}");
    assert!(
        guard.release().await.is_err(),
        "releasing a lost grant is refused"
    );
}

async fn drop_releases<K: Kind>(kind: K) {
    let guard = kind.guard().await;
    drop(guard);
    // Well within the TTL: a grant merely left to expire does not count.
    let deadline = tokio::time::Instant::now() + TTL / 2;
    while tokio::time::Instant::now() < deadline {
        if kind.competitor().await.is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the dropped guard's grant was not released within half its TTL");
}

macro_rules! every_kind {
    ($($check:ident),*) => {
        $(mod $check {
            use super::*;

            #[tokio::test(flavor = "current_thread")]
            async fn lock() {
                $check(Locks(Arc::new(GenericLock::new(store(concat!(stringify!($check), "-lock")))))).await
            }

            #[tokio::test(flavor = "current_thread")]
            async fn permit() {
                $check(Permits(Arc::new(GenericSemaphore::new(store(concat!(stringify!($check), "-permit")))))).await
            }

            #[tokio::test(flavor = "current_thread")]
            async fn read_lock() {
                $check(Rw(Arc::new(GenericRwLock::new(store(concat!(stringify!($check), "-read")))), false)).await
            }

            #[tokio::test(flavor = "current_thread")]
            async fn write_lock() {
                $check(Rw(Arc::new(GenericRwLock::new(store(concat!(stringify!($check), "-write")))), true)).await
            }

            #[tokio::test(flavor = "current_thread")]
            async fn leadership() {
                $check(Leaders(Arc::new(GenericElection::new(store(concat!(stringify!($check), "-lead")))))).await
            }

            #[tokio::test(flavor = "current_thread")]
            async fn claim() {
                $check(Claims(Arc::new(BoardAdapter::new(store(concat!(stringify!($check), "-claim")))))).await
            }
        })*
    };
}

every_kind!(
    renews_and_holds,
    a_pause_longer_than_the_ttl_loses_it,
    drop_releases
);
