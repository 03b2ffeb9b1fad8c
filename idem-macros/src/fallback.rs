//! On a macro error: the errors, plus the item as close to the real expansion as the input
//! allows, so the user sees the one mistake and not a cascade (`charge_card` still exists,
//! still registers, still has its `NAME`) and the IDE keeps completing inside the handler.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{ItemFn, ItemImpl, Token, Visibility};

use crate::ast::{self, ToolFn};
use crate::attr::Errors;
use crate::items;

/// A free fn: the tool type, its `NAME` and constructor, a stub registration, and the handler
/// itself (made `async` if it was not, so its `.await`s do not add errors) where it is
/// type-checked but unused. The tool type does not name the handler's types: they may be what
/// the error is about.
pub(crate) fn free_fn(
    rt: &TokenStream,
    func: &ItemFn,
    tool: &ToolFn,
    errors: Errors,
) -> TokenStream {
    let ident = &func.sig.ident;
    let items = items::tool_items(func, tool, None);
    let cfgs = &tool.cfgs;
    let mut handler = func.clone();
    handler.vis = Visibility::Inherited;
    handler.attrs.retain(|a| !ast::is_doc(a));
    handler.sig.asyncness = Some(<Token![async]>::default());
    handler.sig.constness = None;
    let errors = errors.into_compile_error();
    quote! {
        #errors

        #items

        #(#cfgs)*
        impl #rt::tool::IntoDynTool<#rt::macro_support::Fallback> for #ident {
            fn into_dyn_tool(self) -> #rt::tool::DynTool {
                // Never runs: the crate does not compile while the error above stands.
                ::core::unreachable!()
            }
        }

        const _: () = {
            #[allow(dead_code, unused)]
            #handler
        };
    }
}

/// A toolbox: the impl block as written (its methods stay callable), and, when the self type
/// allows it, a stub `Toolbox` impl so `.toolbox(Arc::new(state))` does not add an error.
pub(crate) fn toolbox(rt: &TokenStream, imp: &ItemImpl, errors: Errors) -> TokenStream {
    let errors = errors.into_compile_error();
    let stub = if imp.generics.params.is_empty() {
        let self_ty = &imp.self_ty;
        quote! {
            impl #rt::tool::Toolbox for #self_ty {
                fn tools(
                    self: ::std::sync::Arc<Self>,
                ) -> ::std::vec::Vec<#rt::tool::DynTool> {
                    // Never runs: the crate does not compile while the error above stands.
                    ::core::unreachable!()
                }
            }
        }
    } else {
        quote!()
    };
    quote! {
        #errors
        #imp
        #stub
    }
}
