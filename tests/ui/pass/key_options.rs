//! Key paths, exclusions, a key name, and keyed handlers that hand the key on: warning-free.
#![deny(warnings)]

use idem::{tool, toolbox, Registry, ToolError, WriteCtx};

/// Arguments with nested parts.
#[idem::args]
pub struct InvoiceArgs {
    /// Who pays.
    pub customer: Customer,
    /// Which invoice.
    pub invoice: String,
    /// Free text, not part of the operation.
    pub memo: Option<String>,
    /// A note with free text in it.
    pub note: Note,
}

/// A customer.
#[idem::args]
pub struct Customer {
    /// Its id.
    pub id: String,
}

/// A note.
#[idem::args]
pub struct Note {
    /// Free text.
    pub text: String,
}

/// Keyed by nested fields; the memo and the note's text do not count.
#[tool(
    write,
    name = "charge_invoice",
    key_name = "charge",
    key("/customer/id", invoice),
    exclude(memo, "/note/text"),
    downstream = "keyed"
)]
pub async fn charge_invoice(ctx: WriteCtx, args: InvoiceArgs) -> Result<String, ToolError> {
    // The key is mentioned only inside a macro call: that counts.
    Ok(format!("{} {}", args.invoice, ctx.key()))
}

/// The key reaches the downstream another way.
#[tool(
    write,
    downstream = "keyed",
    key_travels = "the client's middleware reads it from the task-local context"
)]
pub async fn refund(_ctx: WriteCtx, args: InvoiceArgs) -> Result<String, ToolError> {
    Ok(args.invoice)
}

/// Shared state.
pub struct Billing;

#[toolbox]
impl Billing {
    /// A method that passes the key on.
    #[tool(write, downstream = "keyed", key(invoice))]
    async fn void(&self, ctx: WriteCtx, args: InvoiceArgs) -> Result<String, ToolError> {
        let key = ctx.key();
        Ok(format!("{}{key}", args.invoice))
    }
}

fn main() {
    let registry = Registry::builder()
        .tool(charge_invoice)
        .tool(refund)
        .toolbox(std::sync::Arc::new(Billing))
        .build();
    assert!(registry.is_ok());
}
