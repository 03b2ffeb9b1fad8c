//! What the two binaries share: the payload, the no-op write tool, and the statistics.

use std::time::Duration;

use idem::{ToolError, tool::{ToolSpec, WriteTool}, WriteCtx};
use serde::{Deserialize, Serialize};

/// The payload every case runs on, as the model's text.
pub const TEXT: &str = r#"{"customer":"acme","amount_cents":4900,"currency":"usd"}"#;

/// The payload as the tool's typed arguments.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// Who pays.
    pub customer: String,
    /// How much, in cents.
    pub amount_cents: u64,
    /// ISO currency code.
    pub currency: String,
}

/// The payload, typed.
pub fn typed() -> ChargeArgs {
    ChargeArgs {
        customer: "acme".into(),
        amount_cents: 4900,
        currency: "usd".into(),
    }
}

/// The payload as a `serde_json::Value`.
pub fn value() -> serde_json::Value {
    serde_json::from_str(TEXT).expect("valid JSON")
}

/// A no-op write: what a layer adds around an effect, not what the effect costs.
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

/// The `q`-quantile (0..=1) of `xs`, nearest rank, after sorting a copy.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

/// Median, p10 and p90 of `xs`.
pub fn spread(xs: &[f64]) -> (f64, f64, f64) {
    (quantile(xs, 0.5), quantile(xs, 0.1), quantile(xs, 0.9))
}

/// Per-call time of a batch, in µs.
pub fn per_call_us(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}
