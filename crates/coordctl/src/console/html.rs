//! HTML rendering of the console's pages: plain server-rendered HTML with a
//! little inline CSS and no script. Every string that comes from the store
//! or the request goes through [`esc`]; numbers and the fixed words of the
//! views (states, CSS classes) are the only things written unescaped.

use std::fmt::Write as _;

use crate::cron::fmt_time;
use crate::views::{
    ElectionsView, FairLocksView, JobsView, Listing, LockView, LocksView, ResourcesView, RunView,
    RunsView, RwLocksView, SemaphoresView, SideEffectsView, TasksView, UncertainKind,
};

/// `text` escaped for HTML text and double- or single-quoted attribute values.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` for a query-string value (`?after=…`).
fn query_value(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// `text` as one path segment (`/jobs/<job>`).
fn path_segment(text: &str) -> String {
    // Job names are `A-Z a-z 0-9 . _ : -` (validated), but encode anyway.
    query_value(text).replace('+', "%20")
}

/// A shell word in single quotes (for the `coordctl reconcile` command shown).
fn shell_word(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// "1h 2m", "9m 53s", "4.2s".
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{:.1}s", ms as f64 / 1000.0),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

/// "2026-01-02T03:04:05.678Z (in 9m 53s)" / "(expired 4.2s ago)" or "-".
fn when(at_ms: Option<u64>, now_ms: u64) -> String {
    match at_ms {
        None => "-".into(),
        Some(at) => {
            let rel = if at >= now_ms {
                format!("in {}", span(at - now_ms))
            } else {
                format!("expired {} ago", span(now_ms - at))
            };
            format!(
                "{} <span class=\"dim\">({rel})</span>",
                esc(&fmt_time(at, None))
            )
        }
    }
}

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}\
header{background:#1d2a3a;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}\
header a{color:#cfe0ff;text-decoration:none;margin-right:14px}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #7fb0ff}\
header .brand{font-weight:700;font-size:18px;color:#fff}header .store{margin-left:auto;font-size:13px;color:#b8c4d4}\
main{padding:16px 24px;max-width:1400px}h1{font-size:22px;margin:8px 0 12px}h2{font-size:17px;margin:22px 0 8px}\
table{border-collapse:collapse;background:#fff;width:100%;font-size:14px;box-shadow:0 1px 2px #0001}\
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #e3e6ea;vertical-align:top}th{background:#eef1f5;font-weight:600}\
td.num{text-align:right;font-variant-numeric:tabular-nums}code,.key{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;word-break:break-all}\
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}\
.ok{background:#dff3e4;color:#17612c}.warn{background:#fff1d6;color:#8a5300}.bad{background:#fde2e1;color:#a3140e}.idle{background:#e8ebef;color:#4a5360}\
.dim{color:#6b7480;font-size:12px}.more{margin:8px 0;font-size:14px}.note{background:#fff;border-left:4px solid #7fb0ff;padding:8px 12px;margin:10px 0;font-size:14px}\
.cards{display:flex;gap:14px;flex-wrap:wrap}.card{background:#fff;padding:14px 18px;min-width:200px;box-shadow:0 1px 2px #0001}\
.card b{font-size:26px;display:block}.card a{text-decoration:none;color:inherit}\
form.rec{display:flex;flex-direction:column;gap:4px;font-size:13px}form.rec input[type=text]{width:260px}\
button{padding:4px 12px}";

/// One page: the header with navigation, the title, the body.
pub(crate) fn page(title: &str, nav: &str, store: &str, writes: bool, body: &str) -> String {
    let mut links = String::new();
    for (href, label) in [
        ("/", "Overview"),
        ("/locks", "Locks"),
        ("/leaders", "Leaders"),
        ("/tasks", "Tasks"),
        ("/sideeffects", "Side effects"),
        ("/jobs", "Jobs"),
    ] {
        let on = if href == nav { " class=\"on\"" } else { "" };
        let _ = write!(links, "<a href=\"{href}\"{on}>{label}</a>");
    }
    let mode = if writes {
        "<span class=\"badge warn\">writes allowed</span>"
    } else {
        "<span class=\"badge idle\">read-only</span>"
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{title} · coord console</title><style>{STYLE}</style></head><body>\
<header><span class=\"brand\">coord console</span><nav>{links}</nav>\
<span class=\"store\">{store} {mode}</span></header><main><h1>{title}</h1>{body}</main></body></html>",
        title = esc(title),
        store = esc(store),
    )
}

/// An error page body.
pub(crate) fn error_body(message: &str) -> String {
    format!("<p class=\"note\">{}</p>", esc(message))
}

/// The "more" link of a listing view: [`more_link`] after its last row.
fn more_after(path: &str, param: &str, listing: &Listing, limit: usize) -> String {
    more_link(path, param, listing.next_after.as_deref(), limit)
}

/// The link to the page after the one shown (`param` is its cursor), keeping `limit`.
fn more_link(path: &str, param: &str, next_after: Option<&str>, limit: usize) -> String {
    match next_after {
        Some(after) => format!(
            "<p class=\"more\"><a href=\"{path}?{param}={}&amp;limit={limit}\">more…</a> \
<span class=\"dim\">(this list is bounded; the link shows the next names)</span></p>",
            esc(&query_value(after)),
        ),
        None => String::new(),
    }
}

fn state_badge(state: &str) -> String {
    let class = match state {
        "held" | "live" | "claimed" | "running" | "succeeded" => "ok",
        "expired" | "skipped" | "released" | "open" => "warn",
        "failed" | "timed_out" | "uncertain" | "lease_lost" | "marked" => "bad",
        _ => "idle",
    };
    format!("<span class=\"badge {class}\">{}</span>", esc(state))
}

/// A lock's key, fence, state and lease cells (`GenericLock` and `FairLock` rows).
fn lock_cells(lock: &LockView, now_ms: u64) -> String {
    format!(
        "<td class=\"key\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>",
        esc(&lock.key),
        lock.fence,
        state_badge(lock.state),
        when(lock.lease_expires_ms, now_ms)
    )
}

/// One `<div>` per holder (`line` renders its text), or `-` when there is none.
fn holder_list<H>(holders: &[H], line: impl Fn(&H) -> String) -> String {
    if holders.is_empty() {
        return "-".into();
    }
    holders
        .iter()
        .map(|h| format!("<div>{}</div>", line(h)))
        .collect()
}

/// The overview's cards.
pub(crate) fn overview(
    locks: &LocksView,
    tasks: &TasksView,
    effects: &SideEffectsView,
    jobs: &JobsView,
) -> String {
    let plus = |t: bool| if t { "+" } else { "" };
    let held = locks.rows.iter().filter(|l| l.state == "held").count();
    let claimed = tasks.rows.iter().filter(|t| t.state == "claimed").count();
    let running: usize = jobs.rows.iter().map(|j| j.active.len()).sum();
    format!(
        "<div class=\"cards\">\
<div class=\"card\"><a href=\"/locks\"><b>{held}{}</b>locks held</a></div>\
<div class=\"card\"><a href=\"/tasks\"><b>{}{}</b>tasks ({claimed} claimed)</a></div>\
<div class=\"card\"><a href=\"/sideeffects\"><b>{}{}</b>side-effect keys need attention</a></div>\
<div class=\"card\"><a href=\"/jobs\"><b>{}{}</b>jobs ({running} running)</a></div></div>\
<p class=\"note\">Each card counts the first page of records only (a “+” means there are more). \
Every page has its JSON twin under <code>/api/</code>.</p>",
        plus(locks.listing.truncated),
        tasks.rows.len(),
        plus(tasks.listing.truncated),
        effects.uncertain.len(),
        plus(effects.truncated),
        jobs.rows.len(),
        plus(jobs.listing.truncated),
    )
}

/// What the locks page shows.
pub(crate) struct LockViews<'a> {
    pub(crate) locks: &'a LocksView,
    pub(crate) resources: &'a ResourcesView,
    pub(crate) fair: &'a FairLocksView,
    pub(crate) semaphores: &'a SemaphoresView,
}

/// One titled table of a page: its rows (already rendered `<tr>`s), or
/// `empty` when there are none, then the link to the next names.
struct Section<'a> {
    title: &'a str,
    note: &'a str,
    id: &'a str,
    headers: &'a [&'a str],
    empty: &'a str,
    more: String,
}

impl Section<'_> {
    fn render(&self, out: &mut String, rows: &[String]) {
        let _ = write!(
            out,
            "<h2>{}</h2><p class=\"dim\">{}</p>",
            self.title, self.note
        );
        if rows.is_empty() {
            let _ = write!(out, "<p>{}</p>", self.empty);
        } else {
            let _ = write!(out, "<table id=\"{}\"><tr>", self.id);
            for header in self.headers {
                let _ = write!(out, "<th>{header}</th>");
            }
            out.push_str("</tr>");
            for row in rows {
                out.push_str(row);
            }
            out.push_str("</table>");
        }
        out.push_str(&self.more);
    }
}

/// The locks page: `GenericLock` records, side-effect resource leases,
/// `FairLock` keys with their line, and semaphores with their permits.
pub(crate) fn locks(views: &LockViews<'_>, limit: usize) -> String {
    let LockViews {
        locks,
        resources,
        fair,
        semaphores,
    } = views;
    let mut out = String::new();
    let rows: Vec<String> = locks
        .rows
        .iter()
        .map(|l| format!("<tr>{}</tr>", lock_cells(l, locks.listing.now_ms)))
        .collect();
    Section {
        title: "Locks",
        note: "Records <code>lock/&lt;key&gt;</code> of GenericLock. \
The fence survives release; a free record keeps it for the next holder.",
        id: "locks",
        headers: &["Key", "Fence", "State", "Lease expires"],
        empty: "No lock records.",
        more: more_after("/locks", "after", &locks.listing, limit),
    }
    .render(&mut out, &rows);

    let rows: Vec<String> = resources
        .rows
        .iter()
        .map(|r| {
            format!(
                "<tr><td class=\"key\">{}</td><td class=\"num\">{}</td><td class=\"key\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.resource),
                r.highest_fence,
                esc(r.holder.as_deref().unwrap_or("-")),
                state_badge(r.state),
                when(r.lease_expires_ms, resources.listing.now_ms)
            )
        })
        .collect();
    Section {
        title: "Side-effect resource leases",
        note: "Records <code>se/res/&lt;resource&gt;</code>: \
the highest fence issued on each resource and the idempotency key holding it.",
        id: "resources",
        headers: &[
            "Resource",
            "Highest fence",
            "Holder (key)",
            "State",
            "Lease expires",
        ],
        empty: "No side-effect resources.",
        more: more_after("/locks", "res_after", &resources.listing, limit),
    }
    .render(&mut out, &rows);

    let rows: Vec<String> = fair
        .rows
        .iter()
        .map(|l| {
            let live = l.waiting.iter().filter(|t| t.live).count();
            format!(
                "<tr>{}<td class=\"num\">{live} waiting ({} tickets)</td></tr>",
                lock_cells(&l.lock, fair.listing.now_ms),
                l.waiting.len()
            )
        })
        .collect();
    Section {
        title: "Fair locks",
        note: "Records <code>fairlock/&lt;key&gt;/m</code> (holder, fence) and <code>/n</code> \
(the line) of FairLock: a release hands the lock to the first live ticket.",
        id: "fairlocks",
        headers: &["Key", "Fence", "State", "Lease expires", "Line"],
        empty: "No fair locks.",
        more: more_after("/locks", "fair_after", &fair.listing, limit),
    }
    .render(&mut out, &rows);

    let rows: Vec<String> = semaphores
        .rows
        .iter()
        .map(|s| {
            let holders = holder_list(&s.holders, |h| {
                format!(
                    "fence {} {} {}",
                    h.fence,
                    state_badge(if h.live { "live" } else { "expired" }),
                    when(Some(h.lease_expires_ms), semaphores.listing.now_ms)
                )
            });
            format!(
                "<tr><td class=\"key\">{}</td><td class=\"num\">{}</td><td class=\"num\">{} of {}</td><td>{holders}</td><td class=\"num\">{}</td></tr>",
                esc(&s.key),
                s.fence,
                s.held,
                s.permits,
                s.waiting
            )
        })
        .collect();
    Section {
        title: "Semaphores",
        note: "Records <code>sem/&lt;key&gt;</code> of GenericSemaphore: each permit held, \
with its own fence, and the waiters in line.",
        id: "semaphores",
        headers: &["Key", "Fence", "Permits held", "Holders", "Waiting in line"],
        empty: "No semaphores.",
        more: more_after("/locks", "sem_after", &semaphores.listing, limit),
    }
    .render(&mut out, &rows);
    out
}

/// The leaders page: `GenericElection` leaders and `GenericRwLock` holders.
pub(crate) fn leaders(elections: &ElectionsView, rwlocks: &RwLocksView, limit: usize) -> String {
    let mut out = String::new();
    let rows: Vec<String> = elections
        .rows
        .iter()
        .map(|e| {
            let state = if e.leader.is_some() { "live" } else { "none" };
            format!(
                "<tr><td class=\"key\">{}</td><td class=\"num\">{}</td><td class=\"key\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(&e.name),
                e.term,
                esc(e.leader.as_deref().unwrap_or("-")),
                state_badge(state),
                when(e.lease_expires_ms, elections.listing.now_ms)
            )
        })
        .collect();
    Section {
        title: "Elections",
        note: "Records <code>election/&lt;name&gt;</code> of \
GenericElection: the live leader and the latest term (the fencing token; it survives \
resignations). The value a leader announces is the application's and is not shown.",
        id: "elections",
        headers: &["Election", "Term", "Leader", "State", "Lease expires"],
        empty: "No elections.",
        more: more_after("/leaders", "after", &elections.listing, limit),
    }
    .render(&mut out, &rows);

    let rows: Vec<String> = rwlocks
        .rows
        .iter()
        .map(|r| {
            let holders = holder_list(&r.holders, |h| {
                format!(
                    "{} fence {} {} {}",
                    esc(h.mode),
                    h.fence,
                    state_badge(h.state),
                    when(Some(h.lease_expires_ms), rwlocks.listing.now_ms)
                )
            });
            format!(
                "<tr><td class=\"key\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{holders}</td><td class=\"num\">{}</td></tr>",
                esc(&r.key),
                r.fence,
                state_badge(r.state),
                r.queued_writers
            )
        })
        .collect();
    Section {
        title: "Read-write locks",
        note: "Records <code>rwlock/&lt;key&gt;</code> of \
GenericRwLock: each holder with its mode and fence; queued writers hold new readers back.",
        id: "rwlocks",
        headers: &["Key", "Fence", "State", "Holders", "Queued writers"],
        empty: "No read-write lock records.",
        more: more_after("/leaders", "rw_after", &rwlocks.listing, limit),
    }
    .render(&mut out, &rows);
    out
}

/// The task board.
pub(crate) fn tasks(view: &TasksView, limit: usize) -> String {
    let mut out = String::from(
        "<p class=\"dim\">Records <code>board/task/&lt;id&gt;</code>. Payloads and results are the \
application's data and are not shown.</p>",
    );
    if view.rows.is_empty() {
        out.push_str("<p>No tasks on the board.</p>");
        return out;
    }
    out.push_str(
        "<table id=\"tasks\"><tr><th>Task</th><th>State</th><th>Agent</th><th>Fence</th><th>Lease</th><th>Depends on</th></tr>",
    );
    for t in &view.rows {
        let deps = if t.deps.is_empty() {
            "-".to_owned()
        } else {
            t.deps.iter().map(|d| esc(d)).collect::<Vec<_>>().join(", ")
        };
        let _ = write!(
            out,
            "<tr><td class=\"key\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"key\">{deps}</td></tr>",
            esc(&t.id),
            state_badge(t.state),
            esc(t.agent.as_deref().unwrap_or("-")),
            t.fence,
            when(t.lease_expires_ms, view.listing.now_ms)
        );
    }
    out.push_str("</table>");
    out.push_str(&more_after("/tasks", "after", &view.listing, limit));
    out
}

/// What the reconcile forms need to be shown.
pub(crate) struct Writes<'a> {
    /// The per-process form token (checked on every POST).
    pub(crate) csrf: &'a str,
}

/// Side-effect keys needing attention, with what `reconcile` needs.
pub(crate) fn side_effects(
    view: &SideEffectsView,
    store: &str,
    writes: Option<&Writes<'_>>,
    limit: usize,
) -> String {
    let mut out = format!(
        "<p class=\"dim\">{} key(s) read from <code>se/act/</code>: {} completed, {} idle, {} in flight, {} uncertain.</p>",
        view.examined,
        view.completed,
        view.idle,
        view.in_flight.len(),
        view.uncertain.len()
    );
    let _ = write!(
        out,
        "<h2>Uncertain keys ({})</h2>\
<p class=\"note\">An uncertain key never runs again until an operator settles it. Check downstream \
whether the action took effect (did the e-mail leave? is the row there?), then record the verdict \
with its evidence: <b>applied</b> completes the key (later runs replay the result), \
<b>not applied</b> clears the mark so the key may run once more.</p>",
        view.uncertain.len()
    );
    if view.uncertain.is_empty() {
        out.push_str("<p>No uncertain keys.</p>");
    } else {
        let form_head = if writes.is_some() {
            "<th>Reconcile</th>"
        } else {
            ""
        };
        let _ = write!(
            out,
            "<table id=\"uncertain\"><tr><th>Key</th><th>Why</th><th>Resource / fence</th><th>Command</th>{form_head}</tr>"
        );
        for k in &view.uncertain {
            let kind = match k.kind {
                UncertainKind::Marked => "marked",
                UncertainKind::LeaseLost => "lease_lost",
            };
            let resource = match (&k.resource, k.fence) {
                (Some(r), Some(f)) => format!("<span class=\"key\">{}</span> / {f}", esc(r)),
                _ => "-".into(),
            };
            let command = format!(
                "coordctl reconcile {} --store {} --applied|--not-applied --reason '…'",
                shell_word(&k.key),
                shell_word(store)
            );
            let _ = write!(
                out,
                "<tr><td class=\"key\">{}</td><td>{} {}</td><td>{resource}</td><td><code>{}</code></td>",
                esc(&k.key),
                state_badge(kind),
                esc(&k.reason),
                esc(&command)
            );
            if let Some(w) = writes {
                let _ = write!(
                    out,
                    "<td><form class=\"rec\" method=\"post\" action=\"/reconcile\">\
<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"key\" value=\"{key}\">\
<label><input type=\"radio\" name=\"verdict\" value=\"applied\" required> applied</label>\
<label><input type=\"radio\" name=\"verdict\" value=\"not_applied\"> not applied</label>\
<input type=\"text\" name=\"reason\" required maxlength=\"1000\" placeholder=\"reason (the evidence, required)\">\
<input type=\"text\" name=\"result\" maxlength=\"4096\" placeholder=\"result to replay (applied only)\">\
<button type=\"submit\">Review…</button></form></td>",
                    csrf = esc(w.csrf),
                    key = esc(&k.key),
                );
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>");
        if writes.is_none() {
            out.push_str(
                "<p class=\"dim\">This console is read-only; start it with <code>--allow-writes</code> \
to reconcile from this page, or run the command shown.</p>",
            );
        }
    }

    let _ = write!(
        out,
        "<h2>In-flight intents ({})</h2><p class=\"dim\">An intent whose lease expired reads as uncertain until reconciled.</p>",
        view.in_flight.len()
    );
    if view.in_flight.is_empty() {
        out.push_str("<p>No in-flight intents.</p>");
    } else {
        out.push_str(
            "<table id=\"inflight\"><tr><th>Key</th><th>Resource</th><th>Fence</th><th>Resource holder</th><th>Lease</th><th>State</th></tr>",
        );
        for k in &view.in_flight {
            let _ = write!(
                out,
                "<tr><td class=\"key\">{}</td><td class=\"key\">{}</td><td class=\"num\">{}</td><td class=\"key\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(&k.key),
                esc(&k.resource),
                k.fence,
                esc(k.resource_holder.as_deref().unwrap_or("(released)")),
                when(k.lease_expires_ms, view.now_ms),
                if k.live {
                    state_badge("live")
                } else {
                    state_badge("expired")
                }
            );
        }
        out.push_str("</table>");
    }
    out.push_str(&more_link(
        "/sideeffects",
        "after",
        view.next_after.as_deref(),
        limit,
    ));
    out
}

fn runs_table(id: &str, runs: &[RunView]) -> String {
    if runs.is_empty() {
        return "<p>No runs recorded.</p>".into();
    }
    let mut out = format!(
        "<table id=\"{id}\"><tr><th>Slot</th><th>Instance</th><th>Status</th><th>Started</th><th>Duration</th><th>Takeovers</th><th>Message</th></tr>"
    );
    for r in runs {
        let mut status = state_badge(&r.status);
        if let Some(why) = r.skip_reason {
            let _ = write!(status, " <span class=\"dim\">{why}</span>");
        }
        if r.lease_expired {
            status.push_str(" <span class=\"dim\">lease expired</span>");
        }
        if r.manual {
            status.push_str(" <span class=\"dim\">manual</span>");
        }
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{status}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&r.slot),
            esc(&r.instance),
            esc(&r.started),
            r.duration_ms.map(|d| format!("{d} ms")).unwrap_or_else(|| "-".into()),
            r.takeovers,
            esc(r.message.as_deref().unwrap_or(""))
        );
    }
    out.push_str("</table>");
    out
}

/// The scheduler's jobs with their recent runs.
pub(crate) fn jobs(view: &JobsView, limit: usize) -> String {
    let mut out = String::from(
        "<p class=\"dim\">Jobs with records under <code>sched/</code> (jobs that ran or skipped a slot \
through a store; node_local jobs never touch it). Times in UTC.</p>",
    );
    if view.rows.is_empty() {
        out.push_str("<p>No scheduler jobs in this namespace.</p>");
    }
    for job in &view.rows {
        let _ = write!(
            out,
            "<h2><a href=\"/jobs/{}\">{}</a> <span class=\"dim\">{} running, {} skipped of the last {} run(s)</span></h2>",
            esc(&path_segment(&job.job)),
            esc(&job.job),
            job.active.len(),
            job.recent_skipped,
            job.recent.len()
        );
        for a in &job.active {
            let _ = write!(
                out,
                "<p class=\"dim\">running slot {} on {}: lease until {} {}</p>",
                esc(&fmt_time(a.slot_ms, None)),
                esc(&a.instance),
                when(Some(a.lease_until_ms), view.listing.now_ms),
                if a.live {
                    ""
                } else {
                    "(expired: may be taken over)"
                }
            );
        }
        out.push_str(&runs_table(&format!("runs-{}", esc(&job.job)), &job.recent));
    }
    out.push_str(&more_after("/jobs", "after", &view.listing, limit));
    out
}

/// One job's recent runs.
pub(crate) fn job_runs(view: &RunsView) -> String {
    let mut out = format!(
        "<p class=\"dim\">Newest slot first, times in {}. <a href=\"/api/jobs/{}/runs\">JSON</a></p>",
        esc(&view.time_zone),
        esc(&path_segment(&view.job))
    );
    out.push_str(&runs_table("runs", &view.runs));
    out
}

/// The confirmation step of a reconcile.
pub(crate) fn confirm(
    key: &str,
    verdict: &str,
    reason: &str,
    result: &str,
    current: &str,
    csrf: &str,
) -> String {
    let effect = if verdict == "applied" {
        format!(
            "the key becomes <b>completed</b>; later runs replay the result <code>{}</code>",
            esc(result)
        )
    } else {
        "the uncertain mark is <b>cleared</b>; the key may run once more".to_owned()
    };
    format!(
        "<p class=\"note\">Record the verdict <b>{verdict}</b> on key <span class=\"key\">{key}</span>: {effect}. \
This cannot be undone from here.</p>\
<table><tr><th>Key</th><td class=\"key\">{key}</td></tr><tr><th>Now</th><td>{current}</td></tr>\
<tr><th>Verdict</th><td>{verdict}</td></tr><tr><th>Reason</th><td>{reason_text}</td></tr></table>\
<form method=\"post\" action=\"/reconcile\" style=\"margin-top:12px\">\
<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"key\" value=\"{key}\">\
<input type=\"hidden\" name=\"verdict\" value=\"{verdict}\"><input type=\"hidden\" name=\"reason\" value=\"{reason_text}\">\
<input type=\"hidden\" name=\"result\" value=\"{result_attr}\"><input type=\"hidden\" name=\"confirm\" value=\"yes\">\
<button type=\"submit\">Confirm: record “{verdict}”</button> <a href=\"/sideeffects\">Cancel</a></form>",
        verdict = esc(verdict),
        key = esc(key),
        current = esc(current),
        reason_text = esc(reason),
        csrf = esc(csrf),
        result_attr = esc(result),
    )
}
