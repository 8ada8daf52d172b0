use std::sync::Arc;
use std::time::{Duration, Instant};
use coord_adapters::lock::{FairLock, Lock, LockExt, WaitOptions};
use coord_backend::{Backend, StoreUrl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_debug() {
    let url = std::env::var("DBG_URL").unwrap();
    let _ = StoreUrl::parse(&url).unwrap();
    let backend: Arc<dyn Backend> = Arc::new(coord_etcd::EtcdBackend::connect(&StoreUrl::parse(&url).unwrap()).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    let key = format!("k{}", coord_adapters::mint_token());
    for _ in 0..32usize {
        let lock = FairLock::new(backend.clone());
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let now = Instant::now();
                if now >= deadline { break; }
                match lock.lock_with(&key, Duration::from_secs(30), &WaitOptions::with_timeout(deadline - now)).await {
                    Ok(h) => { n += 1; lock.release(h).await.unwrap(); }
                    Err(_) => break,
                }
            }
            (n, lock.stats())
        }));
    }
    let mut total = 0; let (mut s, mut t, mut r) = (0, 0, 0);
    for task in tasks { let (n, st) = task.await.unwrap(); total += n; s += st.snapshots; t += st.txns; r += st.rejections; }
    eprintln!("acq {total}: snapshots/acq {:.2} txns/acq {:.2} rejections/acq {:.2}", s as f64 / total as f64, t as f64 / total as f64, r as f64 / total as f64);
}
