//! The test double the tools charge: a ledger of charges, and whether it honours keys.

use std::sync::{Arc, Mutex, MutexGuard};

use idem::fault_kit::{Fault, Subject};
use idem::tool::{DynTool, Toolbox};
use idem::{toolbox, ReadBack, ReadBackCtx, ToolError, WriteCtx};

/// One committed charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    /// The key the charge was made under (what the handler sent).
    pub key: String,
    pub cents: u64,
}

/// A bank: every charge it commits, in order.
#[derive(Debug, Default)]
pub struct Bank {
    /// Charges once per key when set; otherwise every request is a charge.
    honours_keys: bool,
    charges: Mutex<Vec<Charge>>,
}

impl Bank {
    pub fn keyed() -> Arc<Bank> {
        Arc::new(Bank {
            honours_keys: true,
            ..Bank::default()
        })
    }

    pub fn unkeyed() -> Arc<Bank> {
        Arc::new(Bank::default())
    }

    pub fn charges(&self) -> MutexGuard<'_, Vec<Charge>> {
        self.charges.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `POST /charges` with an `Idempotency-Key`.
    pub fn charge(&self, key: &str, cents: u64) {
        let mut charges = self.charges();
        if self.honours_keys && charges.iter().any(|c| c.key == key) {
            return;
        }
        charges.push(Charge {
            key: key.to_owned(),
            cents,
        });
    }
}

#[idem::args]
pub struct ChargeArgs {
    pub customer: String,
    pub cents: u64,
}

/// The arguments every kit run calls with, and the changed ones.
pub fn args() -> serde_json::Value {
    serde_json::json!({ "customer": "acme", "cents": 4900 })
}

pub fn changed_args() -> serde_json::Value {
    serde_json::json!({ "customer": "acme", "cents": 9900 })
}

/// Tools over a [`Bank`].
pub struct Billing {
    pub bank: Arc<Bank>,
}

#[toolbox]
impl Billing {
    /// Charge a card; the bank honours keys.
    #[tool(write, downstream = "keyed")]
    async fn charge(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        self.bank.charge(ctx.key().as_str(), args.cents);
        Ok(args.cents)
    }

    /// Charge a card; a sandbox's short times, for a run in real time.
    #[tool(
        write,
        downstream = "keyed",
        timeout = "50ms",
        in_flight = "100ms",
        lease = "300ms"
    )]
    async fn charge_quick(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        self.bank.charge(ctx.key().as_str(), args.cents);
        Ok(args.cents)
    }

    /// Charge a card; the reconciler (and the kit, when asked) looks charges up by key.
    #[tool(write, downstream = "keyed", reconcile = find_charge)]
    async fn charge_found(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        self.bank.charge(ctx.key().as_str(), args.cents);
        Ok(args.cents)
    }

    /// The charges made under the operation's key.
    async fn find_charge(
        &self,
        ctx: ReadBackCtx,
        _args: ChargeArgs,
    ) -> Result<ReadBack, ToolError> {
        let mut refs: Vec<String> = (self.bank.charges().iter().enumerate())
            .filter(|(_, c)| c.key == ctx.key().as_str())
            .map(|(i, _)| format!("ch_{}", i + 1))
            .collect();
        Ok(match refs.len() {
            0 => ReadBack::NotFound,
            1 => ReadBack::Completed {
                downstream_ref: refs.pop(),
                output: serde_json::json!(4900),
            },
            _ => ReadBack::Ambiguous {
                downstream_refs: refs,
            },
        })
    }

    /// Charge a card, twice per call: a bug the kit must catch.
    #[tool(write, downstream = "keyed")]
    async fn charge_twice(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        self.bank.charge(ctx.key().as_str(), args.cents);
        self.bank
            .charge(&format!("{}-again", ctx.key()), args.cents);
        Ok(args.cents)
    }

    /// Charge a card; declared unkeyed, as its bank is.
    #[tool(write)]
    async fn charge_unkeyed(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        self.bank.charge(ctx.key().as_str(), args.cents);
        Ok(args.cents)
    }
}

/// The tool named `name` of a `Billing` over `bank`.
pub fn tool(bank: Arc<Bank>, name: &str) -> DynTool {
    (Arc::new(Billing { bank }).tools().into_iter())
        .find(|t| t.name() == name)
        .expect("a tool of Billing")
}

/// Every bank a kit run made, one per fault, to count after the run.
#[derive(Clone, Default)]
pub struct Banks(Arc<Mutex<Vec<Arc<Bank>>>>);

impl Banks {
    /// A subject for the kit: `tool` of a fresh `Billing` over `bank()`, counted by its
    /// whole ledger.
    pub fn subject(&self, bank: fn() -> Arc<Bank>, tool: &str) -> Subject {
        let bank = bank();
        self.0.lock().unwrap().push(bank.clone());
        let counted = bank.clone();
        Subject::toolbox(Arc::new(Billing { bank }), tool, move |_key| {
            counted.charges().len()
        })
    }

    /// A subject for the kit: `tool` of a fresh `Billing` over `bank()`, counted by the
    /// tool's own read-back.
    pub fn read_back_subject(&self, bank: fn() -> Arc<Bank>, name: &str) -> Subject {
        let bank = bank();
        self.0.lock().unwrap().push(bank.clone());
        Subject::counted_by_read_back(tool(bank, name))
    }

    /// Charges in each fault's bank, in the order the faults ran.
    pub fn counts(&self, faults: &[Fault]) -> Vec<(Fault, usize)> {
        let banks = self.0.lock().unwrap();
        assert_eq!(banks.len(), faults.len(), "one bank per fault");
        faults
            .iter()
            .zip(banks.iter())
            .map(|(f, b)| (*f, b.charges().len()))
            .collect()
    }
}
