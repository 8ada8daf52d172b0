//! HTML rendering of the console's pages: plain server-rendered HTML with a
//! little inline CSS and no script, written with `maud`'s `html!`, which
//! escapes every interpolated value by construction. The only markup taken
//! as is ([`PreEscaped`]) is this file's own constants (the style sheet, the
//! sections' notes) and the bodies these functions rendered.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::cron::fmt_time;
use crate::views::{
    span, ElectionsView, FairLocksView, JobsView, Listing, LockView, LocksView, ResourcesView,
    RunView, RunsView, RwLocksView, SemaphoresView, SideEffectsView, TaskPageView, TasksView,
    UncertainKind,
};

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

/// "2026-01-02T03:04:05.678Z (in 9m 53s)" / "(expired 4.2s ago)" or "-".
fn when(at_ms: Option<u64>, now_ms: u64) -> Markup {
    match at_ms {
        None => html! { "-" },
        Some(at) => {
            let rel = if at >= now_ms {
                format!("in {}", span(at - now_ms))
            } else {
                format!("expired {} ago", span(now_ms - at))
            };
            html! { (fmt_time(at, None)) " " span.dim { "(" (rel) ")" } }
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

/// One page: the header with navigation, the title, the body (rendered by
/// the functions of this module).
pub(crate) fn page(title: &str, nav: &str, store: &str, writes: bool, body: &str) -> String {
    const LINKS: [(&str, &str); 6] = [
        ("/", "Overview"),
        ("/locks", "Locks"),
        ("/leaders", "Leaders"),
        ("/tasks", "Tasks"),
        ("/sideeffects", "Side effects"),
        ("/jobs", "Jobs"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · coord console" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    span.brand { "coord console" }
                    nav {
                        @for (href, label) in LINKS {
                            a href=(href) class=[(href == nav).then_some("on")] { (label) }
                        }
                    }
                    span.store {
                        (store) " "
                        @if writes {
                            span.badge.warn { "writes allowed" }
                        } @else {
                            span.badge.idle { "read-only" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (PreEscaped(body))
                }
            }
        }
    }
    .into_string()
}

/// A note paragraph (error pages, the reconcile result).
pub(crate) fn note(message: &str) -> String {
    html! { p.note { (message) } }.into_string()
}

/// The page saying a key was reconciled.
pub(crate) fn reconciled(key: &str, verdict: &str, what: &str, reason: &str) -> String {
    html! {
        p.note #reconciled {
            "Resolved " span.key { (key) } " as " b { (verdict) } ": " (what) "."
            br;
            "Reason: " (reason)
        }
        p { a href="/sideeffects" { "Back to the side-effect keys" } }
    }
    .into_string()
}

/// The "more" link of a listing view: [`more_link`] after its last row.
fn more_after(path: &str, param: &str, listing: &Listing, limit: usize) -> Markup {
    more_link(path, param, listing.next_after.as_deref(), limit)
}

/// The link to the page after the one shown (`param` is its cursor), keeping `limit`.
fn more_link(path: &str, param: &str, next_after: Option<&str>, limit: usize) -> Markup {
    html! {
        @if let Some(after) = next_after {
            p.more {
                a href=(format!("{path}?{param}={}&limit={limit}", query_value(after))) { "more…" }
                " "
                span.dim { "(this list is bounded; the link shows the next names)" }
            }
        }
    }
}

fn state_badge(state: &str) -> Markup {
    let class = match state {
        "held" | "live" | "claimed" | "running" | "succeeded" => "ok",
        "expired" | "skipped" | "released" | "open" => "warn",
        "failed" | "timed_out" | "uncertain" | "lease_lost" | "marked" | "dead" => "bad",
        _ => "idle",
    };
    html! { span class=(format!("badge {class}")) { (state) } }
}

/// A lock's key, fence, state and lease cells (`GenericLock` and `FairLock` rows).
fn lock_cells(lock: &LockView, now_ms: u64) -> Markup {
    html! {
        td.key { (lock.key) }
        td.num { (lock.fence) }
        td { (state_badge(lock.state)) }
        td { (when(lock.lease_expires_ms, now_ms)) }
    }
}

/// One `<div>` per holder (`line` renders it), or `-` when there is none.
fn holder_list<H>(holders: &[H], line: impl Fn(&H) -> Markup) -> Markup {
    html! {
        @if holders.is_empty() {
            "-"
        }
        @for h in holders {
            div { (line(h)) }
        }
    }
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
    html! {
        div.cards {
            div.card { a href="/locks" { b { (held) (plus(locks.listing.truncated)) } "locks held" } }
            div.card {
                a href="/tasks" {
                    b { (tasks.rows.len()) (plus(tasks.listing.truncated)) }
                    "tasks (" (claimed) " claimed)"
                }
            }
            div.card {
                a href="/sideeffects" {
                    b { (effects.uncertain.len()) (plus(effects.truncated)) }
                    "side-effect keys need attention"
                }
            }
            div.card {
                a href="/jobs" {
                    b { (jobs.rows.len()) (plus(jobs.listing.truncated)) }
                    "jobs (" (running) " running)"
                }
            }
        }
        p.note {
            "Each card counts the first page of records only (a “+” means there are more). \
             Every page has its JSON twin under " code { "/api/" } "."
        }
    }
    .into_string()
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
    /// This file's own markup.
    note: PreEscaped<&'static str>,
    id: &'a str,
    headers: &'a [&'a str],
    empty: &'a str,
    more: Markup,
}

impl Section<'_> {
    fn render(self, rows: &[Markup]) -> Markup {
        html! {
            h2 { (self.title) }
            p.dim { (self.note) }
            @if rows.is_empty() {
                p { (self.empty) }
            } @else {
                table id=(self.id) {
                    tr { @for header in self.headers { th { (header) } } }
                    @for row in rows { (row) }
                }
            }
            (self.more)
        }
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
    let lock_rows: Vec<Markup> = locks
        .rows
        .iter()
        .map(|l| html! { tr { (lock_cells(l, locks.listing.now_ms)) } })
        .collect();
    let resource_rows: Vec<Markup> = resources
        .rows
        .iter()
        .map(|r| {
            html! {
                tr {
                    td.key { (r.resource) }
                    td.num { (r.highest_fence) }
                    td.key { (r.holder.as_deref().unwrap_or("-")) }
                    td { (state_badge(r.state)) }
                    td { (when(r.lease_expires_ms, resources.listing.now_ms)) }
                }
            }
        })
        .collect();
    let fair_rows: Vec<Markup> = fair
        .rows
        .iter()
        .map(|l| {
            let live = l.waiting.iter().filter(|t| t.live).count();
            html! {
                tr {
                    (lock_cells(&l.lock, fair.listing.now_ms))
                    td.num { (live) " waiting (" (l.waiting.len()) " tickets)" }
                }
            }
        })
        .collect();
    let semaphore_rows: Vec<Markup> = semaphores
        .rows
        .iter()
        .map(|s| {
            let holders = holder_list(&s.holders, |h| {
                html! {
                    "fence " (h.fence) " "
                    (state_badge(if h.live { "live" } else { "expired" })) " "
                    (when(Some(h.lease_expires_ms), semaphores.listing.now_ms))
                }
            });
            html! {
                tr {
                    td.key { (s.key) }
                    td.num { (s.fence) }
                    td.num { (s.held) " of " (s.permits) }
                    td { (holders) }
                    td.num { (s.waiting) }
                }
            }
        })
        .collect();
    html! {
        (Section {
            title: "Locks",
            note: PreEscaped("Records <code>lock/&lt;key&gt;</code> of GenericLock. \
The fence survives release; a free record keeps it for the next holder."),
            id: "locks",
            headers: &["Key", "Fence", "State", "Lease expires"],
            empty: "No lock records.",
            more: more_after("/locks", "after", &locks.listing, limit),
        }
        .render(&lock_rows))
        (Section {
            title: "Side-effect resource leases",
            note: PreEscaped("Records <code>se/res/&lt;resource&gt;</code>: \
the highest fence issued on each resource and the idempotency key holding it."),
            id: "resources",
            headers: &["Resource", "Highest fence", "Holder (key)", "State", "Lease expires"],
            empty: "No side-effect resources.",
            more: more_after("/locks", "res_after", &resources.listing, limit),
        }
        .render(&resource_rows))
        (Section {
            title: "Fair locks",
            note: PreEscaped("Records <code>fairlock/&lt;key&gt;/m</code> (holder, fence) and <code>/n</code> \
(the line) of FairLock: a release hands the lock to the first live ticket."),
            id: "fairlocks",
            headers: &["Key", "Fence", "State", "Lease expires", "Line"],
            empty: "No fair locks.",
            more: more_after("/locks", "fair_after", &fair.listing, limit),
        }
        .render(&fair_rows))
        (Section {
            title: "Semaphores",
            note: PreEscaped("Records <code>sem/&lt;key&gt;</code> of GenericSemaphore: each permit held, \
with its own fence, and the waiters in line."),
            id: "semaphores",
            headers: &["Key", "Fence", "Permits held", "Holders", "Waiting in line"],
            empty: "No semaphores.",
            more: more_after("/locks", "sem_after", &semaphores.listing, limit),
        }
        .render(&semaphore_rows))
    }
    .into_string()
}

/// The leaders page: `GenericElection` leaders and `GenericRwLock` holders.
pub(crate) fn leaders(elections: &ElectionsView, rwlocks: &RwLocksView, limit: usize) -> String {
    let election_rows: Vec<Markup> = elections
        .rows
        .iter()
        .map(|e| {
            let state = if e.leader.is_some() { "live" } else { "none" };
            html! {
                tr {
                    td.key { (e.name) }
                    td.num { (e.term) }
                    td.key { (e.leader.as_deref().unwrap_or("-")) }
                    td { (state_badge(state)) }
                    td { (when(e.lease_expires_ms, elections.listing.now_ms)) }
                }
            }
        })
        .collect();
    let rwlock_rows: Vec<Markup> = rwlocks
        .rows
        .iter()
        .map(|r| {
            let holders = holder_list(&r.holders, |h| {
                html! {
                    (h.mode) " fence " (h.fence) " " (state_badge(h.state)) " "
                    (when(Some(h.lease_expires_ms), rwlocks.listing.now_ms))
                }
            });
            html! {
                tr {
                    td.key { (r.key) }
                    td.num { (r.fence) }
                    td { (state_badge(r.state)) }
                    td { (holders) }
                    td.num { (r.queued_writers) }
                }
            }
        })
        .collect();
    html! {
        (Section {
            title: "Elections",
            note: PreEscaped("Records <code>election/&lt;name&gt;</code> of \
    GenericElection: the live leader and the latest term (the fencing token; it survives \
    resignations). The value a leader announces is the application's and is not shown."),
            id: "elections",
            headers: &["Election", "Term", "Leader", "State", "Lease expires"],
            empty: "No elections.",
            more: more_after("/leaders", "after", &elections.listing, limit),
        }
        .render(&election_rows))
        (Section {
            title: "Read-write locks",
            note: PreEscaped("Records <code>rwlock/&lt;key&gt;</code> of \
    GenericRwLock: each holder with its mode and fence; queued writers hold new readers back."),
            id: "rwlocks",
            headers: &["Key", "Fence", "State", "Holders", "Queued writers"],
            empty: "No read-write lock records.",
            more: more_after("/leaders", "rw_after", &rwlocks.listing, limit),
        }
        .render(&rwlock_rows))
    }
    .into_string()
}

/// A count of a queue's index: `12`, or `10000+` when the listing stopped.
fn bounded(count: usize, more: bool) -> String {
    format!("{count}{}", if more { "+" } else { "" })
}

/// The task page: the queues (counts, dead tasks with their errors and,
/// with `writes`, a retry form each), then the board's tasks.
pub(crate) fn tasks(view: &TaskPageView, writes: Option<&Writes<'_>>, limit: usize) -> String {
    let queues = &view.queues;
    let tasks = &view.tasks;
    html! {
        h2 { "Queues (" (queues.queues.len()) @if queues.truncated { "+" } ")" }
        p.dim {
            "Counted from each queue's index " code { "board/queue/<queue>/" } " (ready, timed: a \
             run-at, backoff or live claim ahead, dead), never from the task records; a count \
             ending in + stopped at its limit."
        }
        @if queues.queues.is_empty() {
            p { "No queues." }
        } @else {
            table #queues {
                tr {
                    th { "Queue" } th { "Depth" } th { "Ready" } th { "Timed" }
                    th { "Oldest ready" } th { "Dead" }
                }
                @for q in &queues.queues {
                    tr {
                        td.key { (q.queue) }
                        td.num { (bounded(q.depth, q.ready_more || q.timed_more)) }
                        td.num { (bounded(q.ready, q.ready_more)) }
                        td.num { (bounded(q.timed, q.timed_more)) }
                        td {
                            @match q.oldest_ready_age_ms {
                                Some(age) => { (span(age)) }
                                None => "-",
                            }
                        }
                        td.num {
                            @if q.dead > 0 {
                                span.badge.bad { (bounded(q.dead, q.dead_more)) }
                            } @else { "0" }
                        }
                    }
                }
            }
        }
        @let dead: Vec<_> = queues.queues.iter().flat_map(|q| q.dead_tasks.iter().map(move |d| (q, d))).collect();
        h2 { "Dead tasks (" (dead.len()) ")" }
        p.note {
            "A dead task used up its attempts and is never claimed again until retried (its \
             attempts then count from zero). Fix what its error says first."
        }
        @if dead.is_empty() {
            p { "No dead tasks." }
        } @else {
            table #dead {
                tr {
                    th { "Task" } th { "Queue" } th { "Died" } th { "Attempts" } th { "Last error" }
                    @if writes.is_some() { th { "Retry" } }
                }
                @for (q, d) in &dead {
                    tr {
                        td.key { (d.task.id) }
                        td.key { (q.queue) }
                        td { (fmt_time(d.died_ms, None)) }
                        td.num { (d.task.attempts) }
                        td.key.error { (d.task.last_error.as_deref().unwrap_or("-")) }
                        @if let Some(w) = writes {
                            td {
                                form.retry method="post" action="/retry" {
                                    input type="hidden" name="csrf" value=(w.csrf);
                                    input type="hidden" name="id" value=(d.task.id);
                                    button type="submit" { "Retry…" }
                                }
                            }
                        }
                    }
                }
            }
            @if queues.queues.iter().any(|q| q.dead_tasks_more) {
                p.dim { "More dead tasks than shown: " code { "/api/queues?limit=N" } " lists up to 500 per queue." }
            }
            @if writes.is_none() {
                p.dim {
                    "This console is read-only; start it with " code { "--allow-writes" }
                    " to retry dead tasks from this page."
                }
            }
        }
        h2 { "Tasks" }
        p.dim {
            "Records " code { "board/task/<id>" } ". Payloads and results are the \
             application's data and are not shown."
        }
        @if tasks.rows.is_empty() {
            p { "No tasks on the board." }
        } @else {
            table #tasks {
                tr {
                    th { "Task" } th { "State" } th { "Agent" } th { "Fence" } th { "Lease" }
                    th { "Depends on" } th { "Queue" } th { "Attempts" } th { "Not before" }
                    th { "Last error" }
                }
                @for t in &tasks.rows {
                    tr {
                        td.key { (t.id) }
                        td { (state_badge(t.state)) }
                        td { (t.agent.as_deref().unwrap_or("-")) }
                        td.num { (t.fence) }
                        td { (when(t.lease_expires_ms, tasks.listing.now_ms)) }
                        td.key {
                            @if t.deps.is_empty() { "-" } @else { (t.deps.join(", ")) }
                        }
                        td.key {
                            @match &t.queue {
                                Some(q) => { (q) @if t.priority != 0 { " " span.dim { "(priority " (t.priority) ")" } } }
                                None => "-",
                            }
                        }
                        td.num {
                            (t.attempts)
                            @if let Some(max) = t.max_attempts { " / " (max) }
                        }
                        td { (when(t.not_before_ms, tasks.listing.now_ms)) }
                        td.key { (t.last_error.as_deref().unwrap_or("-")) }
                    }
                }
            }
            (more_after("/tasks", "after", &tasks.listing, limit))
        }
    }
    .into_string()
}

/// The confirmation step of a retry of a dead task.
pub(crate) fn confirm_retry(id: &str, current: &str, csrf: &str) -> String {
    html! {
        p.note {
            "Retry the dead task " span.key { (id) } ": it becomes ready in its queue again, \
             its attempts counted from zero, and a worker will run it."
        }
        table {
            tr { th { "Task" } td.key { (id) } }
            tr { th { "Now" } td { (current) } }
        }
        form.retry method="post" action="/retry" style="margin-top:12px" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="id" value=(id);
            input type="hidden" name="confirm" value="yes";
            button type="submit" { "Confirm: retry" }
            " "
            a href="/tasks" { "Cancel" }
        }
    }
    .into_string()
}

/// The page saying a dead task was retried.
pub(crate) fn retried(id: &str) -> String {
    html! {
        p.note #retried {
            "Retried " span.key { (id) } ": it is ready in its queue again."
        }
        p { a href="/tasks" { "Back to the tasks" } }
    }
    .into_string()
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
    html! {
        p.dim {
            (view.examined) " key(s) read from " code { "se/act/" } ": " (view.completed)
            " completed, " (view.idle) " idle, " (view.in_flight.len()) " in flight, "
            (view.uncertain.len()) " uncertain."
        }
        h2 { "Uncertain keys (" (view.uncertain.len()) ")" }
        p.note {
            "An uncertain key never runs again until an operator settles it. Check downstream \
             whether the action took effect (did the e-mail leave? is the row there?), then record \
             the verdict with its evidence: " b { "applied" } " completes the key (later runs \
             replay the result), " b { "not applied" } " clears the mark so the key may run once more."
        }
        @if view.uncertain.is_empty() {
            p { "No uncertain keys." }
        } @else {
            table #uncertain {
                tr {
                    th { "Key" } th { "Why" } th { "Resource / fence" } th { "Command" }
                    @if writes.is_some() { th { "Reconcile" } }
                }
                @for k in &view.uncertain {
                    tr {
                        td.key { (k.key) }
                        td {
                            (state_badge(match k.kind {
                                UncertainKind::Marked => "marked",
                                UncertainKind::LeaseLost => "lease_lost",
                            }))
                            " " (k.reason)
                        }
                        td {
                            @match (&k.resource, k.fence) {
                                (Some(r), Some(f)) => { span.key { (r) } " / " (f) }
                                _ => "-",
                            }
                        }
                        td {
                            code {
                                "coordctl reconcile " (shell_word(&k.key)) " --store "
                                (shell_word(store)) " --applied|--not-applied --reason '…'"
                            }
                        }
                        @if let Some(w) = writes {
                            td {
                                form.rec method="post" action="/reconcile" {
                                    input type="hidden" name="csrf" value=(w.csrf);
                                    input type="hidden" name="key" value=(k.key);
                                    label { input type="radio" name="verdict" value="applied" required; " applied" }
                                    label { input type="radio" name="verdict" value="not_applied"; " not applied" }
                                    input type="text" name="reason" required maxlength="1000"
                                        placeholder="reason (the evidence, required)";
                                    input type="text" name="result" maxlength="4096"
                                        placeholder="result to replay (applied only)";
                                    button type="submit" { "Review…" }
                                }
                            }
                        }
                    }
                }
            }
            @if writes.is_none() {
                p.dim {
                    "This console is read-only; start it with " code { "--allow-writes" }
                    " to reconcile from this page, or run the command shown."
                }
            }
        }
        h2 { "In-flight intents (" (view.in_flight.len()) ")" }
        p.dim { "An intent whose lease expired reads as uncertain until reconciled." }
        @if view.in_flight.is_empty() {
            p { "No in-flight intents." }
        } @else {
            table #inflight {
                tr {
                    th { "Key" } th { "Resource" } th { "Fence" } th { "Resource holder" }
                    th { "Lease" } th { "State" }
                }
                @for k in &view.in_flight {
                    tr {
                        td.key { (k.key) }
                        td.key { (k.resource) }
                        td.num { (k.fence) }
                        td.key { (k.resource_holder.as_deref().unwrap_or("(released)")) }
                        td { (when(k.lease_expires_ms, view.now_ms)) }
                        td { (state_badge(if k.live { "live" } else { "expired" })) }
                    }
                }
            }
        }
        (more_link("/sideeffects", "after", view.next_after.as_deref(), limit))
    }
    .into_string()
}

fn runs_table(id: &str, runs: &[RunView]) -> Markup {
    html! {
        @if runs.is_empty() {
            p { "No runs recorded." }
        } @else {
            table id=(id) {
                tr {
                    th { "Slot" } th { "Instance" } th { "Status" } th { "Started" }
                    th { "Duration" } th { "Takeovers" } th { "Attempts" } th { "Message" }
                }
                @for r in runs {
                    tr {
                        td { (r.slot) }
                        td { (r.instance) }
                        td {
                            (state_badge(&r.status))
                            @if let Some(why) = r.skip_reason { " " span.dim { (why) } }
                            @if r.lease_expired { " " span.dim { "lease expired" } }
                            @if r.manual { " " span.dim { "manual" } }
                        }
                        td { (r.started) }
                        td.num {
                            @match r.duration_ms {
                                Some(d) => { (d) " ms" }
                                None => "-",
                            }
                        }
                        td.num { (r.takeovers) }
                        td.num { (r.attempts) }
                        td { (r.message.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

/// The scheduler's jobs with their recent runs.
pub(crate) fn jobs(view: &JobsView, limit: usize) -> String {
    html! {
        p.dim {
            "Jobs with records under " code { "sched/" } " (jobs that ran or skipped a slot \
             through a store; node_local jobs never touch it). Times in UTC."
        }
        @if view.rows.is_empty() {
            p { "No scheduler jobs in this namespace." }
        }
        @for job in &view.rows {
            h2 {
                a href=(format!("/jobs/{}", path_segment(&job.job))) { (job.job) }
                " "
                span.dim {
                    (job.active.len()) " running, " (job.recent_skipped) " skipped of the last "
                    (job.recent.len()) " run(s)"
                }
            }
            @for a in &job.active {
                p.dim {
                    "running slot " (fmt_time(a.slot_ms, None)) " on " (a.instance) ": lease until "
                    (when(Some(a.lease_until_ms), view.listing.now_ms))
                    @if !a.live { " (expired: may be taken over)" }
                }
            }
            (runs_table(&format!("runs-{}", job.job), &job.recent))
        }
        (more_after("/jobs", "after", &view.listing, limit))
    }
    .into_string()
}

/// One job's recent runs.
pub(crate) fn job_runs(view: &RunsView) -> String {
    html! {
        p.dim {
            "Newest slot first, times in " (view.time_zone) ". "
            a href=(format!("/api/jobs/{}/runs", path_segment(&view.job))) { "JSON" }
        }
        (runs_table("runs", &view.runs))
    }
    .into_string()
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
    html! {
        p.note {
            "Record the verdict " b { (verdict) } " on key " span.key { (key) } ": "
            @if verdict == "applied" {
                "the key becomes " b { "completed" } "; later runs replay the result " code { (result) }
            } @else {
                "the uncertain mark is " b { "cleared" } "; the key may run once more"
            }
            ". This cannot be undone from here."
        }
        table {
            tr { th { "Key" } td.key { (key) } }
            tr { th { "Now" } td { (current) } }
            tr { th { "Verdict" } td { (verdict) } }
            tr { th { "Reason" } td { (reason) } }
        }
        form method="post" action="/reconcile" style="margin-top:12px" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="key" value=(key);
            input type="hidden" name="verdict" value=(verdict);
            input type="hidden" name="reason" value=(reason);
            input type="hidden" name="result" value=(result);
            input type="hidden" name="confirm" value="yes";
            button type="submit" { "Confirm: record “" (verdict) "”" }
            " "
            a href="/sideeffects" { "Cancel" }
        }
    }
    .into_string()
}
