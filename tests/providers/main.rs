//! Provider messages (OpenAI, Anthropic): tool calls in, results out, the adapters' edge
//! cases, and the example agent loop.

mod adapters;
mod agent_loop;
mod cases;
