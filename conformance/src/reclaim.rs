//! The reclaim suite: removing tombstones never hands a version out twice.
//!
//! [`Backend::reclaim`] removes the counters deleted keys leave behind and
//! raises the namespace's floor in the same step (see
//! `coord_backend::reclaim`). What the suite pins down:
//!
//! - [`reclaim_keeps_versions_unique`]: after a reclaim, live keys are
//!   untouched, deleted keys read and list as missing, a re-created key
//!   starts above every version it had, and every old version is refused
//!   by an assert;
//! - [`reclaim_is_bounded`]: one call removes at most
//!   [`ReclaimOptions::max_tombstones`], says when more are left, and
//!   repeated calls end with nothing left;
//! - [`reclaim_races_create`]: reclaims racing creates (`assert missing`,
//!   put) and deletes of the very keys being reclaimed, from separate
//!   clients: every create lands above every version its key had;
//! - [`reclaim_sequences`]: seeded random sequences of puts, creates,
//!   deletes, stale asserts and reclaims against a model that knows values
//!   and liveness exactly and versions as far as the rule fixes them (+1 per
//!   write of a live key; above everything the key had after a re-create).
//!
//! The boundary: the trait cannot show that storage shrank. Each store's own
//! tests count its records after a reclaim, and the scale bench measures
//! bytes.

use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Mutation, ReclaimOptions, Version};
use tokio::sync::watch;

use crate::backend::{applied as apply, created};
use crate::{ensure, unique_namespace, BackendFactory, CheckResult, Failure};

async fn open(factory: &BackendFactory, label: &str) -> Result<Arc<dyn Backend>, Failure> {
    Ok(factory(unique_namespace(label)).await?)
}

async fn get(backend: &dyn Backend, key: &str) -> Result<Entry, Failure> {
    let mut entries = backend.snapshot(&[key.to_owned()]).await?;
    entries
        .pop()
        .ok_or_else(|| Failure::new("a snapshot of one key returned nothing"))
}

/// Put `key` `writes` times from missing, then delete it; returns every
/// version the key had, oldest first (the last is the highest).
async fn churn(backend: &dyn Backend, key: &str, writes: u64) -> Result<Vec<Version>, Failure> {
    let mut version = Version::MISSING;
    let mut had = Vec::new();
    for n in 0..writes {
        apply(
            backend,
            &[Assert::at(key, version)],
            &[Mutation::put(key, format!("w{n}"))],
            &format!("put #{n} of {key}"),
        )
        .await?;
        version = get(backend, key).await?.version;
        had.push(version);
    }
    apply(
        backend,
        &[Assert::at(key, version)],
        &[Mutation::delete(key)],
        &format!("delete of {key}"),
    )
    .await?;
    Ok(had)
}

/// No version `key` had before passes an assert any more.
async fn refuses_old(backend: &dyn Backend, key: &str, had: &[Version], when: &str) -> CheckResult {
    for old in had {
        let outcome = backend.txn(&[Assert::at(key, *old)], &[]).await?;
        ensure!(
            !outcome.applied,
            "{when}: an assert at {key}'s old version {old} passed"
        );
    }
    Ok(())
}

fn highest(had: &[Version]) -> Version {
    had.iter().copied().max().unwrap_or(Version::MISSING)
}

/// Reclaim until the store says nothing is left (at most `calls` calls).
async fn reclaim_all(backend: &dyn Backend, max: usize, calls: usize) -> Result<u64, Failure> {
    let options = ReclaimOptions::DEFAULT.with_max_tombstones(max);
    let mut removed = 0;
    for _ in 0..calls {
        let done = backend.reclaim(&options).await?;
        ensure!(
            done.removed <= max as u64,
            "one reclaim with max_tombstones = {max} removed {}",
            done.removed
        );
        removed += done.removed;
        if !done.more {
            return Ok(removed);
        }
    }
    Err(Failure::new(format!(
        "{calls} reclaims of at most {max} tombstones each still report more left"
    )))
}

/// After a reclaim: live keys keep their versions and values, deleted keys
/// read and list as missing, a re-created key starts above every version it
/// had and moves by exactly 1 after that, and no old version passes an
/// assert again (ABA).
pub async fn reclaim_keeps_versions_unique(factory: BackendFactory) -> CheckResult {
    let backend = open(&factory, "reclaim_unique").await?;
    let backend = &*backend;
    let deep = churn(backend, "deep", 3).await?;
    let shallow = churn(backend, "shallow", 1).await?;
    // Re-created below by one txn of two keys: a store may create keys in a
    // multi-key txn by another path than in a single-key one.
    let pair = [
        ("pair-a", churn(backend, "pair-a", 2).await?),
        ("pair-b", churn(backend, "pair-b", 1).await?),
    ];
    // A delete of a key that never existed leaves a counter too.
    apply(
        backend,
        &[Assert::missing("ghost")],
        &[Mutation::delete("ghost")],
        "delete of a missing key",
    )
    .await?;
    created(backend, "live", "a", "create live").await?;
    let live_v1 = get(backend, "live").await?.version;
    apply(
        backend,
        &[Assert::at("live", live_v1)],
        &[Mutation::put("live", "b")],
        "update live",
    )
    .await?;
    let live_before = get(backend, "live").await?;

    reclaim_all(backend, 1000, 100).await?;

    let live_after = get(backend, "live").await?;
    ensure!(
        live_after == live_before,
        "reclaim changed a live key: {live_before:?} became {live_after:?}"
    );
    for key in ["deep", "shallow", "ghost", "pair-a", "pair-b"] {
        let entry = get(backend, key).await?;
        ensure!(
            entry == Entry::missing(key),
            "after reclaim the deleted key {key} reads as {entry:?}"
        );
    }
    let listed = backend.keys("").await?;
    ensure!(
        listed == vec!["live".to_owned()],
        "after reclaim keys() lists {listed:?} (expected only \"live\")"
    );
    let again = backend.reclaim(&ReclaimOptions::DEFAULT).await?;
    ensure!(
        !again.more && again.removed == 0,
        "a second reclaim with nothing deleted since reports {again:?}"
    );

    // "ghost" had no live version; its counter was never visible.
    for (key, had) in [("deep", deep), ("shallow", shallow), ("ghost", Vec::new())] {
        let highest = highest(&had);
        created(
            backend,
            key,
            "again",
            &format!("re-create of {key} after reclaim"),
        )
        .await?;
        let recreated = get(backend, key).await?.version;
        ensure!(
            recreated > highest,
            "{key} had version {highest} before its delete; re-created after reclaim it got \
             {recreated}: a version was handed out twice"
        );
        refuses_old(backend, key, &had, "after reclaim and re-create").await?;
        apply(
            backend,
            &[Assert::at(key, recreated)],
            &[Mutation::put(key, "next")],
            &format!("update of re-created {key}"),
        )
        .await?;
        let next = get(backend, key).await?.version;
        ensure!(
            next == Version(recreated.0 + 1),
            "a put on {key} at {recreated} gave {next} (expected +1 per write)"
        );
    }
    apply(
        backend,
        &[Assert::missing("pair-a"), Assert::missing("pair-b")],
        &[
            Mutation::put("pair-a", "again"),
            Mutation::put("pair-b", "again"),
        ],
        "re-create of pair-a and pair-b in one txn after reclaim",
    )
    .await?;
    for (key, had) in &pair {
        let highest = highest(had);
        let recreated = get(backend, key).await?.version;
        ensure!(
            recreated > highest,
            "{key} had version {highest} before its delete; re-created after reclaim by a txn \
             of two keys it got {recreated}: a version was handed out twice"
        );
        refuses_old(backend, key, had, "after reclaim and a two-key re-create").await?;
    }
    // A key never written starts at 1 or above, like any key.
    created(backend, "fresh", "x", "create of a never-written key").await?;
    ensure!(
        !get(backend, "fresh").await?.version.is_missing(),
        "a created key reads as missing"
    );
    Ok(())
}

/// One reclaim removes at most `max_tombstones`, says whether more are
/// left, and repeated calls end; what it leaves reads exactly as before.
pub async fn reclaim_is_bounded(factory: BackendFactory) -> CheckResult {
    let backend = open(&factory, "reclaim_bounded").await?;
    let backend = &*backend;
    let mut churned = Vec::new();
    for i in 0..30 {
        let key = format!("d/{i:02}");
        churned.push((key.clone(), churn(backend, &key, 2).await?));
    }
    created(backend, "keep", "k", "create keep").await?;
    let removed = reclaim_all(backend, 7, 30).await?;
    ensure!(
        removed <= 30,
        "reclaims removed {removed} tombstones after 30 deletes"
    );
    ensure!(
        backend.keys("").await? == vec!["keep".to_owned()],
        "after bounded reclaims keys() lists {:?}",
        backend.keys("").await?
    );
    for (key, had) in churned {
        let before = highest(&had);
        created(
            backend,
            key.as_str(),
            "again",
            &format!("re-create of {key}"),
        )
        .await?;
        let now = get(backend, &key).await?.version;
        ensure!(
            now > before,
            "{key} had v{} before its delete and got {now} after bounded reclaims",
            before.0
        );
        refuses_old(backend, &key, &had, "after bounded reclaims").await?;
    }
    Ok(())
}

/// Reclaims race creates and deletes of the very keys they reclaim, each
/// from its own client: every create lands above every version its key had,
/// and whatever order the store picked, an old version never passes again.
///
/// Each create is released at its own point of the reclaim's progress (as
/// a call starts, after it returned, or at once), and the points rotate
/// from round to round. Left to the scheduler, a loaded machine could run
/// every create before the first reclaim call, and the race would never
/// happen: the check then passed a store that forgets its floor.
pub async fn reclaim_races_create(factory: BackendFactory) -> CheckResult {
    const ROUNDS: usize = 12;
    const KEYS: usize = 6;
    let namespace = unique_namespace("reclaim_race");
    let setup = factory(namespace.clone()).await?;
    let mut clients = Vec::new();
    for _ in 0..KEYS + 1 {
        clients.push(factory(namespace.clone()).await?);
    }
    for round in 0..ROUNDS {
        let mut had = Vec::new();
        for i in 0..KEYS {
            let key = format!("r{round}/{i}");
            // Different depths, so a floor taken from the wrong key shows.
            let writes = 1 + (i as u64 % 3);
            had.push(churn(&*setup, &key, writes).await?);
        }
        // Progress of the reclaim: 2k-1 as call k starts, 2k once it
        // returned, `usize::MAX` when the reclaimer stopped (done or failed).
        let (progress, _) = watch::channel(0usize);
        let progress = Arc::new(progress);
        let reclaimer = clients[KEYS].clone();
        let reported = progress.clone();
        let reclaim = tokio::spawn(async move {
            let options = ReclaimOptions::DEFAULT.with_max_tombstones(2);
            let mut outcome = Ok(());
            for call in 1..=KEYS * 4 {
                reported.send_replace(2 * call - 1);
                match reclaimer.reclaim(&options).await {
                    Ok(reclaimed) => {
                        reported.send_replace(2 * call);
                        // Let the creates released by this call run before
                        // the next one starts.
                        tokio::task::yield_now().await;
                        if !reclaimed.more {
                            break;
                        }
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            reported.send_replace(usize::MAX);
            outcome
        });
        let mut creates = Vec::new();
        for (i, client) in clients.iter().take(KEYS).enumerate() {
            let client = client.clone();
            let key = format!("r{round}/{i}");
            // 0: at once; then the start and the end of each of the first
            // three calls (six tombstones, two per call).
            let release = (round + i) % (KEYS + 1);
            let mut watching = progress.subscribe();
            creates.push(tokio::spawn(async move {
                let _ = watching.wait_for(|&at| at >= release).await;
                // Odd keys are deleted once more first (a delete of a
                // missing key also writes its counter) while the reclaim runs.
                if i % 2 == 1 {
                    let out = client
                        .txn(
                            &[Assert::missing(key.as_str())],
                            &[Mutation::delete(key.as_str())],
                        )
                        .await?;
                    if !out.applied {
                        return Ok(None);
                    }
                }
                let out = client
                    .txn(
                        &[Assert::missing(key.as_str())],
                        &[Mutation::put(key.as_str(), "raced")],
                    )
                    .await?;
                Ok::<_, coord_backend::Error>(out.applied.then_some(()))
            }));
        }
        reclaim
            .await
            .map_err(|e| Failure::new(format!("reclaim task: {e}")))??;
        for (i, create) in creates.into_iter().enumerate() {
            let key = format!("r{round}/{i}");
            let created = create
                .await
                .map_err(|e| Failure::new(format!("create task: {e}")))??;
            ensure!(
                created.is_some(),
                "round {round}: the only writer of {key} was refused"
            );
            let entry = get(&*setup, &key).await?;
            ensure!(
                entry.version > highest(&had[i]),
                "round {round}: {key} had v{} before its delete; created while a reclaim \
                 ran, it got {}: a version was handed out twice",
                highest(&had[i]).0,
                entry.version
            );
            refuses_old(&*setup, &key, &had[i], &format!("round {round}")).await?;
        }
    }
    Ok(())
}

/// What the model knows of one key.
#[derive(Clone, Debug, Default)]
struct ModelKey {
    /// The value, when the key exists.
    value: Option<Vec<u8>>,
    /// Its version when known exactly (live keys after a snapshot or a put
    /// on a known version).
    version: Option<Version>,
    /// Every version the store ever reported for the key.
    had: Vec<Version>,
}

/// Seeded random sequences of writes and reclaims against a model of what
/// the rule fixes: values and liveness exactly; a put on a live key at `v`
/// makes it `v + 1`; a re-created key starts above every version it had;
/// an assert at any old version is refused. Each sequence runs in a fresh
/// namespace; a failure names its seed.
pub async fn reclaim_sequences(factory: BackendFactory) -> CheckResult {
    use rand::{Rng, SeedableRng};
    const KEYS: [&str; 4] = ["a", "b", "c", "d/e"];
    let first_seed = rand::random::<u32>() as u64;
    for case in 0..12u64 {
        let seed = first_seed + case;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let backend = open(&factory, "reclaim_seq").await?;
        let backend = &*backend;
        let mut model: std::collections::BTreeMap<&str, ModelKey> =
            KEYS.iter().map(|k| (*k, ModelKey::default())).collect();
        for step in 0..40 {
            let key = KEYS[rng.random_range(0..KEYS.len())];
            let at = format!("seed {seed}, step {step}");
            let entry = model.get_mut(key).expect("a model key");
            match rng.random_range(0..10) {
                // A write asserting what the model knows.
                0..=5 => {
                    let value = format!("{seed}-{step}").into_bytes();
                    let (assert, mutation) = match (&entry.value, rng.random_bool(0.3)) {
                        (Some(_), true) => (entry.version, Mutation::delete(key)),
                        (Some(_), false) => (entry.version, Mutation::put(key, value.clone())),
                        (None, _) => (Some(Version::MISSING), Mutation::put(key, value.clone())),
                    };
                    let Some(assert) = assert else { continue };
                    let out = backend
                        .txn(&[Assert::at(key, assert)], std::slice::from_ref(&mutation))
                        .await?;
                    ensure!(out.applied, "{at}: a txn asserting {key}@{assert} (what the model knows) was refused: {:?}", out.current);
                    match mutation {
                        Mutation::Delete { .. } => {
                            entry.value = None;
                            entry.version = None;
                        }
                        Mutation::Put { .. } => {
                            entry.value = Some(value);
                            entry.version = (!assert.is_missing()).then(|| Version(assert.0 + 1));
                        }
                    }
                }
                // A stale assert at a version the key had.
                6 if !entry.had.is_empty() => {
                    let old = entry.had[rng.random_range(0..entry.had.len())];
                    if Some(old) != entry.version {
                        let out = backend.txn(&[Assert::at(key, old)], &[]).await?;
                        ensure!(
                            !out.applied,
                            "{at}: an assert at {key}'s old version {old} passed"
                        );
                    }
                }
                // A delete of a missing key.
                7 if entry.value.is_none() => {
                    let out = backend
                        .txn(&[Assert::missing(key)], &[Mutation::delete(key)])
                        .await?;
                    ensure!(
                        out.applied,
                        "{at}: deleting the missing key {key} was refused"
                    );
                }
                _ => {
                    let max = rng.random_range(1..4);
                    reclaim_all(backend, max, 100).await?;
                }
            }
            // The whole namespace against the model.
            let names: Vec<String> = KEYS.iter().map(|k| (*k).to_owned()).collect();
            for seen in backend.snapshot(&names).await? {
                let entry = model.get_mut(seen.key.as_str()).expect("a model key");
                ensure!(
                    seen.value == entry.value,
                    "{at}: {} holds {:?}, the model {:?}",
                    seen.key,
                    seen.value,
                    entry.value
                );
                if seen.value.is_none() {
                    continue;
                }
                match entry.version {
                    Some(known) => ensure!(
                        seen.version == known,
                        "{at}: {} is at {}, the model says {known} (+1 per write)",
                        seen.key,
                        seen.version
                    ),
                    None => {
                        let highest = highest(&entry.had);
                        ensure!(
                            seen.version > highest,
                            "{at}: {} was (re)created at {}, not above {highest} which it had",
                            seen.key,
                            seen.version
                        );
                        entry.version = Some(seen.version);
                    }
                }
                if entry.had.last() != Some(&seen.version) {
                    entry.had.push(seen.version);
                }
            }
            let live: Vec<String> = model
                .iter()
                .filter(|(_, e)| e.value.is_some())
                .map(|(k, _)| (*k).to_owned())
                .collect();
            let listed = backend.keys("").await?;
            ensure!(
                listed == live,
                "{at}: keys() lists {listed:?}, the model {live:?}"
            );
        }
    }
    Ok(())
}

crate::__define_suite! {$
    /// The reclaim suite's one list of cases (see [`crate::__define_suite!`]).
    __reclaim_suite "reclaim";
    /// Every case of the reclaim suite, over a backend factory.
    cases;
    /// Expand the reclaim suite into one `#[tokio::test]` per case, over a
    /// [`BackendFactory`] expression (evaluated once per test; it may also be an
    /// `Option<BackendFactory>`, `None` = skipped).
    reclaim_tests(reclaim);
    reclaim_keeps_versions_unique,
    reclaim_is_bounded,
    reclaim_races_create,
    reclaim_sequences,
}
