use std::sync::Arc;

use idem::{toolbox, Registry, ToolError};

#[idem::args]
struct RefundArgs {
    charge: String,
}

struct Billing;

#[toolbox]
impl Billing {
    /// Refund, without the key.
    #[tool(write)]
    async fn refund(&self, args: RefundArgs) -> Result<String, ToolError> {
        Ok(args.charge)
    }
}

fn main() {
    let _ = Registry::builder().toolbox(Arc::new(Billing));
}
