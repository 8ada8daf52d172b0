//! `coordctl serve` (the web console) and the `--json` outputs, end to end.
//!
//! A fresh store is seeded through the adapters with live locks (one of
//! them with an HTML key), tasks, side-effect keys (two marked uncertain,
//! one whose lease was lost, one live in flight) and scheduler history
//! (succeeded, failed, skipped, running). Then `coordctl serve` runs on a
//! free port and:
//!
//! - the `/api/` answers parse as JSON and hold exactly the seeded records;
//! - hostile input is refused with a status and a message (bad `limit`,
//!   unknown parameter, bad job name, huge path, foreign `Host`), never a 5xx;
//! - without `--allow-writes` the reconcile form is absent and `POST
//!   /reconcile` is 403; with it, form → confirmation → recorded verdict,
//!   after which the key may run again;
//! - headless Chromium loads every page (`--dump-dom`): the keys, fences,
//!   the uncertain key and the job runs are on it, the HTML key shows
//!   escaped and no `<script>` element exists; a screenshot of each page is
//!   written to `<target>/console-screenshots/<page>.png`.
//!
//! SQLite always; PostgreSQL and Redis when `COORD_TEST_POSTGRES_URL` /
//! `COORD_TEST_REDIS_URL` are set (the API and the reconcile flow; the
//! browser part runs once, on SQLite). Without a `chromium` binary (or
//! `COORD_CHROMIUM=/path`) the browser part prints SKIPPED, and fails
//! under `COORD_REQUIRE_SERVERS=1`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use coord_adapters::board::{Board, BoardAdapter, TaskSpec};
use coord_adapters::lock::{FairLock, GenericLock, GenericSemaphore, Lock, Semaphore};
use coord_adapters::sideeffect::{Action, KeyStatus, SideEffectAdapter, SideEffectStore};
use coord_backend::SystemClock;
use coord_scheduler::{
    ClaimRequest, FinalStatus, RunStore, RunStoreOptions, SkipReason, SlotStore,
};
use serde_json::Value;

mod common;
use common::serve::{find, http, url_encode, Server};
use common::{coordctl, inspect_text, server_url, unique, Scratch, COORDCTL};
const HOSTILE: &str = "<script>alert(1)</script>";
const HOSTILE_EFFECT: &str = "<img src=x onerror=alert(2)>";
const TEN_MIN: Duration = Duration::from_secs(600);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// What the seed put in the store (what the pages must show).
struct Seeded {
    /// Slots of the job `nightly`: succeeded, failed, skipped, running.
    slots: [u64; 4],
}

/// Locks, tasks, side-effect keys and scheduler history in `url`'s namespace.
fn seed(url: &str) -> Seeded {
    runtime().block_on(async {
        let backend = coord::connect(url).await.expect("store reachable");

        // Locks: `orders/42` held (fence 1), `reports` released then held again
        // (fence 2), an HTML key held, `idle-lock` released (free, fence 1).
        let locks = GenericLock::new(backend.clone());
        for key in ["orders/42", "reports", HOSTILE, "idle-lock"] {
            let h = locks.try_lock(key, TEN_MIN).await.unwrap().expect("free");
            if key == "reports" || key == "idle-lock" {
                locks.release(h).await.unwrap();
            }
        }
        let again = locks.try_lock("reports", TEN_MIN).await.unwrap().unwrap();
        assert_eq!(again.fence(), 2);

        // A fair lock held (fence 1), and a semaphore of 3 permits, 2 held.
        let fair = FairLock::new(backend.clone());
        let held = fair.try_lock("print-queue", TEN_MIN).await.unwrap();
        assert_eq!(held.expect("free").fence(), 1);
        let semaphore = GenericSemaphore::new(backend.clone());
        for _ in 0..2 {
            let permit = semaphore.try_acquire("db-pool", 3, TEN_MIN).await.unwrap();
            assert!(permit.is_some());
        }

        // The board: `fetch` claimed by agent-1, `index` waits for it,
        // `done-task` completed.
        let board = BoardAdapter::new(backend.clone());
        board
            .seed(vec![
                TaskSpec::new("fetch", b"secret-payload".to_vec()),
                TaskSpec::new("index", b"".to_vec()).with_deps(["fetch"]),
                TaskSpec::new("done-task", b"".to_vec()),
            ])
            .await
            .unwrap();
        board.claim("fetch", "agent-1", TEN_MIN).await.unwrap();
        let done = board.claim("done-task", "agent-2", TEN_MIN).await.unwrap();
        board
            .complete("done-task", &done.token, b"secret-result".to_vec())
            .await
            .unwrap();

        // Side effects: two keys marked uncertain (one with an HTML key), one
        // whose lease ran out before it completed, one live in flight, one completed.
        let effects = SideEffectAdapter::new(backend.clone());
        // Each acquire is the key's first: it is granted.
        let granted = |action: Action, ttl| {
            let effects = &effects;
            async move {
                let lease = effects.acquire(&action, ttl).await.unwrap().into_lease();
                (action, lease.expect("granted"))
            }
        };
        for (key, resource) in [("charge-7", "psp"), (HOSTILE_EFFECT, "mailer")] {
            let (action, lease) = granted(Action::new(key, resource), TEN_MIN).await;
            effects
                .mark_uncertain(&action, &lease, "payment gateway timed out after send")
                .await
                .unwrap();
        }
        granted(
            Action::new("export-3", "exporter"),
            Duration::from_millis(200),
        )
        .await;
        granted(Action::new("ship-9", "warehouse"), TEN_MIN).await;
        let (doneact, lease) = granted(Action::new("mail-1", "smtp"), TEN_MIN).await;
        effects
            .complete(&doneact, &lease, b"secret-effect-result".to_vec().into())
            .await
            .unwrap();
        // Wait (no sleep-and-hope) until the lost intent's lease is over.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match effects.key_status("export-3").await.unwrap() {
                KeyStatus::InFlight { live: false, .. } => break,
                other => assert!(Instant::now() < deadline, "still {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // Scheduler history of `nightly`: succeeded, failed, skipped (late), running.
        let runs =
            RunStore::new(backend, Arc::new(SystemClock), RunStoreOptions::default()).unwrap();
        let base = now_ms() / 60_000 * 60_000 - 4 * 60_000;
        let slots = [base, base + 60_000, base + 120_000, base + 180_000];
        let claim = |slot: u64, token: &'static str, instance: &'static str| {
            ClaimRequest::new("nightly", slot, token, instance, TEN_MIN)
        };
        assert!(
            runs.claim(&claim(slots[0], "t0", "node-a"))
                .await
                .unwrap()
                .won
        );
        runs.finish("nightly", slots[0], "t0", FinalStatus::Succeeded)
            .await
            .unwrap();
        assert!(
            runs.claim(&claim(slots[1], "t1", "node-b"))
                .await
                .unwrap()
                .won
        );
        // Failed twice: a retry recorded, then the run finished failed.
        runs.record_attempt("nightly", slots[1], "t1", 2, "exit status 1")
            .await
            .unwrap();
        runs.finish(
            "nightly",
            slots[1],
            "t1",
            FinalStatus::Failed("exit status 3".into()),
        )
        .await
        .unwrap();
        assert!(runs
            .record_skip("nightly", slots[2], "node-a", SkipReason::Late)
            .await
            .unwrap());
        assert!(
            runs.claim(&claim(slots[3], "t3", "node-c"))
                .await
                .unwrap()
                .won
        );
        Seeded { slots }
    })
}

// ----- checks -----

/// The `/api/` answers hold exactly the seeded records, and nothing secret.
fn check_api(server: &Server, seeded: &Seeded) {
    let locks = server.get("/api/locks");
    assert_eq!(locks.status, 200, "{}", locks.body);
    assert!(locks
        .headers
        .to_ascii_lowercase()
        .contains("application/json"));
    let locks = locks.json();
    assert_eq!(locks["locks"].as_array().unwrap().len(), 4, "{locks}");
    let orders = find(&locks["locks"], "key", "orders/42");
    assert_eq!(
        (orders["fence"].as_u64(), orders["state"].as_str()),
        (Some(1), Some("held"))
    );
    assert!(orders["lease_expires_ms"].as_u64().unwrap() > now_ms());
    assert_eq!(find(&locks["locks"], "key", "reports")["fence"], 2);
    assert_eq!(find(&locks["locks"], "key", HOSTILE)["state"], "held");
    assert_eq!(find(&locks["locks"], "key", "idle-lock")["state"], "free");
    assert_eq!(locks["truncated"], false);

    // Paging: one name per page, a cursor to the next.
    let first = server.get("/api/locks?limit=1").json();
    assert_eq!(first["locks"].as_array().unwrap().len(), 1);
    assert_eq!(first["truncated"], true);
    let cursor = first["next_after"].as_str().unwrap().to_owned();
    let second = server
        .get(&format!("/api/locks?limit=1&after={}", url_encode(&cursor)))
        .json();
    assert!(second["locks"][0]["key"].as_str().unwrap() > cursor.as_str());

    // The page is bounded the same way and links to the rest.
    let page = server.get("/locks?limit=1");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("more…"), "{}", page.body);
    let next = format!("/locks?after={}&amp;limit=1", url_encode(&cursor));
    assert!(page.body.contains(&next), "no link {next:?}: {}", page.body);

    let fair = server.get("/api/fairlocks").json();
    let queue = find(&fair["locks"], "key", "print-queue");
    assert_eq!(
        (queue["fence"].as_u64(), queue["state"].as_str()),
        (Some(1), Some("held")),
        "{fair}"
    );
    let semaphores = server.get("/api/semaphores").json();
    let pool = find(&semaphores["semaphores"], "key", "db-pool");
    assert_eq!(
        (
            pool["permits"].as_u64(),
            pool["held"].as_u64(),
            pool["waiting"].as_u64()
        ),
        (Some(3), Some(2), Some(0)),
        "{semaphores}"
    );
    let page = server.get("/locks");
    for shown in [
        "print-queue",
        "db-pool",
        "2 of 3",
        "id=\"fairlocks\"",
        "id=\"semaphores\"",
    ] {
        assert!(
            page.body.contains(shown),
            "/locks lacks {shown:?}: {}",
            page.body
        );
    }

    let resources = server.get("/api/resources").json();
    let psp = find(&resources["resources"], "resource", "psp");
    assert_eq!(
        (psp["highest_fence"].as_u64(), psp["holder"].as_str()),
        (Some(1), Some("charge-7"))
    );
    assert_eq!(
        find(&resources["resources"], "resource", "smtp")["state"],
        "free"
    );

    let tasks = server.get("/api/tasks").json();
    assert_eq!(tasks["tasks"].as_array().unwrap().len(), 3, "{tasks}");
    let fetch = find(&tasks["tasks"], "id", "fetch");
    assert_eq!(
        (fetch["state"].as_str(), fetch["agent"].as_str()),
        (Some("claimed"), Some("agent-1"))
    );
    assert_eq!(fetch["fence"], 1);
    assert_eq!(find(&tasks["tasks"], "id", "index")["deps"][0], "fetch");
    assert_eq!(
        find(&tasks["tasks"], "id", "done-task")["state"],
        "completed"
    );

    let effects = server.get("/api/sideeffects").json();
    assert_eq!(effects["examined"], 5, "{effects}");
    let uncertain = &effects["uncertain"];
    assert_eq!(uncertain.as_array().unwrap().len(), 3, "{effects}");
    let charge = find(uncertain, "key", "charge-7");
    assert_eq!(charge["kind"], "marked");
    assert_eq!(charge["reason"], "payment gateway timed out after send");
    assert_eq!(find(uncertain, "key", HOSTILE_EFFECT)["kind"], "marked");
    let lost = find(uncertain, "key", "export-3");
    assert_eq!(
        (lost["kind"].as_str(), lost["resource"].as_str()),
        (Some("lease_lost"), Some("exporter"))
    );
    let ship = find(&effects["in_flight"], "key", "ship-9");
    assert_eq!(
        (ship["live"].as_bool(), ship["fence"].as_u64()),
        (Some(true), Some(1))
    );
    assert_eq!(
        (effects["completed"].as_u64(), effects["idle"].as_u64()),
        (Some(1), Some(0))
    );

    let jobs = server.get("/api/jobs").json();
    let nightly = find(&jobs["jobs"], "job", "nightly");
    assert_eq!(nightly["active"].as_array().unwrap().len(), 1);
    assert_eq!(nightly["recent_skipped"], 1);
    let runs = server.get("/api/jobs/nightly/runs").json();
    let statuses: Vec<(u64, &str)> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["slot_ms"].as_u64().unwrap(),
                r["status"].as_str().unwrap(),
            )
        })
        .collect();
    let [s0, s1, s2, s3] = seeded.slots;
    assert_eq!(
        statuses,
        [
            (s3, "running"),
            (s2, "skipped"),
            (s1, "failed"),
            (s0, "succeeded")
        ]
    );
    assert_eq!(runs["runs"][1]["skip_reason"], "late");
    assert_eq!(runs["runs"][2]["message"], "exit status 3");
    let attempts: Vec<u64> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["attempts"].as_u64().unwrap())
        .collect();
    assert_eq!(
        attempts,
        [1, 0, 2, 1],
        "attempts of running, skipped, retried, succeeded"
    );
    assert_eq!(runs["runs"][0]["instance"], "node-c");
    // The jobs page summary is the same view as the job's runs.
    assert_eq!(
        nightly["recent"],
        serde_json::json!(runs["runs"].as_array().unwrap()[..4])
    );

    // Never a token, payload or result in any answer.
    for path in [
        "/api/locks",
        "/api/tasks",
        "/api/sideeffects",
        "/api/jobs",
        "/api/resources",
    ] {
        let body = server.get(path).body;
        for secret in [
            "secret-payload",
            "secret-result",
            "secret-effect-result",
            "token",
            "\"t0\"",
            "\"t3\"",
        ] {
            assert!(!body.contains(secret), "{path} shows {secret:?}: {body}");
        }
    }
}

/// Bad and hostile input: a clear 4xx, never a 5xx or a hang.
fn check_refusals(server: &Server) {
    for (path, status, words) in [
        ("/api/locks?limit=0", 400, "1 to 500"),
        ("/api/locks?limit=501", 400, "1 to 500"),
        ("/api/tasks?limit=abc", 400, "1 to 500"),
        ("/locks?limit=100000", 400, "1 to 500"),
        ("/api/locks?bogus=1", 400, "bogus"),
        ("/api/jobs/bad%20name/runs", 400, "not a job name"),
        ("/jobs/%3Cscript%3E", 400, "not a job name"),
        ("/jobs/%FF", 400, "bad path"),
        ("/api/nope", 404, "no such page"),
        ("/nope/%3Cscript%3E", 404, "no such page"),
    ] {
        let reply = server.get(path);
        assert_eq!(reply.status, status, "{path}: {}", reply.body);
        assert!(reply.body.contains(words), "{path}: {}", reply.body);
        if path.starts_with("/api/") {
            assert!(reply.json()["error"].is_string(), "{path}");
        } else {
            assert!(!reply.body.contains("<script"), "{path}: {}", reply.body);
        }
    }
    let huge = format!("/api/jobs/{}/runs", "j".repeat(20_000));
    let reply = server.get(&huge);
    assert!(
        (400..500).contains(&reply.status),
        "a 20 kB job name: {}",
        reply.status
    );
    // Not even a valid request target: refused by the HTTP layer.
    let raw = server.get("/nope/<script>");
    assert!(
        (400..500).contains(&raw.status),
        "a raw <script> path: {}",
        raw.status
    );
    let cursor = format!("/api/locks?after={}", "k".repeat(5_000));
    assert_eq!(server.get(&cursor).status, 400);

    // DNS rebinding: a foreign Host name is refused.
    let foreign = http(&server.addr, "GET", "/api/locks", "evil.example", None);
    assert_eq!(foreign.status, 403, "{}", foreign.body);
    assert!(foreign.body.contains("loopback host names only"));
    assert!(!foreign.body.contains("namespace"), "{}", foreign.body);
    // Every answer forbids scripts.
    let page = server.get("/locks");
    assert!(page.headers.contains("script-src") || page.headers.contains("default-src 'none'"));
}

/// The read-only console: no form, and POST /reconcile is 403.
fn check_read_only(server: &Server) {
    let page = server.get("/sideeffects");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("charge-7"));
    assert!(
        !page.body.contains("<form"),
        "a form on a read-only console"
    );
    assert!(page.body.contains("coordctl reconcile"));
    let post = server.post(
        "/reconcile",
        &[
            ("csrf", "x"),
            ("key", "charge-7"),
            ("verdict", "not_applied"),
            ("reason", "r"),
            ("confirm", "yes"),
        ],
    );
    assert_eq!(post.status, 403, "{}", post.body);
    assert!(post.body.contains("--allow-writes"));
}

fn effect_status(url: &str, key: &str) -> KeyStatus {
    runtime().block_on(async {
        let adapter = SideEffectAdapter::new(coord::connect(url).await.unwrap());
        adapter.key_status(key).await.unwrap()
    })
}

/// With --allow-writes: form → confirmation → recorded verdict.
fn check_reconcile(server: &Server, url: &str) {
    let page = server.get("/sideeffects");
    assert!(page.body.contains("<form"), "{}", page.body);
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form token")
        .to_owned();
    let fields = |confirm: Option<&'static str>, reason: &'static str| {
        let mut f = vec![
            ("csrf", csrf.clone()),
            ("key", "charge-7".to_owned()),
            ("verdict", "not_applied".to_owned()),
            ("reason", reason.to_owned()),
        ];
        if let Some(c) = confirm {
            f.push(("confirm", c.to_owned()));
        }
        f
    };
    let post = |f: Vec<(&str, String)>| {
        let borrowed: Vec<(&str, &str)> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
        server.post("/reconcile", &borrowed)
    };

    // Refusals change nothing.
    let mut wrong = fields(Some("yes"), "no charge at the PSP");
    wrong[0].1 = "forged".into();
    assert_eq!(post(wrong).status, 403);
    let no_reason = post(fields(Some("yes"), "   "));
    assert_eq!(no_reason.status, 400, "{}", no_reason.body);
    assert!(no_reason.body.contains("reason is required"));
    let mut bad_verdict = fields(None, "x");
    bad_verdict[2].1 = "maybe".into();
    assert_eq!(post(bad_verdict).status, 400);
    assert!(matches!(
        effect_status(url, "charge-7"),
        KeyStatus::Uncertain { .. }
    ));

    // Step 1: the confirmation page, nothing recorded yet.
    let confirm = post(fields(None, "no charge at the PSP (ticket 881)"));
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(confirm.body.contains("name=\"confirm\" value=\"yes\""));
    assert!(confirm.body.contains("no charge at the PSP (ticket 881)"));
    assert!(matches!(
        effect_status(url, "charge-7"),
        KeyStatus::Uncertain { .. }
    ));

    // Step 2: confirmed: recorded through the adapter, with its reason.
    let done = post(fields(Some("yes"), "no charge at the PSP (ticket 881)"));
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("id=\"reconciled\""), "{}", done.body);
    assert_eq!(effect_status(url, "charge-7"), KeyStatus::Idle);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = server
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the reconcile is recorded on stdout");
        if line.contains("reconciled key \"charge-7\"") {
            assert!(line.contains("ticket 881"), "{line}");
            break;
        }
    }
    // Again: the key is no longer uncertain (409, nothing changed).
    let again = post(fields(Some("yes"), "again"));
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("not uncertain"));
}

// ----- the browser -----

fn chromium() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("COORD_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
            .find(|p| p.is_file())
    })
}

/// `<target>/console-screenshots`: `CARGO_TARGET_DIR`, else the target dir
/// holding this test's `coordctl` binary (`<target>/<profile>/coordctl`).
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(COORDCTL)
                .parent()
                .and_then(Path::parent)
                .expect("coordctl lives in <target>/<profile>/")
                .to_path_buf()
        });
    target.join("console-screenshots")
}

/// Run chromium with `args`, killing it after 90 s; its stdout.
fn run_chromium(bin: &Path, profile: &Path, args: &[String]) -> String {
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium {args:?} failed: {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium {args:?} did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap()
}

fn check_browser(server: &Server, scratch: &Path) {
    let Some(bin) = chromium() else {
        assert_ne!(
            std::env::var("COORD_REQUIRE_SERVERS").as_deref(),
            Ok("1"),
            "chromium is not installed but COORD_REQUIRE_SERVERS=1 (scripts/services.sh ensure_chromium)"
        );
        println!("SKIPPED: the browser part of the console test (no chromium on PATH)");
        return;
    };
    let shots = screenshot_dir();
    std::fs::create_dir_all(&shots).unwrap();
    let profile = scratch.join("chromium-profile");
    let escaped_lock = "&lt;script&gt;alert(1)&lt;/script&gt;";
    let escaped_effect = "&lt;img src=x onerror=alert(2)&gt;";
    let pages: [(&str, &str, &[&str]); 6] = [
        (
            "overview",
            "/",
            &["locks held", "side-effect keys need attention"],
        ),
        (
            "locks",
            "/locks",
            &[
                "orders/42",
                "reports",
                escaped_lock,
                "idle-lock",
                "psp",
                "charge-7",
                "warehouse",
                "print-queue",
                "db-pool",
            ],
        ),
        (
            "tasks",
            "/tasks",
            &[
                "fetch",
                "agent-1",
                "index",
                "done-task",
                "claimed",
                "completed",
            ],
        ),
        (
            "sideeffects",
            "/sideeffects",
            &[
                "charge-7",
                "payment gateway timed out after send",
                escaped_effect,
                "export-3",
                "lease_lost",
                "ship-9",
                "coordctl reconcile",
            ],
        ),
        (
            "jobs",
            "/jobs",
            &[
                "nightly",
                "node-a",
                "node-b",
                "node-c",
                "succeeded",
                "failed",
                "skipped",
                "exit status 3",
            ],
        ),
        (
            "job-nightly",
            "/jobs/nightly",
            &["node-a", "running", "late", "exit status 3"],
        ),
    ];
    for (name, path, wanted) in pages {
        let url = server.url(path);
        let dom = run_chromium(&bin, &profile, &["--dump-dom".into(), url.clone()]);
        assert!(
            dom.contains("coord console"),
            "{name}: not the console: {dom}"
        );
        for w in wanted {
            assert!(dom.contains(w), "{name} ({url}) lacks {w:?}:\n{dom}");
        }
        assert!(
            !dom.to_ascii_lowercase().contains("<script"),
            "{name}: a script element in the page:\n{dom}"
        );
        assert!(!dom.contains("<img"), "{name}: an injected element:\n{dom}");
        screenshot(&bin, &profile, &url, name);
    }
    println!("console screenshots in {}", shots.display());
}

/// A 1280x900 PNG of `url` at `<screenshot_dir>/<name>.png`, checked non-empty.
fn screenshot(bin: &Path, profile: &Path, url: &str, name: &str) {
    let png = screenshot_dir().join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    run_chromium(
        bin,
        profile,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1280,900".into(),
            url.to_owned(),
        ],
    );
    let size = std::fs::metadata(&png)
        .unwrap_or_else(|e| panic!("{name}: no screenshot at {}: {e}", png.display()))
        .len();
    assert!(size > 1_000, "{name}: screenshot of {size} bytes");
}

/// The side-effects page of a writable console: a reconcile form per uncertain key.
fn check_browser_writable(server: &Server, scratch: &Path) {
    let Some(bin) = chromium() else {
        return; // check_browser already said SKIPPED (or failed).
    };
    let profile = scratch.join("chromium-profile");
    let url = server.url("/sideeffects");
    let dom = run_chromium(&bin, &profile, &["--dump-dom".into(), url.clone()]);
    assert_eq!(
        dom.matches("<form").count(),
        3,
        "one form per uncertain key:\n{dom}"
    );
    assert!(dom.contains("writes allowed"));
    assert!(!dom.to_ascii_lowercase().contains("<script"), "{dom}");
    screenshot(&bin, &profile, &url, "sideeffects-writes");
}

/// The value of one unlabelled series in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `/metrics` answers Prometheus text naming every metric of
/// docs/operations.md, and counts the seeded uncertain keys (two marked, one
/// whose intent lost its lease) like `/api/sideeffects` does.
fn check_metrics(server: &Server) {
    let reply = server.get("/metrics");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.headers.contains("text/plain"), "{}", reply.headers);
    for name in [
        "coord_txn_total",
        "coord_cas_attempts_total",
        "coord_lock_acquired_total",
        "coord_lock_lost_total",
        "coord_sideeffect_total",
        "coord_scheduler_runs_total",
    ] {
        assert!(
            reply.body.contains(name),
            "no {name} in /metrics:\n{}",
            reply.body
        );
    }
    assert_eq!(metric(&reply.body, "coord_sideeffect_uncertain"), 3.0);
    assert_eq!(
        metric(&reply.body, "coord_sideeffect_uncertain_truncated"),
        0.0
    );
    // Behind the same Host guard as the pages.
    let foreign = http(&server.addr, "GET", "/metrics", "evil.example", None);
    assert_eq!(foreign.status, 403);
}

/// Everything on one store; the browser part only when `browser`.
fn console_on(name: &str, url: String, browser: bool) {
    let scratch = Scratch::new(&format!("console-{name}"));
    let seeded = seed(&url);
    {
        let server = Server::start(&url, &[]);
        check_api(&server, &seeded);
        check_metrics(&server);
        check_refusals(&server);
        check_read_only(&server);
        if browser {
            check_browser(&server, &scratch.0);
        }
    }
    let writable = Server::start(&url, &["--allow-writes"]);
    if browser {
        check_browser_writable(&writable, &scratch.0);
    }
    check_reconcile(&writable, &url);
    check_metrics_after_reconcile(&writable);
}

/// The reconcile the console recorded is one applied txn of its own, timed.
fn check_metrics_after_reconcile(server: &Server) {
    let text = server.get("/metrics").body;
    let applied: f64 = text
        .lines()
        .filter(|line| line.starts_with("coord_txn_total{") && line.contains("outcome=\"applied\""))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(
        applied >= 1.0,
        "no applied txn counted after a reconcile:\n{text}"
    );
    assert!(
        text.contains("coord_txn_seconds_count"),
        "no txn timing:\n{text}"
    );
}

#[test]
fn console_sqlite() {
    let scratch = Scratch::new("console-sqlite-db");
    let url = scratch.sqlite_url("coord.db", Some(&unique("console-sqlite")));
    console_on("sqlite", url, true);
}

#[test]
fn console_postgres() {
    if let Some(url) = server_url("COORD_TEST_POSTGRES_URL", "console-pg") {
        console_on("postgres", url, false);
    }
}

#[test]
fn console_redis() {
    if let Some(url) = server_url("COORD_TEST_REDIS_URL", "console-redis") {
        console_on("redis", url, false);
    }
}

#[test]
fn serve_refuses_a_remote_address_or_a_missing_file() {
    let scratch = Scratch::new("console-remote");
    let url = scratch.sqlite_url("coord.db", None);
    let serve_at = |addr| coordctl(&["serve", "--store", &url, "--addr", addr]);
    let out = serve_at("0.0.0.0:0");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a loopback address") && err.contains("--allow-remote"),
        "{err}"
    );
    let out = serve_at("127.0.0.1:0");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{out:?}"
    );
    assert!(
        !scratch.0.join("coord.db").exists(),
        "serve created the file"
    );
    let out = serve_at("localhost:80");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an IP address"));
}

/// `inspect --json` and `cron history --json`: one JSON document each,
/// the same records the console's API shows.
#[test]
fn json_outputs_parse() {
    let scratch = Scratch::new("console-json");
    let db = scratch.0.join("coord.db");
    let ns = unique("console-json");
    let url = format!("sqlite://{}?namespace={ns}", db.display());
    let seeded = seed(&url);

    let out = Command::new(COORDCTL)
        .args(["inspect", "--store", &url, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "one document on one line: {stdout}"
    );
    let inspect: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(inspect["namespace"], ns.as_str());
    // Only the keys needing attention are read (the completed one is not).
    assert_eq!(inspect["examined"], 4);
    assert_eq!(inspect["uncertain"].as_array().unwrap().len(), 3);
    find(&inspect["uncertain"], "key", HOSTILE_EFFECT);
    assert_eq!(
        find(&inspect["in_flight"], "key", "ship-9")["resource"],
        "warehouse"
    );
    assert_eq!(
        find(&inspect["resources"], "resource", "psp")["highest_fence"],
        1
    );
    assert!(
        inspect.get("settled").is_none(),
        "settled keys only with --all"
    );
    assert!(!stdout.contains("secret-effect-result"));

    let all: Value = serde_json::from_slice(
        &Command::new(COORDCTL)
            .args([
                "inspect", "--store", &url, "--json", "--all", "--key", "mail-1",
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(all["examined"], 1);
    let mail = find(&all["settled"], "key", "mail-1");
    assert_eq!(
        (mail["state"].as_str(), mail["result"].as_str()),
        (Some("completed"), Some("secret-effect-result"))
    );

    // The text report is rendered from the same view.
    let text = inspect_text(&url);
    assert!(text.contains("UNCERTAIN KEYS (3)"), "{text}");
    assert!(text.contains("IN-FLIGHT INTENTS (2)"), "{text}");

    let config = scratch.0.join("coord.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://{}?namespace={ns}\"\n\n[[job]]\nname = \"nightly\"\nschedule = \"every 1m\"\ncommand = \"true\"\n",
            db.display()
        ),
    )
    .unwrap();
    let out = Command::new(COORDCTL)
        .args([
            "cron", "history", "nightly", "--json", "--limit", "3", "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let history: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(history["job"], "nightly");
    assert_eq!(history["time_zone"], "UTC");
    let runs = history["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[0]["slot_ms"], seeded.slots[3]);
    assert_eq!(runs[0]["status"], "running");
    assert_eq!(runs[1]["skip_reason"], "late");
    assert_eq!(history["active"][0]["instance"], "node-c");

    // The table is rendered from the same view.
    let out = Command::new(COORDCTL)
        .args(["cron", "history", "nightly", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("4 run(s)"), "{text}");
    for word in [
        "running",
        "skipped (late)",
        "failed",
        "succeeded",
        "exit status 3",
        "node-c",
    ] {
        assert!(text.contains(word), "{word:?} missing:\n{text}");
    }
}

/// `conformance --json`: one document with every case of the suite asked for.
#[test]
fn conformance_json_parses() {
    let scratch = Scratch::new("console-conf");
    let url = scratch.sqlite_url("coord.db", None);
    let out = Command::new(COORDCTL)
        .args(["conformance", "--store", &url, "--suite", "lock", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let view: Value = serde_json::from_str(&stdout).unwrap();
    let cases = view["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    assert!(cases
        .iter()
        .all(|c| c["suite"] == "lock" && c["passed"] == true));
    assert_eq!(view["passed"].as_u64(), Some(cases.len() as u64));
    assert_eq!(view["failed"], 0);
    assert!(view["store"].as_str().unwrap().starts_with("sqlite://"));
}

// ----- queues: dead tasks and their retry, in a browser -----

/// Chromium driven through the DevTools protocol over
/// `--remote-debugging-pipe` (commands on its fd 3, answers on its fd 4,
/// each a JSON message ending in NUL), which a shell hands it as two FIFOs:
/// no WebSocket client, no script in the page (clicks are mouse events at
/// the element's box).
struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: std::sync::mpsc::Receiver<Value>,
    next_id: u64,
    session: String,
    /// Events received while waiting for answers.
    events: Vec<Value>,
}

impl Browser {
    fn start(bin: &Path, dir: &Path) -> Browser {
        use std::io::BufRead;
        let (fifo_in, fifo_out) = (dir.join("cdp-in"), dir.join("cdp-out"));
        for fifo in [&fifo_in, &fifo_out] {
            let _ = std::fs::remove_file(fifo);
            let made = Command::new("mkfifo").arg(fifo).status().unwrap();
            assert!(made.success(), "mkfifo {}", fifo.display());
        }
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"exec "$0" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
                   --no-first-run --hide-scrollbars --window-size=1280,900 \
                   --user-data-dir="$1" --remote-debugging-pipe 3<"$2" 4>"$3""#,
            )
            .arg(bin)
            .arg(dir.join("chromium-cdp-profile"))
            .arg(&fifo_in)
            .arg(&fifo_out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium starts");
        // The shell opens fd 3 (our writer) first, then fd 4 (our reader).
        let to = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo_in)
            .unwrap();
        let from = std::fs::File::open(&fifo_out).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(from);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        message.pop();
                        let value: Value = serde_json::from_slice(&message).unwrap();
                        if tx.send(value).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut browser = Browser {
            child,
            to,
            from: rx,
            next_id: 0,
            session: String::new(),
            events: Vec::new(),
        };
        let target = browser.call(
            "Target.createTarget",
            serde_json::json!({"url": "about:blank"}),
        );
        let target_id = target["targetId"].as_str().unwrap().to_owned();
        let attached = browser.call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target_id, "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        browser.call("Page.enable", serde_json::json!({}));
        browser
    }

    /// Send `method` (to the page's session once attached) and wait for its answer.
    fn call(&mut self, method: &str, params: Value) -> Value {
        use std::io::Write;
        self.next_id += 1;
        let id = self.next_id;
        let mut message = serde_json::json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = Value::from(self.session.clone());
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let answer = self.receive(method);
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
            if answer.get("method").is_some() {
                self.events.push(answer);
            }
        }
    }

    fn receive(&mut self, waiting_for: &str) -> Value {
        self.from
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no answer from chromium to {waiting_for}: {e}"))
    }

    /// Wait for the page's `load` event (one that arrived meanwhile counts).
    fn loaded(&mut self) {
        loop {
            if let Some(at) = self
                .events
                .iter()
                .position(|e| e["method"] == "Page.loadEventFired")
            {
                self.events.drain(..=at);
                return;
            }
            let event = self.receive("Page.loadEventFired");
            self.events.push(event);
        }
    }

    fn open(&mut self, url: &str) -> String {
        self.events.clear();
        self.call("Page.navigate", serde_json::json!({"url": url}));
        self.loaded();
        self.html()
    }

    /// The page's HTML as the browser holds it.
    fn html(&mut self) -> String {
        let root = self.call("DOM.getDocument", serde_json::json!({"depth": 0}));
        let node = root["root"]["nodeId"].clone();
        self.call("DOM.getOuterHTML", serde_json::json!({"nodeId": node}))["outerHTML"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Click the first element matching `selector` with the mouse, and wait
    /// for the page it leads to; its HTML.
    fn click(&mut self, selector: &str) -> String {
        let root = self.call("DOM.getDocument", serde_json::json!({"depth": 0}));
        let found = self.call(
            "DOM.querySelector",
            serde_json::json!({"nodeId": root["root"]["nodeId"], "selector": selector}),
        );
        let node = found["nodeId"].clone();
        assert_ne!(node, 0, "nothing matches {selector:?}");
        self.call(
            "DOM.scrollIntoViewIfNeeded",
            serde_json::json!({"nodeId": node}),
        );
        let model = self.call("DOM.getBoxModel", serde_json::json!({"nodeId": node}));
        let quad: Vec<f64> = model["model"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let x = (quad[0] + quad[2] + quad[4] + quad[6]) / 4.0;
        let y = (quad[1] + quad[3] + quad[5] + quad[7]) / 4.0;
        self.events.clear();
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                serde_json::json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
        self.loaded();
        self.html()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A queue with a dead task (its error holding HTML) and a ready one: the
/// API and the task page show the queue's counts and the dead task with its
/// error; a read-only console has no retry button and refuses `POST /retry`;
/// with `--allow-writes`, clicking the task's retry button, then confirming,
/// in headless Chromium makes it ready again (checked through the store).
#[test]
fn task_page_retries_a_dead_task() {
    use coord_adapters::board::{RetryPolicy, TaskState};
    let scratch = Scratch::new("console-queues");
    let url = scratch.sqlite_url("coord.db", Some(&unique("console-queues")));
    let error = "550 <mailbox> unavailable";
    let board = |url: &str| {
        let url = url.to_owned();
        async move { BoardAdapter::new(coord::connect(&url).await.unwrap()) }
    };
    runtime().block_on(async {
        let board = board(&url).await;
        board
            .add_many(vec![
                TaskSpec::new("bounce-1", b"".to_vec())
                    .in_queue("emails")
                    .with_retry(RetryPolicy::attempts(1))
                    .with_priority(1),
                TaskSpec::new("mail-ok", b"".to_vec()).in_queue("emails"),
            ])
            .await
            .unwrap();
        let claim = board
            .claim_next("emails", "w", TEN_MIN)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claim.id, "bounce-1");
        board.fail("bounce-1", &claim.token, error).await.unwrap();
    });
    let escaped = "550 &lt;mailbox&gt; unavailable";
    {
        let server = Server::start(&url, &[]);
        let queues = server.get("/api/queues").json_ok();
        let emails = find(&queues["queues"], "queue", "emails");
        assert_eq!(
            (&emails["ready"], &emails["dead"], &emails["depth"]),
            (&Value::from(1), &Value::from(1), &Value::from(1)),
            "{queues}"
        );
        let dead = find(&emails["dead_tasks"], "id", "bounce-1");
        assert_eq!(dead["last_error"], error, "{queues}");
        assert_eq!(dead["state"], "dead");
        let tasks = server.get("/api/tasks").json_ok();
        let bounce = find(&tasks["tasks"], "id", "bounce-1");
        assert_eq!(
            (
                &bounce["queue"],
                &bounce["attempts"],
                &bounce["max_attempts"]
            ),
            (&Value::from("emails"), &Value::from(1), &Value::from(1)),
            "{tasks}"
        );
        let page = server.get("/tasks");
        assert!(page.body.contains(escaped), "{}", page.body);
        assert!(!page.body.contains("action=\"/retry\""), "{}", page.body);
        let refused = server.post("/retry", &[("csrf", "x"), ("id", "bounce-1")]);
        assert_eq!(refused.status, 403, "{}", refused.body);
    }
    let writable = Server::start(&url, &["--allow-writes"]);
    // A form of another origin (no token) is refused, nothing changes.
    let forged = writable.post(
        "/retry",
        &[("csrf", "forged"), ("id", "bounce-1"), ("confirm", "yes")],
    );
    assert_eq!(forged.status, 403, "{}", forged.body);
    let Some(bin) = chromium() else {
        assert_ne!(
            std::env::var("COORD_REQUIRE_SERVERS").as_deref(),
            Ok("1"),
            "chromium is not installed but COORD_REQUIRE_SERVERS=1 (scripts/services.sh ensure_chromium)"
        );
        println!("SKIPPED: the browser part of the retry test (no chromium on PATH)");
        return;
    };
    let mut browser = Browser::start(&bin, &scratch.0);
    let page = browser.open(&writable.url("/tasks"));
    assert!(
        page.contains("bounce-1") && page.contains(escaped),
        "{page}"
    );
    assert_eq!(page.matches("action=\"/retry\"").count(), 1, "{page}");
    let confirm = browser.click("form.retry button");
    assert!(confirm.contains("Confirm: retry"), "{confirm}");
    assert!(confirm.contains("dead after 1 attempt(s)"), "{confirm}");
    let done = browser.click("form.retry button");
    assert!(done.contains("id=\"retried\""), "{done}");
    // The store says so: ready again, attempts from zero, no longer dead.
    runtime().block_on(async {
        let board = board(&url).await;
        let task = board.get("bounce-1").await.unwrap();
        assert_eq!(
            (task.state.clone(), task.attempts),
            (TaskState::Open, 0),
            "{task:?}"
        );
        let depth = board.queue_depth("emails", 100).await.unwrap();
        assert_eq!((depth.ready.count, depth.dead.count), (2, 0), "{depth:?}");
        let next = board
            .claim_next("emails", "w", TEN_MIN)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next.id, "bounce-1", "the highest priority, ready again");
    });
    let line = writable
        .lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the retry is recorded on stdout");
    assert!(line.contains("retried dead task \"bounce-1\""), "{line}");
    let after = browser.open(&writable.url("/tasks"));
    assert!(after.contains("No dead tasks."), "{after}");
}
