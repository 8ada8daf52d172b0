//! No span, log line or `Debug` output of an adapter operation carries a
//! token or a value: every adapter runs a workload under a subscriber that
//! records everything (TRACE, span fields, span open/close), and the output
//! is searched for every token and value the workload saw.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, TaskSpec};
use coord_adapters::lock::{GenericLock, Lock};
use coord_adapters::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};
use coord_backend::{Backend, Metered};
use coord_memory::SingleProcessMemoryBackend;
use tracing_subscriber::fmt::format::FmtSpan;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn spans_and_logs_carry_keys_and_fences_but_no_token_or_value() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::FULL)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let secrets: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = secrets.clone();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let store: Arc<dyn Backend> = Metered::wrap(
                    "memory",
                    Arc::new(SingleProcessMemoryBackend::new("redaction").unwrap()),
                );
                let ttl = Duration::from_secs(30);

                let lock = GenericLock::new(store.clone());
                let handle = lock.try_lock("locks/report", ttl).await.unwrap().unwrap();
                seen.lock().unwrap().push(handle.token().to_owned());
                lock.renew(&handle).await.unwrap();
                lock.release(handle).await.unwrap();

                let board = BoardAdapter::new(store.clone());
                board
                    .add(TaskSpec::new("task-1", b"PAYLOAD-secret-board".to_vec()))
                    .await
                    .unwrap();
                let claimed = board.claim("task-1", "agent", ttl).await.unwrap();
                seen.lock().unwrap().push(claimed.token.clone());
                board.renew("task-1", &claimed.token, ttl).await.unwrap();
                board
                    .complete("task-1", &claimed.token, b"RESULT-secret-board".to_vec())
                    .await
                    .unwrap();

                let runner = Runner::new(Arc::new(SideEffectAdapter::new(store.clone())));
                let action =
                    Action::new("refund/7", "payments").with_payload(b"PAYLOAD-secret-se".to_vec());
                let leases = seen.clone();
                runner
                    .execute(&action, ttl, move |lease| async move {
                        leases.lock().unwrap().push(lease.token.clone());
                        Ok::<_, std::io::Error>(EffectResult::from("RESULT-secret-se"))
                    })
                    .await
                    .unwrap();
                // Every adapter's `Debug` shows its engine, cache and store: no value in them.
                seen.lock()
                    .unwrap()
                    .push(format!("{lock:?}\n{board:?}\n{runner:?}\n{store:?}"));
                let failing = Action::new("refund/8", "payments");
                let leases = seen.clone();
                let _ = runner
                    .execute(&failing, ttl, move |lease| async move {
                        leases.lock().unwrap().push(lease.token.clone());
                        Err::<EffectResult, _>(std::io::Error::other("reset"))
                    })
                    .await;
            });
    });
    let mut output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let mut secrets = secrets.lock().unwrap();
    // The `Debug` of the adapters, searched like the log.
    let at = secrets
        .iter()
        .position(|s| s.contains("SingleProcessMemoryBackend"))
        .expect("the Debug output was recorded");
    let debugs = secrets.remove(at);
    output.push_str(&debugs);
    assert_eq!(secrets.len(), 4, "every operation handed out a token");
    // As text, and as the `[80, 65, ...]` a derived `Debug` of bytes would print.
    let leaks = |secret: &str| {
        let bytes = format!("{:?}", secret.as_bytes());
        output.contains(secret) || output.contains(bytes.trim_matches(['[', ']']))
    };
    for secret in secrets.iter() {
        assert!(!leaks(secret), "token {secret} in the output:\n{output}");
    }
    for value in ["PAYLOAD-secret", "RESULT-secret"] {
        assert!(!leaks(value), "{value} in the output:\n{output}");
    }
    // What an operator needs is there: the spans, their keys, fences and store.
    for expected in [
        "lock.try_lock",
        "key=locks/report",
        "fence=1",
        "board.claim",
        "key=task-1",
        "sideeffect.acquire",
        "key=refund/7",
        "store=\"memory\"",
    ] {
        assert!(output.contains(expected), "{expected} missing:\n{output}");
    }
}
