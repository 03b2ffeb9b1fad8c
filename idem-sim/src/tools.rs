//! The write tools the simulated agent calls: one per kind of downstream.

use std::sync::{Arc, Mutex};

use idem::{
    tool::{Downstream as KeyContract, ToolSpec, WriteTool},
    ReadBack, ReadBackCtx, ToolError, WriteCtx,
};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::downstream::{Charge, Downstream, Reply, Request};
use crate::faults::Fault;
use crate::world::{lock, World, IN_FLIGHT_BOUND, LEASE, TIMEOUT, WINDOW};

/// The keyed tool's name.
pub const KEYED: &str = "charge_keyed";
/// The unkeyed tool's name.
pub const UNKEYED: &str = "charge_unkeyed";

/// Charge each item of an order.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The order (one per intent); the key is derived from it.
    pub order: u64,
    /// Amounts in cents, one charge each.
    pub items: Vec<u64>,
}

/// What a 503/429 that guarantees nothing ran becomes: "unavailable, not executed", which
/// the executor asks again within the call's budget and then releases.
pub fn not_executed_try_later(code: u16) -> ToolError {
    ToolError::unavailable(format!("{code}: not executed, try again later"))
}

/// One worker process: it can freeze (a stop-the-world pause, a suspended VM), and then its
/// store calls, lease renewals and requests all wait.
#[derive(Debug)]
pub struct Worker {
    /// The worker's number.
    pub id: usize,
    frozen_until: Mutex<Option<Instant>>,
}

impl Worker {
    /// A running worker.
    pub fn new(id: usize) -> Arc<Self> {
        Arc::new(Worker {
            id,
            frozen_until: Mutex::new(None),
        })
    }

    /// Freezes the worker until `until`.
    pub fn freeze(&self, until: Instant) {
        *lock(&self.frozen_until) = Some(until);
    }

    /// Waits while the worker is frozen; true if it had to.
    pub async fn gate(&self) -> bool {
        let until = *lock(&self.frozen_until);
        match until {
            Some(t) if t > Instant::now() => {
                tokio::time::sleep_until(t).await;
                true
            }
            _ => false,
        }
    }
}

/// A charge tool on one worker.
#[derive(Debug)]
pub struct ChargeTool {
    world: Arc<World>,
    downstream: Arc<Downstream>,
    worker: Arc<Worker>,
    keyed: bool,
}

impl ChargeTool {
    /// The tool for a keyed (`keyed`) or unkeyed downstream, running on `worker`.
    pub fn new(
        world: Arc<World>,
        downstream: Arc<Downstream>,
        worker: Arc<Worker>,
        keyed: bool,
    ) -> Self {
        ChargeTool {
            world,
            downstream,
            worker,
            keyed,
        }
    }

    async fn gate(&self, order: usize) {
        if self.worker.gate().await {
            self.world.fired(order, Fault::WorkerStall);
        }
    }
}

/// The handler's output: the order and its charge ids, in item order.
pub fn output(order: u64, charges: &[u64]) -> Value {
    json!({ "order": order, "charges": charges })
}

impl WriteTool for ChargeTool {
    type Args = ChargeArgs;
    type Output = Value;

    fn spec(&self) -> ToolSpec {
        let spec = ToolSpec::new(if self.keyed { KEYED } else { UNKEYED })
            .description("Charge every item of an order.")
            .timeout(TIMEOUT)
            .lease(LEASE)
            .in_flight_bound(IN_FLIGHT_BOUND)
            .key_fields(["order"]);
        if self.keyed {
            spec.downstream(KeyContract::Keyed).window(WINDOW)
        } else {
            spec.downstream(KeyContract::Unkeyed)
        }
    }

    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        let order = args.order as usize;
        self.world.own(ctx.key(), order);
        self.gate(order).await;
        if args.items.is_empty() {
            return Err(ToolError::rejected("400: an order needs at least one item"));
        }
        let reply = self
            .downstream
            .send(Request {
                order,
                items: args.items.clone(),
                key: ctx.key().as_str().to_owned(),
                keyed: self.keyed,
            })
            .await;
        self.gate(order).await;
        match reply {
            Some(Reply::Charged(ids)) => Ok(output(args.order, &ids)),
            Some(Reply::Declined(id)) => {
                Err(ToolError::failed_with_ref("declined", id.to_string()))
            }
            Some(Reply::ServerError) => Err(ToolError::unknown("500 from the downstream")),
            Some(Reply::Unavailable(code)) => Err(not_executed_try_later(code)),
            // Another request with this key is still running: it may yet commit.
            Some(Reply::Conflict) => Err(ToolError::unknown(
                "409: a request with this key is in progress",
            )),
            // Refused before execution: this key's saved request had other parameters.
            Some(Reply::Mismatch) => {
                Err(ToolError::rejected("400: key reused with other parameters"))
            }
            None => Err(ToolError::unknown("connection reset")),
        }
    }

    async fn read_back(&self, ctx: ReadBackCtx, args: ChargeArgs) -> Result<ReadBack, ToolError> {
        Ok(read_back(
            &self.downstream.by_key(ctx.key().as_str()),
            &args,
        ))
    }
}

/// What the downstream's search by key metadata says about an order.
pub fn read_back(found: &[Charge], args: &ChargeArgs) -> ReadBack {
    if found.is_empty() {
        return ReadBack::NotFound;
    }
    let refs = || found.iter().map(|c| c.id.to_string()).collect::<Vec<_>>();
    let mut per_item = vec![Vec::new(); args.items.len().max(1)];
    let mut declined = Vec::new();
    for c in found {
        if c.declined {
            declined.push(c.id);
        } else if let Some(slot) = per_item.get_mut(c.item) {
            slot.push(c.id);
        }
    }
    if declined.len() > 1 || per_item.iter().any(|s| s.len() > 1) {
        return ReadBack::Ambiguous {
            downstream_refs: refs(),
        };
    }
    if let [id] = declined[..] {
        if per_item.iter().all(Vec::is_empty) {
            return ReadBack::Failed {
                downstream_ref: Some(id.to_string()),
                message: "declined".to_owned(),
            };
        }
        return ReadBack::Ambiguous {
            downstream_refs: refs(),
        };
    }
    if per_item.iter().all(|s| s.len() == 1) {
        let ids: Vec<u64> = per_item.iter().map(|s| s[0]).collect();
        return ReadBack::Completed {
            downstream_ref: Some(ids[0].to_string()),
            output: output(args.order, &ids),
        };
    }
    // Part of the batch charged: say which items landed and which did not.
    let mut landed = Vec::new();
    let mut left = Vec::new();
    for (item, ids) in per_item.iter().enumerate() {
        match ids.first() {
            Some(id) => landed.push(format!("item {item}: charge {id}")),
            None => left.push(format!("item {item}")),
        }
    }
    ReadBack::Partial { landed, left }
}
