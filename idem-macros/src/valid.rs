//! Checks the grammar cannot make: the tool name, options that only writes take, a `key`
//! without args. Each error points at the token to change.

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::ast::ToolFn;
use crate::attr::{Errors, Kind};

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
        }
    }
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
    // The character set first: past it, characters and bytes are the same count.
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        errors.at(
            tool.name_span,
            format!(
                "tool name `{name}` contains {c:?}; tool names use only A-Z, a-z, 0-9, `_` and `-`{fix}"
            ),
        );
    } else if name.is_empty() || name.len() > MAX_NAME_LEN {
        errors.at(
            tool.name_span,
            format!(
                "tool name `{name}` has {} characters; it must have 1 to {MAX_NAME_LEN}{fix}",
                name.len()
            ),
        );
    }
}
