// `#[idem::args]` plus a hand-written derive of one of the same traits.
#[idem::args]
#[derive(serde::Deserialize)]
struct ChargeArgs {
    cents: u64,
}

fn main() {
    let _ = ChargeArgs { cents: 1 }.cents;
}
