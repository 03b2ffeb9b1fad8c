//! Procedural macros of [idem](https://docs.rs/idem). Use them through the `idem` crate:
//! `#[idem::tool(write)]`, `#[idem::toolbox]`.
//!
//! Each macro runs the same pipeline, one module per stage:
//!
//! 1. **parse** — `attr` reads the `#[tool(..)]` options, `ast` builds a typed view of the
//!    handler (its parameters `classify`-ed, its `docs`, its `duration`s);
//! 2. **validate** — `valid` checks what the grammar cannot (names, write-only options);
//! 3. **expand** — `expand` generates the tool type and its trait impl, `toolbox` does it
//!    per method of an impl block.
//!
//! Every stage collects `syn::Error`s instead of stopping at the first. On any error
//! `fallback` still emits the item (so the rest of the crate, and the IDE, keep working)
//! plus the errors, so one mistake gives one error.
//!
//! Dependencies point one way, down this list; a module uses only modules below it:
//!
//! ```text
//! toolbox   #[toolbox]: per method, expand's trait impl; on error, fallback
//! expand    #[tool]: the trait impl; on error, fallback
//! fallback  the item and its errors, without the trait impl
//! items     the tool type, NAME and constructor (expand and fallback both emit them)
//! valid     semantic checks
//! ast       the typed view (classify, docs)
//! classify, docs, attr (duration)   parsing
//! args, paths                       #[args], and where the runtime is
//! ```
//!
//! The macros recognise the context parameter by position and shape, and the generated code
//! passes it through a hidden trait spanned on the user's type, so the type checker has the
//! last word (see `idem_runtime::macro_support`).
//!
//! The output schema is detected, not asked for: the generated `spec()` probes the handler's
//! `Ok` type with `(&OutputSchemaOf::<Self::Output>::new()).output_schema()`. Method resolution
//! finds `HasOutputSchema` (for `OutputSchemaOf<T>` where `T: JsonSchema`) before
//! `NoOutputSchema` (for `&OutputSchemaOf<T>`, any `T`), so an output type with `JsonSchema`
//! gets a schema and any other compiles as it always did, without one. An opt-in option would
//! have made every existing tool change to gain it; the probe needs nothing from the user,
//! works on stable (no specialization) because handlers name concrete types, and cannot fail
//! to compile. The option `no_output_schema` drops the probe, for a type whose `Serialize`
//! does not match its `JsonSchema`.
#![forbid(unsafe_code)]

mod args;
mod ast;
mod attr;
mod classify;
mod docs;
mod duration;
mod expand;
mod fallback;
mod items;
mod paths;
#[cfg(test)]
mod tests;
mod toolbox;
mod valid;

use proc_macro::TokenStream;

/// Turns an `async fn` into a tool: `#[tool(read)]` or `#[tool(write)]`.
///
/// See the `idem` crate for the options and examples.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::tool(attr.into(), item.into()).into()
}

/// Derives what a tool's arguments need — `Deserialize`, `Serialize` and `JsonSchema` —
/// through the `idem` crate, so a project needs no direct serde or schemars dependency.
///
/// See the `idem` crate for an example.
#[proc_macro_attribute]
pub fn args(attr: TokenStream, item: TokenStream) -> TokenStream {
    args::args(attr.into(), item.into()).into()
}

/// Turns the `#[tool(..)]` methods of an inherent impl block into tools that share `self`.
///
/// See the `idem` crate for an example.
#[proc_macro_attribute]
pub fn toolbox(attr: TokenStream, item: TokenStream) -> TokenStream {
    toolbox::toolbox(attr.into(), item.into()).into()
}
