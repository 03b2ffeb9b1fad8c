//! `#[args]`: derives what a tool's arguments need (`Deserialize`, `Serialize`, `JsonSchema`)
//! through the facade, so users depend on `idem` alone.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;

use crate::paths;

pub(crate) fn args(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Vec::new();
    if !attr.is_empty() {
        errors.push(syn::Error::new(
            attr.span(),
            "#[args] takes no options; put serde and schemars options in their own \
             attributes, e.g. #[serde(rename_all = \"camelCase\")]",
        ));
    }
    match syn::parse2::<syn::DeriveInput>(item.clone()) {
        Ok(_) => {}
        Err(_) => errors.push(syn::Error::new(
            item.span(),
            "#[args] goes on a struct or enum: the arguments of a tool",
        )),
    }
    if let Some(first) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        let error = first.to_compile_error();
        return quote!(#error #item);
    }
    let facade = paths::facade();
    let serde_path = format!("{}::__private::serde", paths::facade_string());
    let schemars_path = format!("{}::__private::schemars", paths::facade_string());
    quote! {
        #[derive(
            #facade::__private::serde::Deserialize,
            #facade::__private::serde::Serialize,
            #facade::__private::schemars::JsonSchema
        )]
        #[serde(crate = #serde_path)]
        #[schemars(crate = #schemars_path)]
        #item
    }
}
