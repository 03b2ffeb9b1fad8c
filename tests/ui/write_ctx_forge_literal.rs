use idem::store::ClaimToken;
use idem::{IdemKey, ReadCtx, WriteCtx};

// User code cannot make a `WriteCtx` with a struct literal either.
fn forge(read: ReadCtx, key: IdemKey, token: ClaimToken) -> WriteCtx {
    WriteCtx { read, key, token }
}

fn main() {
    let _ = forge;
}
