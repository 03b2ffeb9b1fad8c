//! Human tables and JSON for records and decisions. Everything a record holds is printed
//! through [`Esc`] (tables) or [`to_json`] (JSON): see the `escape` module for why.

use idem_runtime::escalation::EscalationDetail;
use idem_runtime::store::{ListCursor, RecordState, ReleaseRecord};
use idem_runtime::{identity::IdemKey, reconcile::Decision, store::Record};
use serde::Serialize;

use crate::cursor;
use crate::escape::{to_json, Esc};

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn json<T: Serialize + ?Sized>(value: &T) {
    match to_json(value, true) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("idem: cannot print as JSON: {e}"),
    }
}

/// `value` as one line of JSON, for a line on stderr (or a cell of a table).
pub(crate) fn json_line<T: Serialize + ?Sized>(value: &T) -> String {
    to_json(value, false).unwrap_or_else(|e| format!("(cannot print as JSON: {e})"))
}

/// One page of a listing, as `--json` prints it.
#[derive(Serialize)]
struct Page<'a> {
    records: &'a [Record],
    /// Pass as `--after` for the next page; `null` on the last one.
    next_after: Option<String>,
}

/// Prints a page of records as a table (or JSON), then where the next page starts.
pub(crate) fn records(records: &[Record], next: Option<&ListCursor>, json: bool) {
    let next_after = next.map(cursor::format);
    if json {
        return self::json(&Page {
            records,
            next_after,
        });
    }
    if records.is_empty() {
        println!("(no records)");
    } else {
        println!(
            "{:<69}  {:<20}  {:<9}  {:<24}  {:>8}  REASON",
            "KEY", "TOOL", "STATE", "UPDATED", "ATTEMPTS"
        );
        for r in records {
            println!(
                "{:<69}  {:<20}  {:<9}  {:<24}  {:>8}  {}",
                Esc(r.key.as_str()),
                Esc(&r.tool),
                r.state,
                r.updated_at,
                r.attempts.len(),
                Esc(r.message.as_deref().unwrap_or(""))
            );
        }
    }
    if let Some(after) = next_after {
        println!("next page: --after {after}");
    }
}

/// Prints one record with its evidence.
pub(crate) fn record(r: &Record, json: bool) {
    if json {
        return self::json(r);
    }
    println!("key          {}", Esc(r.key.as_str()));
    println!("tool         {}", Esc(&r.tool));
    println!(
        "state        {}{}",
        r.state,
        if r.result_expired {
            " (result expired)"
        } else {
            ""
        }
    );
    println!("fingerprint  {}", r.fingerprint);
    println!("created      {}", r.created_at);
    println!("updated      {}", r.updated_at);
    if let Some(m) = &r.message {
        println!("reason       {}", Esc(m));
    }
    if r.state == RecordState::Escalated {
        let detail = EscalationDetail::of(r);
        println!("reason kind  {}", detail.reason_kind);
        for landed in &detail.landed {
            println!("landed       {}", Esc(landed));
        }
    }
    if let Some(d) = &r.downstream_ref {
        println!("downstream   {}", Esc(d));
    }
    if let Some(op) = &r.operation {
        println!("run          {}", Esc(op.scope.run_id()));
        if let Some(t) = op.scope.tenant() {
            println!("tenant       {}", Esc(t));
        }
        if let Some(p) = op.scope.principal() {
            println!("principal    {}", Esc(p));
        }
        if let Some(i) = &op.intent {
            println!("intent       {}", Esc(i));
        }
        println!("args         {}", json_line(op.args.value()));
    }
    if let Some(p) = r
        .payload
        .as_ref()
        .filter(|_| r.state != RecordState::Escalated)
    {
        println!("result       {}", json_line(p));
    }
    for a in &r.attempts {
        println!(
            "attempt {:<4} {} .. {}  {}  {}",
            a.attempt,
            a.started_at,
            a.finished_at,
            a.class,
            Esc(a.message.as_deref().unwrap_or(""))
        );
    }
    for rb in &r.read_backs {
        println!("read-back    {}  {}", rb.at, Esc(&rb.result));
    }
}

/// A page of releases, as `--json` prints it.
#[derive(Serialize)]
struct ReleasePage<'a> {
    releases: &'a [ReleaseRecord],
    /// Pass as `--after` for the next page; `null` on the last one.
    next_after: Option<String>,
}

/// Prints a page of kept releases as a table (or JSON), then where the next page starts.
pub(crate) fn releases(releases: &[ReleaseRecord], next: Option<&ListCursor>, json: bool) {
    let next_after = next.map(cursor::format);
    if json {
        return self::json(&ReleasePage {
            releases,
            next_after,
        });
    }
    if releases.is_empty() {
        println!("(no releases)");
    } else {
        println!(
            "{:<69}  {:<20}  {:<24}  {:<16}  {:<9}  NOTE",
            "KEY", "TOOL", "RELEASED", "BY", "WAS"
        );
        for r in releases {
            println!(
                "{:<69}  {:<20}  {:<24}  {:<16}  {:<9}  {}",
                Esc(r.record.key.as_str()),
                Esc(&r.record.tool),
                r.at,
                Esc(&r.by),
                r.record.state,
                Esc(&r.note)
            );
        }
    }
    if let Some(after) = next_after {
        println!("next page: --after {after}");
    }
}

/// `idem show --json`: the record's own fields (as a plain record prints), plus its key's
/// release history; or, for a key that was released and not claimed since, the key and
/// the history alone.
#[derive(Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    record: Option<&'a Record>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a IdemKey>,
    /// True when the key has no record now: its last release freed it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    free: bool,
    releases: &'a [ReleaseRecord],
}

/// Prints one key for `idem show`: its record, if any, with its evidence, then the releases
/// the store keeps for it (who freed it, when, why, and what the record was).
pub(crate) fn shown(key: &IdemKey, r: Option<&Record>, releases: &[ReleaseRecord], json: bool) {
    if json {
        return self::json(&Shown {
            record: r,
            key: r.is_none().then_some(key),
            free: r.is_none(),
            releases,
        });
    }
    match r {
        Some(r) => record(r, false),
        None => {
            println!("key          {}", Esc(key.as_str()));
            println!("state        (no record: released, the key is free)");
        }
    }
    for (i, rel) in releases.iter().enumerate() {
        let was = &rel.record;
        println!(
            "release {:<4} {}  by {}: {}",
            i + 1,
            rel.at,
            Esc(&rel.by),
            Esc(&rel.note)
        );
        println!(
            "  was        {} since {}, {} attempts, {} read-backs{}",
            was.state,
            was.updated_at,
            was.attempts.len(),
            was.read_backs.len(),
            match &was.message {
                Some(m) => format!(": {}", Esc(m)),
                None => String::new(),
            }
        );
    }
}

/// Prints a reconciliation's decisions.
pub(crate) fn decisions(d: &[Decision], json: bool) {
    if json {
        return self::json(d);
    }
    if d.is_empty() {
        println!("(nothing to reconcile)");
        return;
    }
    println!(
        "{:<69}  {:<20}  {:<9}  {:<9}  DETAIL",
        "KEY", "TOOL", "FROM", "ACTION"
    );
    for x in d {
        let action = serde_json::to_value(x.action)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!(
            "{:<69}  {:<20}  {:<9}  {:<9}  {}",
            Esc(x.key.as_str()),
            Esc(&x.tool),
            x.from,
            Esc(&action),
            Esc(&x.detail)
        );
    }
}

/// What `idem copy` copied.
pub(crate) fn copied(c: &crate::store_url::Copied, json: bool) {
    if json {
        self::json(c);
        return;
    }
    let spread: Vec<String> = c.per_partition.iter().map(usize::to_string).collect();
    println!(
        "copied {} record(s) and {} release trace(s); left {} lapsed tombstone(s) behind",
        c.records, c.traces, c.lapsed
    );
    println!(
        "the new store's records per partition: {}",
        spread.join(" ")
    );
}
