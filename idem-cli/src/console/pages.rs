//! The pages that only read: the list (counts, filters, pages) and one record with all its
//! evidence. Everything a record holds reaches the page through the templates, which
//! HTML-escape it: arguments, reasons and messages come from a model or a downstream.

use std::collections::BTreeSet;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use idem_runtime::escalation::EscalationDetail;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::{AttemptKind, IdemStore, ListCursor, Record, RecordState, StoreError};
use serde::Deserialize;

use super::server::Shared;
use crate::cursor;

/// The states the console lists: the ones a person or the reconciler still has to settle.
const OPEN_STATES: [RecordState; 3] = [
    RecordState::Escalated,
    RecordState::Unknown,
    RecordState::Pending,
];

/// How many records the store is asked for at a time while the list walks a state.
const WALK_BATCH: usize = 500;

/// A page's records by default, and at most.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;

/// A rendered template as a response with `status`, or a plain 500 if it cannot render.
pub(crate) fn render(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page could not be rendered: {e}"),
        )
            .into_response(),
    }
}

/// A page that says one thing: an error, a refusal.
#[derive(Template)]
#[template(path = "message.html")]
struct MessagePage<'a> {
    title: &'a str,
    detail: &'a str,
    back: Option<&'a str>,
}

/// A page with `title` and `detail` (escaped), and a link back.
pub(crate) fn message(
    status: StatusCode,
    title: &str,
    detail: &str,
    back: Option<&str>,
) -> Response {
    render(
        status,
        &MessagePage {
            title,
            detail,
            back,
        },
    )
}

/// The page for a store that cannot be reached or failed: 503, and the console keeps
/// running.
pub(crate) fn unreachable(detail: &str) -> Response {
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        "The store is unreachable",
        detail,
        Some("/"),
    )
}

fn store_failed(e: StoreError) -> Response {
    unreachable(&format!("the store is unreachable or failed: {e}"))
}

/// The list's query: `state`, `tool`, `before` (the position of the last record of the
/// previous page, `MILLIS:KEY`) and `limit`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ListQuery {
    state: String,
    tool: String,
    before: String,
    limit: Option<String>,
}

/// One row of the list.
struct Row {
    key: String,
    tool: String,
    state: String,
    created: String,
    updated: String,
    attempts: usize,
    reason: String,
}

#[derive(Template)]
#[template(path = "list.html")]
struct ListPage {
    escalated: usize,
    unknown: usize,
    pending: usize,
    state: String,
    tool: String,
    tools: Vec<String>,
    rows: Vec<Row>,
    limit: usize,
    next: Option<String>,
}

/// `GET /`: the counts of escalated, unknown and pending records, and a page of them,
/// newest first, filtered by state and tool.
///
/// The store lists a state oldest first, from a cursor; the counts need every record of
/// each state anyway, so the page walks the three states once, in batches, and keeps only
/// the page's newest records before `before` (never more than the page in memory).
pub(crate) async fn list(State(console): State<Shared>, Query(q): Query<ListQuery>) -> Response {
    let bad = |detail: &str| message(StatusCode::BAD_REQUEST, "Bad filter", detail, Some("/"));
    let only = match q.state.as_str() {
        "" => None,
        "escalated" => Some(RecordState::Escalated),
        "unknown" => Some(RecordState::Unknown),
        "pending" => Some(RecordState::Pending),
        _ => return bad("state is one of escalated, unknown and pending"),
    };
    let limit = match q.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        _ => return bad("limit is a whole number from 1 to 500"),
    };
    let before = match q.before.as_str() {
        "" => None,
        s => match cursor::parse(s) {
            Ok(c) => Some(c),
            Err(e) => return bad(&e),
        },
    };
    let store = match console.store().await {
        Ok(s) => s,
        Err(e) => return unreachable(&e),
    };
    let walked = match walk(&*store, only, &q.tool, before.as_ref(), limit).await {
        Ok(w) => w,
        Err(e) => return store_failed(e),
    };
    let mut page = walked.newest;
    let next = if page.len() > limit {
        page.truncate(limit);
        page.last().map(|r| cursor::format(&ListCursor::of(r)))
    } else {
        None
    };
    let rows = page
        .iter()
        .map(|r| Row {
            key: r.key.to_string(),
            tool: r.tool.to_string(),
            state: r.state.to_string(),
            created: r.created_at.to_string(),
            updated: r.updated_at.to_string(),
            attempts: r.attempts.len(),
            reason: r.message.clone().unwrap_or_default(),
        })
        .collect();
    render(
        StatusCode::OK,
        &ListPage {
            escalated: walked.counts[0],
            unknown: walked.counts[1],
            pending: walked.counts[2],
            state: q.state,
            tool: q.tool,
            tools: walked.tools.into_iter().collect(),
            rows,
            limit,
            next,
        },
    )
}

/// What one walk over the open states found.
struct Walked {
    /// Records per state, in [`OPEN_STATES`] order.
    counts: [usize; 3],
    /// Every tool name seen, for the filter.
    tools: BTreeSet<String>,
    /// Up to `limit + 1` matching records before the cursor, newest first.
    newest: Vec<Record>,
}

async fn walk(
    store: &dyn IdemStore,
    only: Option<RecordState>,
    tool: &str,
    before: Option<&ListCursor>,
    limit: usize,
) -> Result<Walked, StoreError> {
    let keep = limit + 1;
    let mut walked = Walked {
        counts: [0; 3],
        tools: BTreeSet::new(),
        newest: Vec::new(),
    };
    let newest_first = |a: &Record, b: &Record| ListCursor::cmp_records(b, a);
    for (i, state) in OPEN_STATES.into_iter().enumerate() {
        let mut after: Option<ListCursor> = None;
        loop {
            let batch = store.list_after(state, after.as_ref(), WALK_BATCH).await?;
            walked.counts[i] += batch.len();
            after = batch.last().map(ListCursor::of);
            let done = batch.len() < WALK_BATCH;
            for r in batch {
                if !walked.tools.contains(&*r.tool) {
                    walked.tools.insert(r.tool.to_string());
                }
                let wanted = only.is_none_or(|s| s == state)
                    && (tool.is_empty() || &*r.tool == tool)
                    && before.is_none_or(|c| ListCursor::of(&r) < *c);
                if wanted {
                    walked.newest.push(r);
                }
            }
            if walked.newest.len() > 2 * keep {
                walked.newest.sort_by(newest_first);
                walked.newest.truncate(keep);
            }
            if done {
                break;
            }
        }
    }
    walked.newest.sort_by(newest_first);
    walked.newest.truncate(keep);
    Ok(walked)
}

/// One attempt, as the record page shows it.
pub(crate) struct AttemptView {
    number: u32,
    started: String,
    finished: String,
    kind: String,
    class: String,
    message: String,
    late: bool,
}

/// A record's fields, as the record page shows them.
pub(crate) struct RecordView {
    state: String,
    result_expired: bool,
    tool: String,
    reason: Option<String>,
    reason_kind: Option<String>,
    landed: Vec<String>,
    downstream_ref: Option<String>,
    created: String,
    updated: String,
    fingerprint: String,
    run: Option<String>,
    tenant: Option<String>,
    principal: Option<String>,
    intent: Option<String>,
    args: Option<String>,
    result: Option<String>,
    attempts: Vec<AttemptView>,
    read_backs: Vec<(String, String)>,
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("(cannot show as JSON: {e})"))
}

impl RecordView {
    /// What `idem show` prints, field for field: the arguments as the store keeps them
    /// (whatever the service redacted before saving is redacted here), the result only
    /// when it is one (an escalated record's payload is its escalation detail, shown as
    /// the reason kind and what landed).
    fn of(r: &Record) -> RecordView {
        let escalated = r.state == RecordState::Escalated;
        let detail = escalated.then(|| EscalationDetail::of(r));
        let op = r.operation.as_ref();
        RecordView {
            state: r.state.to_string(),
            result_expired: r.result_expired,
            tool: r.tool.to_string(),
            reason: r.message.clone(),
            reason_kind: detail.as_ref().map(|d| d.reason_kind.to_string()),
            landed: detail.map(|d| d.landed).unwrap_or_default(),
            downstream_ref: r.downstream_ref.clone(),
            created: r.created_at.to_string(),
            updated: r.updated_at.to_string(),
            fingerprint: r.fingerprint.to_string(),
            run: op.map(|o| o.scope.run_id().to_owned()),
            tenant: op.and_then(|o| o.scope.tenant().map(str::to_owned)),
            principal: op.and_then(|o| o.scope.principal().map(str::to_owned)),
            intent: op.and_then(|o| o.intent.clone()),
            args: op.map(|o| pretty(o.args.value())),
            result: r.payload.as_ref().filter(|_| !escalated).map(pretty),
            attempts: r
                .attempts
                .iter()
                .map(|a| AttemptView {
                    number: a.attempt,
                    started: a.started_at.to_string(),
                    finished: a.finished_at.to_string(),
                    kind: serde_json::to_value(a.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    class: a.class.to_string(),
                    message: a.message.clone().unwrap_or_default(),
                    late: a.kind == AttemptKind::Late,
                })
                .collect(),
            read_backs: r
                .read_backs
                .iter()
                .map(|rb| (rb.at.to_string(), rb.result.clone()))
                .collect(),
        }
    }
}

/// One kept release, as the record page shows it.
pub(crate) struct ReleaseView {
    at: String,
    by: String,
    note: String,
    was: String,
}

#[derive(Template)]
#[template(path = "record.html")]
struct RecordPage<'a> {
    key: String,
    record: Option<RecordView>,
    releases: Vec<ReleaseView>,
    /// Unknown, pending or escalated: the decision forms are shown.
    open: bool,
    csrf: &'a str,
    operator: &'a str,
}

/// The 400 page for a path that names no key.
pub(crate) fn not_a_key(e: impl std::fmt::Display) -> Response {
    message(
        StatusCode::BAD_REQUEST,
        "Not a key",
        &e.to_string(),
        Some("/"),
    )
}

/// `GET /records/{key}`: the record with all its evidence, the releases the store keeps
/// for its key, and, while a person may settle it, the decision forms.
pub(crate) async fn record(State(console): State<Shared>, Path(key): Path<String>) -> Response {
    let key = match IdemKey::parse(&key) {
        Ok(k) => k,
        Err(e) => return not_a_key(e),
    };
    let store = match console.store().await {
        Ok(s) => s,
        Err(e) => return unreachable(&e),
    };
    let (record, releases) = match (store.get(&key).await, store.releases(&key).await) {
        (Ok(r), Ok(rel)) => (r, rel),
        (Err(e), _) | (_, Err(e)) => return store_failed(e),
    };
    if record.is_none() && releases.is_empty() {
        return message(
            StatusCode::NOT_FOUND,
            "No such record",
            &format!("The store holds no record and no release for {key}."),
            Some("/"),
        );
    }
    let open = record.as_ref().is_some_and(|r| {
        matches!(
            r.state,
            RecordState::Unknown | RecordState::Pending | RecordState::Escalated
        )
    });
    let releases = releases
        .iter()
        .map(|rel| ReleaseView {
            at: rel.at.to_string(),
            by: rel.by.clone(),
            note: rel.note.clone(),
            was: format!(
                "{} since {}, {} attempts, {} read-backs{}",
                rel.record.state,
                rel.record.updated_at,
                rel.record.attempts.len(),
                rel.record.read_backs.len(),
                rel.record
                    .message
                    .as_ref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ),
        })
        .collect();
    render(
        StatusCode::OK,
        &RecordPage {
            key: key.to_string(),
            record: record.as_ref().map(RecordView::of),
            releases,
            open,
            csrf: console.auth.csrf(),
            operator: &console.operator,
        },
    )
}
