use idem::tool;

/// Not a fn.
#[tool(write)]
struct Charge;

fn main() {
    let _ = Charge;
}
