// `#[idem::args]` takes only `crate = "…"`.
#[idem::args(rename_all = "camelCase")]
struct ChargeArgs {
    customer: String,
}

fn main() {}
