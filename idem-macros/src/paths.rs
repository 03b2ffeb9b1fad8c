//! Where generated code finds the runtime: always an absolute path through the facade's hidden
//! module, under whatever name the user's `Cargo.toml` gives the `idem` package.

use proc_macro2::{Ident, Span, TokenStream};
use proc_macro_crate::{crate_name, FoundCrate};
use quote::quote;

/// The absolute path of the runtime, e.g. `::idem::__private::idem_runtime`.
pub(crate) fn runtime() -> TokenStream {
    let facade = match crate_name("idem") {
        Ok(FoundCrate::Name(name)) => {
            let name = Ident::new(&name, Span::call_site());
            quote!(::#name)
        }
        // `Itself`: an example or a doc test of the facade (the library itself never uses its
        // own macro), where the facade is the extern crate `idem`. An unreadable manifest
        // (e.g. rustdoc's scraper) gets the plain name too.
        Ok(FoundCrate::Itself) | Err(_) => quote!(::idem),
    };
    quote!(#facade::__private::idem_runtime)
}
