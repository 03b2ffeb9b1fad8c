use idem::store::ClaimToken;
use idem::{IdemKey, ReadCtx, WriteCtx};

// User code cannot make a `WriteCtx`: it would carry a key nobody claimed. (Tests may, with
// the `testing` feature: `WriteCtx::for_test`.)
fn forge(read: ReadCtx, key: IdemKey, token: ClaimToken) -> WriteCtx {
    WriteCtx::new(read, key, token)
}

fn main() {
    let _ = forge;
}
