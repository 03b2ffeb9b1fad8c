//! A toolbox read tool that returns a snapshot of its state: `Result<Self, ToolError>`. In a
//! plain impl block `Self` is the state type, and a user expects the same under `#[toolbox]`.
use std::sync::Arc;

use idem::{toolbox, ReadCtx, Registry, ToolError};

#[derive(Clone, serde::Serialize)]
struct Settings {
    limit: u32,
}

#[toolbox]
impl Settings {
    /// The current settings.
    #[tool(read)]
    async fn settings(&self, _ctx: ReadCtx) -> Result<Self, ToolError> {
        Ok(self.clone())
    }
}

fn main() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Settings { limit: 3 }))
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 1);
}
