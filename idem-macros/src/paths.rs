//! Where generated code finds the runtime: always an absolute path through the facade's hidden
//! module, under whatever name the user's `Cargo.toml` gives the `idem` package.

use proc_macro2::{Ident, Span, TokenStream};
use proc_macro_crate::{crate_name, FoundCrate};
use quote::quote;

/// The facade's package name on crates.io (`idem` was taken); its library is named `idem`.
const FACADE_PACKAGE: &str = "idem-rs";

/// The name the facade's library has in the user's crate.
fn facade_name() -> String {
    match crate_name(FACADE_PACKAGE) {
        // `idem-rs = "…"`: not renamed, so the extern crate has the library's own name.
        // (proc-macro-crate spells an unrenamed dependency after its package.)
        Ok(FoundCrate::Name(name)) if name == FACADE_PACKAGE.replace('-', "_") => "idem".to_owned(),
        // `idem2 = { package = "idem-rs" }`: the extern crate is the key.
        Ok(FoundCrate::Name(name)) => name,
        // `Itself`: an example or a doc test of the facade (the library itself never uses its
        // own macro), where the facade is the extern crate `idem`. An unreadable manifest
        // (e.g. rustdoc's scraper) gets the plain name too.
        Ok(FoundCrate::Itself) | Err(_) => "idem".to_owned(),
    }
}

/// The absolute path of the facade, e.g. `::idem` (or `::idem2` when renamed).
pub(crate) fn facade() -> TokenStream {
    let name = Ident::new(&facade_name(), Span::call_site());
    quote!(::#name)
}

/// [`facade`] as text, for attributes that take a path in a string (`#[serde(crate = "…")]`).
pub(crate) fn facade_string() -> String {
    format!("::{}", facade_name())
}

/// The absolute path of the runtime, e.g. `::idem::__private::idem_runtime`.
pub(crate) fn runtime() -> TokenStream {
    let facade = facade();
    quote!(#facade::__private::idem_runtime)
}
