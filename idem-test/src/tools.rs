//! idem tools that call the stub payment service through its proxy, and the clock that keeps
//! idem's store on the same (paused) time as everything else.

use std::time::Duration;

use idem::{
    tool::{Downstream, ToolSpec, WriteTool},
    ReadBack, ReadBackCtx, ToolError, WriteCtx,
};

use crate::payments::{ApiError, Charge, Object, Proxy, Refund, RefundStatus, Request};

/// The charge and refund tools' timeout in these tests.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// What an error response means for the outcome: only a refusal that provably executed
/// nothing is "rejected"; a `503` with a `Retry-After` is the service shedding load before it
/// executed anything, so "unavailable" (ask again later); a conflict with a running request
/// or another server error may hide an effect, so it is "unknown".
pub fn classify(e: ApiError) -> ToolError {
    match (e.status, e.retry_after) {
        (503, Some(wait)) => ToolError::unavailable_for(e, wait),
        _ => classify_status(e),
    }
}

fn classify_status(e: ApiError) -> ToolError {
    match e.status {
        409 | 500..=599 => ToolError::unknown(e),
        _ => ToolError::rejected(e),
    }
}

/// Arguments of [`ChargeTool`].
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The customer to charge.
    pub customer: String,
    /// Amount in cents.
    pub amount: u64,
}

/// `charge`: creates a charge, sending the operation's key as the `Idempotency-Key`.
pub struct ChargeTool {
    proxy: Proxy,
    downstream: Downstream,
}

impl ChargeTool {
    /// A charge tool declaring that the service behind `proxy` honours keys.
    pub fn keyed(proxy: Proxy) -> Self {
        ChargeTool {
            proxy,
            downstream: Downstream::Keyed,
        }
    }

    /// A charge tool declaring that the service behind `proxy` has no key contract.
    pub fn unkeyed(proxy: Proxy) -> Self {
        ChargeTool {
            proxy,
            downstream: Downstream::Unkeyed,
        }
    }
}

impl WriteTool for ChargeTool {
    type Args = ChargeArgs;
    type Output = Charge;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .description("Charge a customer's card (amount in cents).")
            .downstream(self.downstream)
            .timeout(TOOL_TIMEOUT)
    }

    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Charge, ToolError> {
        let request = Request::CreateCharge {
            customer: args.customer,
            amount: args.amount,
        };
        match self.proxy.send(Some(ctx.key().as_str()), request).await {
            Ok(Object::Charge(charge)) => Ok(charge),
            Ok(other) => Err(ToolError::unknown(format!("unexpected {other:?}"))),
            Err(e) => Err(classify(e)),
        }
    }
}

/// Arguments of [`RefundTool`].
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct RefundArgs {
    /// The charge to refund.
    pub charge: String,
    /// Amount in cents.
    pub amount: u64,
}

/// `refund`: creates a refund. Refunds are asynchronous: a pending one is reported as
/// *pending* with its id, and the read-back (`GET /v1/refunds/{id}`) lets the reconciler poll
/// it to a terminal state.
pub struct RefundTool {
    proxy: Proxy,
}

impl RefundTool {
    /// A refund tool for the service behind `proxy` (which honours keys).
    pub fn new(proxy: Proxy) -> Self {
        RefundTool { proxy }
    }
}

impl WriteTool for RefundTool {
    type Args = RefundArgs;
    type Output = Refund;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("refund")
            .description("Refund a charge (amount in cents).")
            .downstream(Downstream::Keyed)
            .timeout(TOOL_TIMEOUT)
    }

    async fn call(&self, ctx: WriteCtx, args: RefundArgs) -> Result<Refund, ToolError> {
        let request = Request::CreateRefund {
            charge: args.charge,
            amount: args.amount,
        };
        match self.proxy.send(Some(ctx.key().as_str()), request).await {
            Ok(Object::Refund(refund)) => match refund.status {
                RefundStatus::Succeeded => Ok(refund),
                RefundStatus::Pending => Err(ToolError::pending_with(
                    refund.id.clone(),
                    serde_json::to_value(&refund).unwrap_or_default(),
                )),
                RefundStatus::Failed | RefundStatus::Canceled => Err(ToolError::failed_with_ref(
                    format!("refund {:?}", refund.status),
                    refund.id,
                )),
            },
            Ok(other) => Err(ToolError::unknown(format!("unexpected {other:?}"))),
            Err(e) => Err(classify(e)),
        }
    }

    async fn read_back(&self, ctx: ReadBackCtx, _args: RefundArgs) -> Result<ReadBack, ToolError> {
        let Some(id) = ctx.downstream_ref() else {
            return Ok(ReadBack::Unsupported);
        };
        let Some(refund) = self.proxy.payments().refund(id) else {
            return Ok(ReadBack::NotFound);
        };
        let downstream_ref = refund.id.clone();
        Ok(match refund.status {
            RefundStatus::Pending => ReadBack::Pending { downstream_ref },
            RefundStatus::Succeeded => ReadBack::Completed {
                downstream_ref: Some(downstream_ref),
                output: serde_json::to_value(&refund).unwrap_or_default(),
            },
            RefundStatus::Failed | RefundStatus::Canceled => ReadBack::Failed {
                downstream_ref: Some(downstream_ref),
                message: format!("refund {:?}", refund.status),
            },
        })
    }
}
