// `#[idem::args]` takes no options.
#[idem::args(rename_all = "camelCase")]
struct ChargeArgs {
    customer: String,
}

fn main() {}
