//! What every free-fn tool has, on success and on error alike: the tool type `charge_card`,
//! its `NAME`, and `fn charge_card()` returning it. `expand` and `fallback` both emit these,
//! so they live below both.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Ident, ItemFn};

use crate::ast::{self, ToolFn};

/// The tool type (a braced struct, so it takes no name in the value namespace), its `NAME`,
/// and `fn charge_card()` returning it, with the handler's docs, visibility and lint
/// `allow`s.
///
/// `signature` is the handler's `fn(Args) -> Ret`, given only when the expansion succeeds. It
/// becomes the default of a type parameter of the tool type, so the tool type mentions the
/// handler's types. Not for the type's sake but for its trait impl: an impl is only as visible
/// as the types in its header, and `type Args = PrivateArgs` in an impl more visible than
/// `PrivateArgs` is a hard error (E0446). With the types in the header, a `pub` handler with
/// private args compiles, as a plain `pub fn` does, and is usable where its types are.
pub(crate) fn tool_items(
    func: &ItemFn,
    tool: &ToolFn,
    signature: Option<TokenStream>,
) -> TokenStream {
    let ident = &func.sig.ident;
    let vis = &func.vis;
    let docs = func.attrs.iter().filter(|a| ast::is_doc(a));
    let allows = ast::allow_attrs(&func.attrs);
    let cfgs = &tool.cfgs;
    let name = &tool.name;
    let type_doc = format!(
        " The `{name}` tool: what `{ident}()` returns and `Registry::builder().tool({ident})` registers."
    );
    let Some(signature) = signature else {
        return quote! {
            #[doc = #type_doc]
            #(#cfgs)*
            #(#allows)*
            #[allow(non_camel_case_types)]
            #[derive(::core::clone::Clone, ::core::marker::Copy, ::core::fmt::Debug)]
            #vis struct #ident {}

            #(#cfgs)*
            #(#allows)*
            impl #ident {
                /// The tool's name, as the model sees it.
                #vis const NAME: &'static str = #name;
            }

            #(#docs)*
            #(#cfgs)*
            #(#allows)*
            #[inline]
            #vis fn #ident() -> #ident {
                #ident {}
            }
        };
    };
    let param = Ident::new("__IdemHandler", Span::call_site());
    let field = Ident::new("__idem_handler", Span::call_site());
    let ident_text = ident.to_string();
    quote! {
        #[doc = #type_doc]
        #(#cfgs)*
        #(#allows)*
        #[allow(non_camel_case_types)]
        #vis struct #ident<#param = #signature> {
            #field: ::core::marker::PhantomData<#param>,
        }

        #(#cfgs)*
        #(#allows)*
        impl<#param> ::core::clone::Clone for #ident<#param> {
            #[inline]
            fn clone(&self) -> Self {
                *self
            }
        }

        #(#cfgs)*
        #(#allows)*
        impl<#param> ::core::marker::Copy for #ident<#param> {}

        #(#cfgs)*
        #(#allows)*
        impl<#param> ::core::fmt::Debug for #ident<#param> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(#ident_text)
            }
        }

        #(#cfgs)*
        #(#allows)*
        impl #ident {
            /// The tool's name, as the model sees it.
            #vis const NAME: &'static str = #name;
        }

        #(#docs)*
        #(#cfgs)*
        #(#allows)*
        #[inline]
        #vis fn #ident() -> #ident {
            #ident {
                #field: ::core::marker::PhantomData,
            }
        }
    }
}
