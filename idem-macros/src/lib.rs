//! Procedural macros of idem. Use them through the `idem` crate: `#[idem::tool(write)]`.

use proc_macro::TokenStream;

/// Placeholder until the macro lands: emits the item unchanged.
#[proc_macro_attribute]
pub fn tool(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
