//! The simulated downstream: a payments API with a ledger of every effect it made.
//!
//! A request goes to a server task that runs on its own: dropping the handler that sent it
//! (a timeout, a killed worker) does not stop it, exactly as closing a socket does not undo
//! a request the server already has. Keyed requests follow Stripe's v1 idempotency rules:
//! the first response for a key is saved (5xx included) and replayed to every repeat; a
//! repeat while the first is still running gets 409; a repeat with other parameters gets
//! 400; a key is forgotten after [`KEY_RETENTION`]. Unkeyed requests execute every time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::faults::Fault;
use crate::world::{lock, World, IN_FLIGHT_BOUND, KEY_RETENTION, TIMEOUT};

/// Amounts divisible by this are declined: a failed effect, recorded in the ledger.
pub const DECLINE_DIVISOR: u64 = 97;

/// One request: charge each of `items` (amounts) for the order `order`.
#[derive(Clone, Debug)]
pub struct Request {
    /// The intent's order number (one order per intent).
    pub order: usize,
    /// Amounts, one charge each.
    pub items: Vec<u64>,
    /// The idempotency key; kept as metadata on every charge either way.
    pub key: String,
    /// Whether the downstream deduplicates by `key`.
    pub keyed: bool,
}

/// What the downstream answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// Every item charged: the charge ids, in item order.
    Charged(Vec<u64>),
    /// Declined: the id of the declined charge.
    Declined(u64),
    /// 500.
    ServerError,
    /// 503 or 429: nothing was executed.
    Unavailable(u16),
    /// 409: a request with this key is still running.
    Conflict,
    /// 400: this key was used with other parameters.
    Mismatch,
}

/// One entry in the ledger: an effect the downstream made.
#[derive(Clone, Debug, PartialEq)]
pub struct Charge {
    /// The downstream's id.
    pub id: u64,
    /// The order it belongs to.
    pub order: usize,
    /// Which item of the order.
    pub item: usize,
    /// The amount.
    pub amount: u64,
    /// The idempotency key it was sent with (metadata).
    pub key: String,
    /// Declined rather than charged.
    pub declined: bool,
}

#[derive(Clone, Debug)]
enum KeyState {
    Running,
    Done(Reply),
}

#[derive(Clone, Debug)]
struct KeyEntry {
    items: Vec<u64>,
    state: KeyState,
    created: Instant,
}

#[derive(Debug, Default)]
struct State {
    charges: Vec<Charge>,
    keys: HashMap<String, KeyEntry>,
    next_id: u64,
    // Answers that will never be sent: the connection hangs until the client gives up.
    hung: Vec<oneshot::Sender<Reply>>,
}

#[derive(Clone, Copy, Debug)]
enum Ack {
    Deliver,
    Hang,
    Reset,
}

#[derive(Clone, Debug)]
struct Fate {
    latency: Duration,
    commit_delay: Duration,
    refuse: Option<Reply>,
    fail_after: bool,
    partial: Option<usize>,
    ack: Ack,
}

/// The simulated downstream and its ledger.
#[derive(Debug)]
pub struct Downstream {
    world: Arc<World>,
    state: Mutex<State>,
}

impl Downstream {
    /// An empty downstream.
    pub fn new(world: Arc<World>) -> Arc<Self> {
        Arc::new(Downstream {
            world,
            state: Mutex::new(State::default()),
        })
    }

    /// Sends `req` and waits for the answer; `None` when the connection reset.
    pub async fn send(self: &Arc<Self>, req: Request) -> Option<Reply> {
        let fate = self.fate(&req);
        let redeliver = self.world.roll(Fault::Redelivery, 0.05);
        if redeliver {
            self.world.fired(req.order, Fault::Redelivery);
            let copy = Fate {
                latency: fate.latency + Duration::from_millis(20),
                commit_delay: Duration::ZERO,
                refuse: None,
                fail_after: false,
                partial: None,
                ack: Ack::Reset,
            };
            tokio::spawn(Arc::clone(self).serve(req.clone(), copy, None));
        }
        let (tx, rx) = oneshot::channel();
        tokio::spawn(Arc::clone(self).serve(req, fate, Some(tx)));
        rx.await.ok()
    }

    fn fate(&self, req: &Request) -> Fate {
        let w = &*self.world;
        let mut rng = w.rng();
        let latency = rng.millis(Duration::from_millis(5), Duration::from_millis(150));
        let mut fate = Fate {
            latency,
            commit_delay: rng.millis(Duration::ZERO, Duration::from_millis(50)),
            refuse: None,
            fail_after: false,
            partial: None,
            ack: Ack::Deliver,
        };
        drop(rng);
        let order = req.order;
        if w.roll(Fault::Transient, 0.10) {
            w.fired(order, Fault::Transient);
            let code = if w.rng().chance(0.5) { 503 } else { 429 };
            fate.refuse = Some(Reply::Unavailable(code));
        } else if w.roll(Fault::ServerErrorBeforeCommit, 0.06) {
            w.fired(order, Fault::ServerErrorBeforeCommit);
            fate.refuse = Some(Reply::ServerError);
        } else if w.roll(Fault::LateTail, 0.04) {
            w.fired(order, Fault::LateTail);
            let tail = w
                .rng()
                .millis(Duration::from_secs(1), Duration::from_secs(40));
            fate.commit_delay = TIMEOUT + 2 * IN_FLIGHT_BOUND + tail;
        } else if w.roll(Fault::LateCommit, 0.08) {
            w.fired(order, Fault::LateCommit);
            let late = w.rng().millis(
                Duration::from_millis(100),
                IN_FLIGHT_BOUND - Duration::from_millis(500),
            );
            fate.commit_delay = (TIMEOUT + late).saturating_sub(latency);
        } else if req.items.len() > 1 && w.roll(Fault::PartialBatch, 0.15) {
            w.fired(order, Fault::PartialBatch);
            let upto = w.rng().range(0, req.items.len() as u64) as usize;
            fate.partial = Some(upto);
        } else if w.roll(Fault::ServerErrorAfterCommit, 0.06) {
            w.fired(order, Fault::ServerErrorAfterCommit);
            fate.fail_after = true;
        }
        if w.roll(Fault::LostAck, 0.08) {
            w.fired(order, Fault::LostAck);
            fate.ack = if w.rng().chance(0.5) {
                Ack::Hang
            } else {
                Ack::Reset
            };
        }
        fate
    }

    async fn serve(self: Arc<Self>, req: Request, fate: Fate, tx: Option<oneshot::Sender<Reply>>) {
        tokio::time::sleep(fate.latency).await;
        if req.keyed {
            let mut st = lock(&self.state);
            prune(&mut st);
            match st.keys.get(&req.key) {
                Some(e) if e.items != req.items => return answer(tx, Reply::Mismatch),
                Some(KeyEntry {
                    state: KeyState::Running,
                    ..
                }) => return answer(tx, Reply::Conflict),
                Some(KeyEntry {
                    state: KeyState::Done(r),
                    ..
                }) => {
                    let r = r.clone();
                    drop(st);
                    return answer(tx, r);
                }
                None => {
                    st.keys.insert(
                        req.key.clone(),
                        KeyEntry {
                            items: req.items.clone(),
                            state: KeyState::Running,
                            created: Instant::now(),
                        },
                    );
                }
            }
        }
        if let Some(refusal) = fate.refuse {
            // Refused before execution: Stripe saves no response for these.
            if req.keyed {
                lock(&self.state).keys.remove(&req.key);
            }
            return answer(tx, refusal);
        }
        tokio::time::sleep(fate.commit_delay).await;
        let reply = {
            let mut st = lock(&self.state);
            let reply = commit(&mut st, &req, &fate);
            if req.keyed {
                st.keys.insert(
                    req.key.clone(),
                    KeyEntry {
                        items: req.items.clone(),
                        state: KeyState::Done(reply.clone()),
                        created: Instant::now(),
                    },
                );
            }
            reply
        };
        match fate.ack {
            Ack::Deliver => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                answer(tx, reply);
            }
            Ack::Hang => {
                if let Some(tx) = tx {
                    lock(&self.state).hung.push(tx);
                }
            }
            Ack::Reset => drop(tx),
        }
    }

    /// Every effect the downstream made, in order.
    pub fn ledger(&self) -> Vec<Charge> {
        lock(&self.state).charges.clone()
    }

    /// The effects carrying `key` as metadata (what a read-back searches).
    pub fn by_key(&self, key: &str) -> Vec<Charge> {
        lock(&self.state)
            .charges
            .iter()
            .filter(|c| c.key == key)
            .cloned()
            .collect()
    }
}

fn answer(tx: Option<oneshot::Sender<Reply>>, reply: Reply) {
    if let Some(tx) = tx {
        // The client may have given up: its answer is lost, the effect stays.
        let _ = tx.send(reply);
    }
}

fn prune(st: &mut State) {
    let now = Instant::now();
    st.keys
        .retain(|_, e| now.saturating_duration_since(e.created) < KEY_RETENTION);
}

fn commit(st: &mut State, req: &Request, fate: &Fate) -> Reply {
    if req.items[0] % DECLINE_DIVISOR == 0 {
        st.next_id += 1;
        let id = st.next_id;
        st.charges.push(Charge {
            id,
            order: req.order,
            item: 0,
            amount: req.items[0],
            key: req.key.clone(),
            declined: true,
        });
        return Reply::Declined(id);
    }
    let upto = fate.partial.unwrap_or(req.items.len());
    let mut ids = Vec::with_capacity(upto);
    for (item, amount) in req.items.iter().take(upto).enumerate() {
        st.next_id += 1;
        ids.push(st.next_id);
        st.charges.push(Charge {
            id: st.next_id,
            order: req.order,
            item,
            amount: *amount,
            key: req.key.clone(),
            declined: false,
        });
    }
    if fate.partial.is_some() || fate.fail_after {
        Reply::ServerError
    } else {
        Reply::Charged(ids)
    }
}
