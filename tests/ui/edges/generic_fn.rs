// A generic handler: the model's JSON needs one concrete type.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Generic over its args.
#[tool(write)]
async fn charge<A: Send + 'static>(ctx: WriteCtx, args: A) -> Result<u64, ToolError> {
    let _ = (ctx, args);
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
    let _ = charge::NAME;
}
