//! Checks the grammar cannot make: the tool name, options that only writes take, a `key`
//! without args. Each error points at the token to change.

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::ast::ToolFn;
use crate::attr::{Downstream, Errors, Kind};

/// Runs every check on `tool`, adding to `errors`. `attr` is the attribute (or its
/// arguments), for errors about something missing from it.
pub(crate) fn check(tool: &ToolFn, attr: &dyn ToTokens, errors: &mut Errors) {
    check_name(tool, errors);
    if tool.attr.kind_conflict {
        return;
    }
    match tool.kind {
        None => spanned_or_call_site(
            errors,
            attr.to_token_stream(),
            "say whether the tool changes anything: `#[tool(read)]` for a tool without effects, `#[tool(write)]` for one with an effect (it gets an idempotency key)",
        ),
        Some(Kind::Read) => {
            for (option, span) in tool.attr.write_only() {
                errors.at(
                    span,
                    format!(
                        "`{option}` applies to write tools only; a read tool has no effect and no idempotency key. Use `#[tool(write, …)]` if the tool changes something"
                    ),
                );
            }
        }
        Some(Kind::Write) => {
            if let (Some(key), None) = (&tool.attr.key, &tool.params.args) {
                errors.at(
                    key.span,
                    "`key(…)` names fields of the args, but this handler takes no args parameter",
                );
            }
            if let (Some(exclude), None) = (&tool.attr.exclude, &tool.params.args) {
                errors.at(
                    exclude.span,
                    "`exclude(…)` names fields of the args, but this handler takes no args parameter",
                );
            }
            if let Some(lit) = &tool.attr.key_name {
                if let Some(problem) = name_problem(&lit.value(), "key names") {
                    errors.at(lit.span(), format!("key name {problem}"));
                }
            }
            let keyed = matches!(tool.attr.downstream, Some((Downstream::Keyed, _)));
            if let (Some(lit), false) = (&tool.attr.key_travels, keyed) {
                errors.at(
                    lit.span(),
                    "`key_travels` is for a `downstream = \"keyed\"` tool whose handler hands the key on without naming its context; this tool's downstream is not keyed",
                );
            }
        }
    }
}

/// A `downstream = "keyed"` write is safe to retry only if the downstream sees the key: a
/// handler that never names its context cannot be passing `ctx.key()`. Any mention of the
/// binding in the body counts (inside macro calls too): the check catches the handler that
/// forgot, not one that passes the key through a helper. `key_travels = "…"` opts out.
pub(crate) fn check_ctx_named(
    tool: &ToolFn,
    sig: &syn::Signature,
    body: &syn::Block,
    errors: &mut Errors,
) {
    let keyed = matches!(tool.attr.downstream, Some((Downstream::Keyed, _)));
    if tool.kind != Some(Kind::Write) || !keyed || tool.attr.key_travels.is_some() {
        return;
    }
    let Some(pat) = sig.inputs.iter().find_map(|arg| match arg {
        syn::FnArg::Typed(pat) => Some(&pat.pat),
        syn::FnArg::Receiver(_) => None,
    }) else {
        return;
    };
    let fix = "pass `ctx.key()` downstream (e.g. as its `Idempotency-Key` header), or the downstream cannot tell a retry from a new request; if the key reaches it another way, say how with `key_travels = \"…\"`";
    match &**pat {
        syn::Pat::Wild(wild) => errors.spanned(
            wild,
            format!("this `downstream = \"keyed\"` tool ignores its context, which carries the idempotency key: name it and {fix}"),
        ),
        syn::Pat::Ident(binding) => {
            let name = binding.ident.to_string();
            if name.starts_with('_') {
                errors.at(
                    binding.ident.span(),
                    format!("the context `{name}` of this `downstream = \"keyed\"` tool is marked unused, but it carries the idempotency key: {fix}"),
                );
            } else if !mentions(body.to_token_stream(), &binding.ident) {
                errors.at(
                    binding.ident.span(),
                    format!("this `downstream = \"keyed\"` tool never uses its context `{name}`, which carries the idempotency key: {fix}"),
                );
            }
        }
        _ => {}
    }
}

/// Whether `ident` occurs anywhere in `tokens`, groups (and so macro calls) included.
fn mentions(tokens: TokenStream, ident: &syn::Ident) -> bool {
    tokens.into_iter().any(|tree| match tree {
        proc_macro2::TokenTree::Ident(i) => i == *ident,
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}

fn spanned_or_call_site(errors: &mut Errors, tokens: TokenStream, message: &str) {
    if tokens.is_empty() {
        errors.at(proc_macro2::Span::call_site(), message);
    } else {
        errors.spanned(tokens, message);
    }
}

/// The longest tool name.
const MAX_NAME_LEN: usize = 64;

/// 1–64 characters of `[A-Za-z0-9_-]`: what OpenAI, Anthropic and MCP clients all accept.
/// `ToolSpec::validate_name` holds the same rule; `tests/macro_rules.rs` pins the two equal.
fn check_name(tool: &ToolFn, errors: &mut Errors) {
    let name = &tool.name;
    let from_fn = tool.attr.name.is_none();
    let fix = if from_fn {
        "; set a valid one with `name = \"…\"`"
    } else {
        ""
    };
    if let Some(problem) = name_problem(name, "tool names") {
        errors.at(tool.name_span, format!("tool name {problem}{fix}"));
    }
}

/// What is wrong with a tool (or key) name, if anything.
fn name_problem(name: &str, plural: &str) -> Option<String> {
    // The character set first: past it, characters and bytes are the same count.
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        Some(format!(
            "`{name}` contains {c:?}; {plural} use only A-Z, a-z, 0-9, `_` and `-`"
        ))
    } else if name.is_empty() || name.len() > MAX_NAME_LEN {
        Some(format!(
            "`{name}` has {} characters; it must have 1 to {MAX_NAME_LEN}",
            name.len()
        ))
    } else {
        None
    }
}
