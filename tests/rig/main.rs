//! Registry tools inside rig agents: the example agent, a rig conversation as the run, and
//! the calls a rig agent loop repeats (twice in one message, a resumed run, a lost answer).

mod agent;
mod conversation;
mod repeated_calls;
/// The example's scripted model (rig's OpenAI wire over a scripted HTTP client).
#[path = "../../examples/rig_agent/scripted.rs"]
mod scripted;
