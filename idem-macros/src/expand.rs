//! Code generation: the tool type, its `ReadTool`/`WriteTool` impl and the compile-time checks
//! the type checker owns.
//!
//! Everything generated names the runtime by an absolute path through the facade (see
//! `paths`), derives nothing from the user's serde or schemars, and spans the conversions on
//! the user's own tokens: a context that is not a context, a return type that is not a
//! `Result`, an error that does not convert into `ToolError` or a `key` field the args lack is
//! an error at that token.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, Type, Visibility};

use crate::ast::{self, ToolFn};
use crate::attr::{self, Downstream, Errors, Kind};
use crate::classify::Mode;
use crate::{fallback, items, paths, valid};

/// `#[tool(..)]` on a free fn.
pub(crate) fn tool(attr_tokens: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let parsed = attr::parse(attr_tokens.clone(), &mut errors);
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            errors.at(
                Span::call_site(),
                "`#[tool]` goes on an `async fn`, or on a `&self` method inside a `#[toolbox]` impl block",
            );
            let errors = errors.into_compile_error();
            return quote!(#item #errors);
        }
    };
    if func.sig.receiver().is_some() {
        // A method without `#[toolbox]`: report it and leave the method valid in its impl.
        crate::classify::classify(&func.sig, None, Mode::Free, &mut errors);
        let errors = errors.into_compile_error();
        return quote!(#func #errors);
    }
    // A second `#[tool]` below this one would expand again inside the generated impl, a
    // cascade of errors about code the user never wrote: report it once, here, and drop it.
    func.attrs.retain(|a| {
        let again = a.path().segments.last().is_some_and(|s| s.ident == "tool");
        if again {
            errors.spanned(
                a,
                "duplicate `#[tool]` on one fn: a fn is one tool; remove this one",
            );
        }
        !again
    });
    let tool = ToolFn::new(parsed, &func.attrs, &func.sig, Mode::Free, &mut errors);
    valid::check(&tool, &attr_tokens, &mut errors);
    valid::check_ctx_named(&tool, &func.sig, &func.block, &mut errors);
    let rt = paths::Facade::new(tool.attr.krate.clone().map(|(path, _)| path)).runtime();
    if !errors.is_empty() {
        return fallback::free_fn(&rt, &func, &tool, errors);
    }
    free_fn(&rt, &func, &tool)
}

/// The tool: `charge_card()` returns the tool value of type `charge_card`, which is what
/// `Registry::builder().tool(charge_card)` takes.
fn free_fn(rt: &TokenStream, func: &ItemFn, tool: &ToolFn) -> TokenStream {
    let ident = &func.sig.ident;
    let items = items::tool_items(func, tool, Some(signature(tool)));

    // The handler moves, unchanged, into the trait method: callable only through the trait,
    // which takes a `WriteCtx` that only the executor (or a `testing` build) can make.
    let mut handler = func.clone();
    handler.vis = Visibility::Inherited;
    handler
        .attrs
        .retain(|a| !ast::is_doc(a) && !a.path().is_ident("cfg"));
    // In its own block: an item named like a binding of `call` (a tool called `args`) would
    // shadow that binding in the whole block it is declared in.
    let bound = Ident::new("handler", Span::mixed_site());
    let call_handler = |ctx: TokenStream, args: TokenStream| {
        let args = tool.params.args.as_ref().map(|_| quote!(, #args));
        quote!(#bound(#ctx #args))
    };
    let trait_impl = tool_impl(
        rt,
        tool,
        &quote!(#ident),
        quote!(let #bound = { #handler #ident };),
        call_handler,
        quote!(),
        None,
    );
    quote! {
        #items
        #trait_impl
    }
}

/// `fn(Args) -> Ret`, the handler's types as one type (see `items::tool_items`).
fn signature(tool: &ToolFn) -> TokenStream {
    let args = &tool.params.args;
    let ret = &tool.params.ret;
    quote!(fn(#args) -> #ret)
}

/// The `ReadTool`/`WriteTool` impl for `target`.
///
/// `prelude` goes first in `call` (the free fn's handler); `invoke(ctx, args)` is the handler
/// call, given the converted context and the args binding. `setup` runs before the future is
/// made (a toolbox clones its `Arc` there).
pub(crate) fn tool_impl(
    rt: &TokenStream,
    tool: &ToolFn,
    target: &TokenStream,
    prelude: TokenStream,
    invoke: impl Fn(TokenStream, TokenStream) -> TokenStream,
    setup: TokenStream,
    receiver: Option<TokenStream>,
) -> TokenStream {
    let kind = tool.kind.unwrap_or(Kind::Write);
    let (trait_, ctx_rt, context, from) = match kind {
        Kind::Read => (
            quote!(ReadTool),
            quote!(ReadCtx),
            quote!(ReadContext),
            quote!(from_read_ctx),
        ),
        Kind::Write => (
            quote!(WriteTool),
            quote!(WriteCtx),
            quote!(WriteContext),
            quote!(from_write_ctx),
        ),
    };
    // Generated bindings are mixed-site: they never clash with the user's names (a tool
    // called `args` or `ctx` still works).
    let ctx = Ident::new("ctx", Span::mixed_site());
    let args = Ident::new("args", Span::mixed_site());

    let args_ty = match &tool.params.args {
        Some(ty) => quote!(#ty),
        None => quote!(#rt::macro_support::NoArgs),
    };
    let args_pat = match &tool.params.args {
        Some(_) => quote!(#args),
        None => quote!(_),
    };
    let ret: &Type = match &tool.params.ret {
        Some(ret) => ret,
        // Unreachable: a missing return type is an error, and errors go to the fallback.
        None => return quote!(),
    };
    let ctx_ty: &Type = match &tool.params.ctx {
        Some(ty) => ty,
        None => return quote!(),
    };
    let ret_span = ret.span();
    // Every mention of the output is spanned on the return type: when it is not a `Result`,
    // rustc reports one error there instead of one per mention.
    let output = match &tool.params.output {
        Some(ok) => quote!(#ok),
        None => quote_spanned!(ret_span=> <#ret as #rt::macro_support::HandlerReturn>::Ok),
    };
    let future = quote_spanned! {ret_span=>
        impl ::core::future::Future<
            Output = ::core::result::Result<Self::Output, #rt::tool::ToolError>,
        > + ::core::marker::Send
    };
    let convert =
        quote_spanned!(ret_span=> <#ret as #rt::macro_support::HandlerReturn>::into_tool_result);
    // Located at the return type, so an error type without `Into<ToolError>` is reported
    // there; mixed-site, so it cannot clash with a user's name.
    let handed =
        quote_spanned!(ctx_ty.span()=> <#ctx_ty as #rt::macro_support::#context>::#from(#ctx));
    let returned = Ident::new("returned", ret_span.resolved_at(Span::mixed_site()));
    let call = invoke(handed, quote!(#args));
    // The future's output is checked against `Self::Output` here; spanned on the return type
    // too, so a return type that is not a `Result` is reported there.
    let body = quote_spanned! {ret_span=>
        async move {
            let #returned = #call.await;
            #convert(#returned)
        }
    };
    let spec = spec(rt, tool);
    // The probe is spanned on the return type, like every other mention of the output: a
    // return type that is not a `Result` stays one error there. The `use` is not: one of
    // the two traits always goes unused, which would be a warning at the user's `Result`.
    let probe = quote_spanned! {ret_span=>
        (&#rt::macro_support::OutputSchemaOf::<Self::Output>::new()).output_schema()
    };
    let spec = match tool.attr.no_output_schema {
        Some(_) => spec,
        None => quote! {
            #rt::macro_support::with_output_schema(#spec, {
                #[allow(unused_imports)]
                use #rt::macro_support::{HasOutputSchema as _, NoOutputSchema as _};
                #probe
            })
        },
    };
    let key_check = key_check(tool, &args_ty);
    let read_back = read_back(rt, tool, kind, receiver, &ctx, &args, &args_pat);
    let cfgs = &tool.cfgs;

    quote! {
        #(#cfgs)*
        impl #rt::tool::#trait_ for #target {
            type Args = #args_ty;
            type Output = #output;

            fn spec(&self) -> #rt::tool::ToolSpec {
                #spec
            }

            fn call(
                &self,
                #ctx: #rt::tool::#ctx_rt,
                #args_pat: Self::Args,
            ) -> #future {
                #prelude
                #setup
                #body
            }

            #read_back
        }

        #key_check
    }
}

/// `reconcile = path`: `WriteTool::read_back` calls the user's fn (or, in a toolbox, a bare
/// name is a method of the shared state). Spanned on the path, so a fn of the wrong shape is
/// rustc's error there.
fn read_back(
    rt: &TokenStream,
    tool: &ToolFn,
    kind: Kind,
    receiver: Option<TokenStream>,
    ctx: &Ident,
    args: &Ident,
    args_pat: &TokenStream,
) -> TokenStream {
    let (Kind::Write, Some(path)) = (kind, &tool.attr.reconcile) else {
        return quote!();
    };
    let args_arg = tool.params.args.as_ref().map(|_| quote!(, #args));
    let span = path.span();
    let call = match (receiver, path.get_ident()) {
        (Some(receiver), Some(method)) => quote_spanned!(span=> #receiver.#method(#ctx #args_arg)),
        _ => quote_spanned!(span=> #path(#ctx #args_arg)),
    };
    quote! {
        fn read_back(
            &self,
            #ctx: #rt::tool::ReadBackCtx,
            #args_pat: Self::Args,
        ) -> impl ::core::future::Future<
            Output = ::core::result::Result<#rt::tool::ReadBack, #rt::tool::ToolError>,
        > + ::core::marker::Send {
            #call
        }
    }
}

/// The `ToolSpec` expression.
fn spec(rt: &TokenStream, tool: &ToolFn) -> TokenStream {
    let name = &tool.name;
    let description = &tool.description;
    let mut spec = quote!(#rt::tool::ToolSpec::new(#name).description(#description));
    let duration = |millis: u64| quote!(::core::time::Duration::from_millis(#millis));
    if let Some(timeout) = &tool.attr.timeout {
        let d = duration(timeout.millis);
        spec.extend(quote!(.timeout(#d)));
    }
    if let Some((downstream, _)) = tool.attr.downstream {
        let variant = match downstream {
            Downstream::Keyed => quote!(Keyed),
            Downstream::Unkeyed => quote!(Unkeyed),
        };
        spec.extend(quote!(.downstream(#rt::tool::Downstream::#variant)));
    }
    if let Some(window) = &tool.attr.window {
        let d = duration(window.millis);
        spec.extend(quote!(.window(#d)));
    }
    if let Some(lease) = &tool.attr.lease {
        let d = duration(lease.millis);
        spec.extend(quote!(.lease(#d)));
    }
    if tool.attr.destructive.is_some() {
        spec.extend(quote!(.destructive(true)));
    }
    if let Some(in_flight) = &tool.attr.in_flight {
        let d = duration(in_flight.millis);
        spec.extend(quote!(.in_flight_bound(#d)));
    }
    if let Some(key_name) = &tool.attr.key_name {
        spec.extend(quote!(.key_name(#key_name)));
    }
    let Some(args) = &tool.params.args else {
        return spec;
    };
    let mut probed = false;
    for (opt, method) in [
        (&tool.attr.key, quote!(key_fields)),
        (&tool.attr.exclude, quote!(exclude_fields)),
    ] {
        let Some(opt) = opt else { continue };
        // `key(customer_id)` names the Rust field; the key reads the property serde writes
        // (`customerId` under `rename_all`), which an `#[idem::args]` type reports. A JSON
        // Pointer names the serialized value already.
        let names = opt.items.iter().map(|item| match item {
            attr::PathItem::Field(f) => {
                use syn::ext::IdentExt;
                probed = true;
                let name = f.unraw().to_string();
                quote!((&#rt::macro_support::KeyName::<#args>::new()).key_name(#name))
            }
            attr::PathItem::Pointer(lit) => quote!(#lit),
        });
        let names: Vec<_> = names.collect();
        spec.extend(quote!(.#method([#(#names),*])));
    }
    if probed {
        return quote!({
            use #rt::macro_support::{ByArgsFields as _, ByFieldName as _};
            #spec
        });
    }
    spec
}

/// `key(customer)` and `exclude(memo)`: a field access per named field, spanned on the name, so
/// a field the args lack is rustc's own "no field `nope` on type `ChargeArgs`" at `nope`. Never called.
fn key_check(tool: &ToolFn, args_ty: &TokenStream) -> TokenStream {
    let fields: Vec<&Ident> = [&tool.attr.key, &tool.attr.exclude]
        .into_iter()
        .flatten()
        .flat_map(attr::PathsOpt::fields)
        .collect();
    if fields.is_empty() || tool.params.args.is_none() {
        return quote!();
    }
    let args = Ident::new("args", Span::mixed_site());
    let check = format_ident!(
        "__idem_key_fields_of_{}",
        tool.ident,
        span = Span::mixed_site()
    );
    let accesses = fields
        .into_iter()
        .map(|field| quote_spanned!(field.span()=> let _ = &#args.#field;));
    let cfgs = &tool.cfgs;
    quote! {
        #(#cfgs)*
        const _: () = {
            #[allow(dead_code, non_snake_case)]
            fn #check(#args: #args_ty) {
                #(#accesses)*
            }
        };
    }
}
