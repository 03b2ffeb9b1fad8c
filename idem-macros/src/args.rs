//! `#[args]`: derives what a tool's arguments need (`Deserialize`, `Serialize`, `JsonSchema`)
//! through the facade, so users depend on `idem` alone.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;

use crate::paths;

pub(crate) fn args(attr: TokenStream, item: TokenStream) -> TokenStream {
    let (krate, mut errors) = paths::only_crate_option(attr, ARGS_OPTIONS);
    let facade = paths::Facade::new(krate);
    let input = match syn::parse2::<syn::DeriveInput>(item.clone()) {
        Ok(input) => Some(input),
        Err(_) => {
            errors.push(syn::Error::new(
                item.span(),
                "#[args] goes on a struct or enum: the arguments of a tool",
            ));
            None
        }
    };
    if let Some(first) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        let error = first.to_compile_error();
        return quote!(#error #item);
    }
    let fields = input
        .as_ref()
        .map(|input| field_names(input, &facade))
        .unwrap_or_default();
    let serde_path = format!("{}::__private::serde", facade.string());
    let schemars_path = format!("{}::__private::schemars", facade.string());
    let facade = facade.path();
    quote! {
        #[derive(
            #facade::__private::serde::Deserialize,
            #facade::__private::serde::Serialize,
            #facade::__private::schemars::JsonSchema
        )]
        #[serde(crate = #serde_path)]
        #[schemars(crate = #schemars_path)]
        #item

        #fields
    }
}

/// What `#[args(..)]` takes.
const ARGS_OPTIONS: &str = "#[args] takes only `crate = \"…\"` (for a crate that renames the \
     `idem-rs` dependency); put serde and schemars options in their own attributes, e.g. \
     #[serde(rename_all = \"camelCase\")]";

/// `impl ArgsFields`: each named field's Rust name and the name serde serializes it under,
/// so `key(customer_id)` reads `customerId` under `#[serde(rename_all = "camelCase")]`.
/// Serde's own attribute reader decides, so every rename form means here what it means to
/// serde. Nothing for an enum, a tuple struct, or attributes serde refuses (its derive
/// reports those).
fn field_names(input: &syn::DeriveInput, facade: &paths::Facade) -> TokenStream {
    use serde_derive_internals::ast::{Container, Data, Style};
    use serde_derive_internals::{Ctxt, Derive};
    use syn::ext::IdentExt;

    let cx = Ctxt::new();
    let private = syn::Ident::new("__private", proc_macro2::Span::call_site());
    let pairs: Option<Vec<(String, String)>> =
        Container::from_ast(&cx, input, Derive::Serialize, &private).and_then(|c| match c.data {
            Data::Struct(Style::Struct, fields) => Some(
                fields
                    .iter()
                    .filter(|f| !f.attrs.flatten())
                    .filter_map(|f| match &f.member {
                        syn::Member::Named(ident) => Some((
                            ident.unraw().to_string(),
                            f.attrs.name().serialize_name().value.clone(),
                        )),
                        syn::Member::Unnamed(_) => None,
                    })
                    .collect(),
            ),
            _ => None,
        });
    // Serde's derive reports its own attribute errors, once.
    if cx.check().is_err() {
        return TokenStream::new();
    }
    let Some(pairs) = pairs else {
        return TokenStream::new();
    };
    let rt = facade.runtime();
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let pairs = pairs
        .iter()
        .map(|(rust, serialized)| quote!((#rust, #serialized)));
    quote! {
        #[automatically_derived]
        impl #impl_generics #rt::macro_support::ArgsFields for #ident #ty_generics #where_clause {
            const FIELDS: &'static [(&'static str, &'static str)] = &[#(#pairs),*];
        }
    }
}
