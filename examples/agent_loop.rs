//! A complete agent loop over two recorded transcripts, one OpenAI Chat Completions and one
//! Anthropic Messages (`examples/agent_loop/*.json`; no network): the model charges an
//! invoice, the harness loses the answer, the model re-issues the charge with a new call id,
//! then retries with changed parameters. One charge on the ledger each time.
//!
//! ```sh
//! cargo run --example agent_loop --features openai,anthropic
//! ```

#[path = "agent_loop/run.rs"]
mod run;

use idem::Scope;
use run::{billing, run_anthropic, run_openai, Run, Transcript};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agent_loop");

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for file in ["openai_chat.json", "anthropic_messages.json"] {
        let transcript = Transcript::load(&format!("{DIR}/{file}"))?;
        println!("== {} ({file}) ==", transcript.api);
        let (billing, registry) = billing();
        let scope = Scope::run(format!("run-{file}")).with_tenant("acme-corp");
        let run = if file.starts_with("openai") {
            run_openai(&registry, &scope, transcript).await?
        } else {
            run_anthropic(&registry, &scope, transcript).await?
        };
        print_run(&run);
        let ledger = billing.ledger();
        println!(
            "ledger: {} charge(s); the charge handler ran {} time(s)",
            ledger.len(),
            billing.handler_runs()
        );
        for c in &ledger {
            println!(
                "  {} {} {} {} cents  key {}",
                c.id, c.customer, c.invoice, c.cents, c.key
            );
        }
        // What a charge left unknown or pending is settled by a reconciler, never by the
        // model.
        let decisions = idem::Reconciler::new(&registry).run_once().await?;
        println!("reconciler: {} record(s) to settle", decisions.len());
        println!();
    }
    Ok(())
}

fn print_run(run: &Run) {
    println!("what the model was told:");
    for t in &run.told {
        let flag = if t.is_error { "is_error" } else { "ok" };
        println!("  {} {} [{flag}]: {}", t.call_id, t.tool, t.text);
    }
    println!("model: {}", run.answer);
}
