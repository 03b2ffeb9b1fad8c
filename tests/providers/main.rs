//! Provider messages (OpenAI, Anthropic, async-openai's types and streams): tool calls in,
//! results out, the adapters' edge cases, and the example agent loop.

mod adapters;
mod agent_loop;
#[cfg(feature = "async-openai")]
mod async_openai_types;
mod cases;
