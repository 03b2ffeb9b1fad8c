// A read tool that forgot its context and takes only its args.
use idem::{tool, Registry, ToolError};

#[idem::args]
struct ListArgs {
    customer: String,
}

/// Lists, without a context.
#[tool(read)]
async fn list(args: ListArgs) -> Result<String, ToolError> {
    Ok(args.customer)
}

fn main() {
    let _ = Registry::builder().tool(list).build();
}
