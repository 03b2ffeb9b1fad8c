//! Human tables and JSON for records and decisions.

use idem_runtime::reconcile::Decision;
use idem_runtime::store::Timestamp;
use idem_runtime::Record;

fn json_line<T: serde::Serialize + ?Sized>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("idem: cannot print as JSON: {e}"),
    }
}

fn ts(t: Timestamp) -> String {
    t.to_string()
}

/// Prints records as a table (or JSON).
pub(crate) fn records(records: &[Record], json: bool) {
    if json {
        return json_line(records);
    }
    if records.is_empty() {
        println!("(no records)");
        return;
    }
    println!(
        "{:<69}  {:<20}  {:<9}  {:<24}  {:>8}  REASON",
        "KEY", "TOOL", "STATE", "UPDATED", "ATTEMPTS"
    );
    for r in records {
        println!(
            "{:<69}  {:<20}  {:<9}  {:<24}  {:>8}  {}",
            r.key,
            r.tool,
            r.state,
            ts(r.updated_at),
            r.attempts.len(),
            r.message.as_deref().unwrap_or("")
        );
    }
}

/// Prints one record with its evidence.
pub(crate) fn record(r: &Record, json: bool) {
    if json {
        return json_line(r);
    }
    println!("key          {}", r.key);
    println!("tool         {}", r.tool);
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
    println!("created      {}", ts(r.created_at));
    println!("updated      {}", ts(r.updated_at));
    if let Some(m) = &r.message {
        println!("reason       {m}");
    }
    if let Some(d) = &r.downstream_ref {
        println!("downstream   {d}");
    }
    if let Some(op) = &r.operation {
        println!("run          {}", op.scope.run_id());
        if let Some(t) = op.scope.tenant() {
            println!("tenant       {t}");
        }
        if let Some(i) = &op.intent {
            println!("intent       {i}");
        }
        println!("args         {}", op.args);
    }
    if let Some(p) = &r.payload {
        println!("result       {p}");
    }
    for a in &r.attempts {
        println!(
            "attempt {:<4} {} .. {}  {}  {}",
            a.attempt,
            ts(a.started_at),
            ts(a.finished_at),
            a.class,
            a.message.as_deref().unwrap_or("")
        );
    }
    for rb in &r.read_backs {
        println!("read-back    {}  {}", ts(rb.at), rb.result);
    }
}

/// Prints a reconciliation pass's decisions.
pub(crate) fn decisions(d: &[Decision], json: bool) {
    if json {
        return json_line(d);
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
            x.key, x.tool, x.from, action, x.detail
        );
    }
}
