//! What the benches share: a typical write tool, its arguments, and the floor they are
//! measured against.

use idem::identity::canonical::to_canonical_vec;
use idem::identity::{identify, Fingerprint};
use idem::{
    tool::{ToolSpec, WriteTool},
    ToolError, WriteCtx,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A typical write's arguments: about 100 bytes of JSON.
#[derive(Clone, Deserialize, Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    pub customer: String,
    pub amount_cents: u64,
    pub currency: String,
    pub description: String,
    pub capture: bool,
}

/// A no-op write: what idem adds around a handler, not what the handler costs.
pub struct Charge;

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        Ok(args.amount_cents)
    }
}

/// [`ChargeArgs`] as the caller's JSON.
pub fn small_args() -> Value {
    json!({"customer": "cus_9s6XKzkNRiz8i3", "amount_cents": 4900, "currency": "eur",
           "description": "Order 1234", "capture": true})
}

/// The floor: canonical JSON + SHA-256 of the arguments, the hashing no idempotency layer
/// can skip.
pub fn floor(args: &Value) -> [u8; 32] {
    Sha256::digest(to_canonical_vec(args)).into()
}

/// The typed floor: what any correct call must do with arguments it owns, idempotency layer
/// or not. Decode them into the tool's type (the handler needs it, and the identity is taken
/// of the typed value, so ignored fields and `49` vs `49.0` never split an operation), take
/// that value's identity (canonical JSON + SHA-256), and drop the caller's JSON.
pub fn typed_floor<T: DeserializeOwned + Serialize>(args: Value) -> Fingerprint {
    let typed = T::deserialize(&args).expect("arguments decode");
    let no_key_fields: &[&str] = &[];
    identify(&typed, no_key_fields)
        .expect("arguments serialize")
        .fingerprint
}
