// `#[idem::args]` belongs on the arguments type, not on the handler.
#[idem::args]
async fn charge_card() {}

fn main() {}
