//! Test doubles of the Runner rules: apply closures that record their call
//! or fail, and a store wrapper whose `complete` always fails.
//!
//! They stand in for the caller's side effect and for a store failing at one
//! precise step; every other call goes to the store under test unchanged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::sideeffect::{
    async_trait, Acquired, Action, EffectResult, Execution, Lease, ReconcileClaim, Resolution,
    SideEffectError, SideEffectStore,
};
use coord_backend::Error;

use super::helpers::{io_error, result};
use crate::BoxFuture;

type ApplyResult = Result<EffectResult, std::io::Error>;

pub(super) fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// An apply that records it was called and returns `text`.
pub(super) fn recording_apply(
    called: &Arc<AtomicBool>,
    text: &'static str,
) -> impl FnOnce(Lease) -> BoxFuture<'static, ApplyResult> {
    let called = called.clone();
    move |_lease| {
        Box::pin(async move {
            called.store(true, Ordering::SeqCst);
            Ok(result(text))
        })
    }
}

pub(super) fn failing_apply(_lease: Lease) -> BoxFuture<'static, ApplyResult> {
    Box::pin(async { Err(io_error("remote timed out")) })
}

/// A store whose `complete` always fails with `Unavailable` (before touching anything).
#[derive(Debug)]
pub(super) struct CompleteFails(pub(super) Arc<dyn SideEffectStore>);

#[async_trait]
impl SideEffectStore for CompleteFails {
    async fn acquire(&self, action: &Action, ttl: Duration) -> Result<Acquired, SideEffectError> {
        self.0.acquire(action, ttl).await
    }
    async fn complete(
        &self,
        _action: &Action,
        _lease: &Lease,
        _result: EffectResult,
    ) -> Result<EffectResult, SideEffectError> {
        Err(SideEffectError::Store(Error::Unavailable {
            message: "injected complete failure (conformance)".into(),
            source: None,
        }))
    }
    async fn release(&self, action: &Action, lease: &Lease) -> Result<(), SideEffectError> {
        self.0.release(action, lease).await
    }
    async fn renew(
        &self,
        action: &Action,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease, SideEffectError> {
        self.0.renew(action, lease, ttl).await
    }
    async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.0.mark_uncertain(action, lease, reason).await
    }
    async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Execution, SideEffectError> {
        self.0.resolve_uncertain(action, resolution).await
    }
    async fn abandon(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        self.0.abandon(action, lease, reason).await
    }
    async fn begin_reconcile(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError> {
        self.0.begin_reconcile(action, ttl).await
    }
    async fn resolve_uncertain_owned(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: &str,
    ) -> Result<Execution, SideEffectError> {
        self.0
            .resolve_uncertain_owned(action, resolution, holder)
            .await
    }
}
