//! `#[toolbox]`: tools that share state, as `&self` methods of one inherent impl block.
//!
//! The methods stay as written (callable directly, with a `WriteCtx` only the executor can
//! make). Per `#[tool]` method the expansion adds a private type holding an `Arc` of the
//! state, its tool impl, and one `Toolbox` impl listing them all.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::visit_mut::{self, VisitMut};
use syn::{Attribute, ImplItem, ItemImpl, Meta};

use crate::ast::ToolFn;
use crate::attr::{self, Errors, Kind};
use crate::classify::Mode;
use crate::{expand, fallback, paths, valid};

/// `#[toolbox]` on an impl block.
pub(crate) fn toolbox(attr_tokens: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let (krate, option_errors) = paths::only_crate_option(attr_tokens, TOOLBOX_OPTIONS);
    option_errors.into_iter().for_each(|e| errors.push(e));
    let facade = paths::Facade::new(krate);
    let mut imp: ItemImpl = match syn::parse2(item.clone()) {
        Ok(imp) => imp,
        Err(_) => {
            errors.at(
                Span::call_site(),
                "`#[toolbox]` goes on an inherent impl block: `#[toolbox] impl MyState { … }`",
            );
            let errors = errors.into_compile_error();
            return quote!(#item #errors);
        }
    };
    if let Some((path, _)) = &imp.trait_ {
        errors.spanned(
            path,
            "`#[toolbox]` goes on an inherent impl block (`impl MyState { … }`), not on a trait impl",
        );
    }
    if !imp.generics.params.is_empty() {
        errors.spanned(
            &imp.generics,
            "`#[toolbox]` does not support generic impl blocks: write it for a concrete type, e.g. `impl Billing<Stripe>`, and wrap the generic state in it",
        );
    }

    let mut tools = Vec::new();
    for item in &mut imp.items {
        let ImplItem::Fn(method) = item else { continue };
        let Some((attr_tokens, attr)) = take_tool_attr(&mut method.attrs, &mut errors) else {
            continue;
        };
        let parsed = attr::parse(attr_tokens, &mut errors);
        if let Some((_, span)) = &parsed.krate {
            errors.at(
                *span,
                "`crate` goes on the `#[toolbox(crate = \"…\")]`, once for all its tools",
            );
        }
        let mut tool = ToolFn::new(
            parsed,
            &method.attrs,
            &method.sig,
            Mode::Method,
            &mut errors,
        );
        // The types move into the generated holder's impl, where `Self` is the holder.
        resolve_self(&mut tool.params, &imp.self_ty);
        valid::check(&tool, &attr, &mut errors);
        valid::check_ctx_named(&tool, &method.sig, &method.block, &mut errors);
        tools.push(tool);
    }
    if tools.is_empty() && errors.is_empty() {
        errors.spanned(
            &imp.self_ty,
            "this `#[toolbox]` has no tools: mark its `&self` methods with `#[tool(read)]` or `#[tool(write)]`",
        );
    }
    check_unique_names(&tools, &mut errors);

    let rt = facade.runtime();
    if !errors.is_empty() {
        return fallback::toolbox(&rt, &imp, errors);
    }
    expand(&rt, &imp, &tools)
}

/// What `#[toolbox(..)]` takes.
const TOOLBOX_OPTIONS: &str = "`#[toolbox]` takes only `crate = \"…\"` (for a crate that renames \
     the `idem-rs` dependency); put the tools' options on each method's `#[tool(..)]`";

/// Takes the method's `#[tool(..)]` off it and returns its options. The toolbox owns these
/// attributes, as a derive owns its helper attributes: none is left for rustc to resolve, so
/// `#[tool]` needs no import inside a `#[toolbox]`, and a method never expands twice.
fn take_tool_attr(
    attrs: &mut Vec<Attribute>,
    errors: &mut Errors,
) -> Option<(TokenStream, Attribute)> {
    let mut found = None;
    attrs.retain(|attr| {
        let is_tool = attr
            .path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "tool");
        if !is_tool {
            return true;
        }
        let tokens = match &attr.meta {
            Meta::Path(_) => TokenStream::new(),
            Meta::List(list) => list.tokens.clone(),
            Meta::NameValue(nv) => {
                errors.spanned(nv, "expected `#[tool(read)]` or `#[tool(write)]`");
                TokenStream::new()
            }
        };
        if found.is_some() {
            errors.spanned(attr, "duplicate `#[tool]` on one method");
        } else {
            found = Some((tokens, attr.clone()));
        }
        false
    });
    found
}

/// Writes `Self` in the method's parameter and return types as the state type it means.
fn resolve_self(params: &mut crate::classify::Params, self_ty: &syn::Type) {
    struct Resolve<'a>(&'a syn::Type);
    impl VisitMut for Resolve<'_> {
        fn visit_type_mut(&mut self, ty: &mut syn::Type) {
            if let syn::Type::Path(p) = ty {
                if p.qself.is_none()
                    && p.path.leading_colon.is_none()
                    && p.path.segments.first().is_some_and(|s| s.ident == "Self")
                {
                    let state = self.0;
                    let rest: Vec<_> = p.path.segments.iter().skip(1).collect();
                    *ty = if rest.is_empty() {
                        state.clone()
                    } else {
                        syn::parse_quote!(<#state>::#(#rest)::*)
                    };
                    return;
                }
            }
            visit_mut::visit_type_mut(self, ty);
        }
    }
    let mut resolve = Resolve(self_ty);
    for ty in [&mut params.args, &mut params.ret, &mut params.output]
        .into_iter()
        .flatten()
    {
        resolve.visit_type_mut(ty);
    }
}

fn check_unique_names(tools: &[ToolFn], errors: &mut Errors) {
    for (i, tool) in tools.iter().enumerate() {
        if tools[..i].iter().any(|t| t.name == tool.name) {
            errors.at(
                tool.name_span,
                format!(
                    "two tools of this toolbox are named `{}`; tool names must be unique",
                    tool.name
                ),
            );
        }
    }
}

fn expand(rt: &TokenStream, imp: &ItemImpl, tools: &[ToolFn]) -> TokenStream {
    let self_ty = &imp.self_ty;
    let state = syn::Ident::new("state", Span::mixed_site());
    let tools_var = syn::Ident::new("tools", Span::mixed_site());
    let mut items = Vec::new();
    let mut registrations = Vec::new();
    for tool in tools {
        let method = &tool.ident;
        let holder = format_ident!("__IdemTool_{}", method, span = Span::mixed_site());
        let invoke = |ctx: TokenStream, args: TokenStream| {
            let args = tool.params.args.as_ref().map(|_| quote!(, #args));
            quote!(<#self_ty>::#method(&#state, #ctx #args))
        };
        let setup =
            quote!(let #state = <::std::sync::Arc<_> as ::core::clone::Clone>::clone(&self.0););
        let trait_impl = expand::tool_impl(
            rt,
            tool,
            &quote!(#holder),
            quote!(),
            invoke,
            setup,
            Some(quote!(self.0)),
        );
        let cfgs = &tool.cfgs;
        let erase = match tool.kind {
            Some(Kind::Read) => quote!(read),
            _ => quote!(write),
        };
        items.push(quote! {
            #(#cfgs)*
            #[allow(non_camel_case_types)]
            struct #holder(::std::sync::Arc<#self_ty>);

            #trait_impl
        });
        registrations.push(quote! {
            #(#cfgs)*
            #tools_var.push(#rt::tool::DynTool::#erase(#holder(<::std::sync::Arc<_> as ::core::clone::Clone>::clone(&self))));
        });
    }
    quote! {
        #imp

        const _: () = {
            #(#items)*

            impl #rt::tool::Toolbox for #self_ty {
                fn tools(
                    self: ::std::sync::Arc<Self>,
                ) -> ::std::vec::Vec<#rt::tool::DynTool> {
                    let mut #tools_var = ::std::vec::Vec::new();
                    #(#registrations)*
                    #tools_var
                }
            }
        };
    }
}
