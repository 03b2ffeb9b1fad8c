use idem::{tool, Registry, ToolError, WriteCtx};

mod my {
    /// Spelled `Result`, but not `std::result::Result`.
    pub struct Result<T, E>(pub T, pub E);
}

/// The return type's name says `Result`; the type checker knows better.
#[tool(write)]
async fn charge(ctx: WriteCtx) -> my::Result<u64, ToolError> {
    let _ = ctx;
    my::Result(0, ToolError::failed("x"))
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
