//! Tool definitions: what a registry accepts and refuses when it is built, and the JSON
//! schemas it publishes for each tool's arguments.

mod integer_schemas;
mod registry;
