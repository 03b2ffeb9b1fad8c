//! The grammar of `#[tool(..)]`: which options exist, their value forms, duplicates.
//!
//! Every option keeps the tokens it came from, so later stages can point at them. Errors are
//! collected, not returned at the first, so one attribute with two typos reports both.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Meta, Token};

use crate::duration;

/// Every option, in the order the "unknown option" error lists them.
const VALID: &str = "`read`, `write`, `name = \"…\"`, `description = \"…\"`, `timeout = \"30s\"`, \
     `no_output_schema`, `crate = \"::idem\"` (a renamed dependency), and for write tools `key(field, …)`, `downstream = \"keyed\" | \"unkeyed\"`, \
     `window = \"23h\"`, `lease = \"1m\"`, `destructive`, `reconcile = path::to_read_back`, \
     `in_flight = \"2m\"`";

/// The shortest lease, in milliseconds. The runtime renews a lease every third of its
/// length; below this it would lapse between renewals. `Registry::build` holds the same rule;
/// `tests/macro_rules.rs` pins the two equal.
const MIN_LEASE_MILLIS: u64 = 10;

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// A duration option: its value and the literal it came from.
#[derive(Clone, Debug)]
pub(crate) struct DurationOpt {
    pub(crate) millis: u64,
    pub(crate) span: Span,
}

/// `downstream = "keyed" | "unkeyed"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Downstream {
    Keyed,
    Unkeyed,
}

/// `key(field, …)`.
#[derive(Clone)]
pub(crate) struct KeyOpt {
    /// The `key` token.
    pub(crate) span: Span,
    pub(crate) fields: Vec<Ident>,
}

/// The parsed `#[tool(..)]` attribute.
#[derive(Clone, Default)]
pub(crate) struct ToolAttr {
    pub(crate) kind: Option<(Kind, Span)>,
    pub(crate) name: Option<LitStr>,
    pub(crate) description: Option<LitStr>,
    pub(crate) timeout: Option<DurationOpt>,
    pub(crate) key: Option<KeyOpt>,
    pub(crate) downstream: Option<(Downstream, Span)>,
    pub(crate) window: Option<DurationOpt>,
    pub(crate) lease: Option<DurationOpt>,
    pub(crate) destructive: Option<Span>,
    /// `reconcile = path`: the read-back fn (in a `#[toolbox]`, a bare name is a method).
    pub(crate) reconcile: Option<syn::Path>,
    /// `in_flight = "2m"`: how long after a send the effect may still land downstream.
    pub(crate) in_flight: Option<DurationOpt>,
    /// `no_output_schema`: no output schema even when the output type has one.
    pub(crate) no_output_schema: Option<Span>,
    /// `crate = "::idem2"`: the facade's path, for a crate that renames the dependency.
    pub(crate) krate: Option<(syn::Path, Span)>,
    /// Both `read` and `write` were given (already an error): skip checks that need the kind.
    pub(crate) kind_conflict: bool,
}

impl ToolAttr {
    /// Options only write tools take, with their spans, for the "read tool" check.
    pub(crate) fn write_only(&self) -> Vec<(&'static str, Span)> {
        let mut found = Vec::new();
        if let Some(key) = &self.key {
            found.push(("key", key.span));
        }
        if let Some((_, span)) = self.downstream {
            found.push(("downstream", span));
        }
        if let Some(window) = &self.window {
            found.push(("window", window.span));
        }
        if let Some(lease) = &self.lease {
            found.push(("lease", lease.span));
        }
        if let Some(span) = self.destructive {
            found.push(("destructive", span));
        }
        if let Some(path) = &self.reconcile {
            found.push(("reconcile", syn::spanned::Spanned::span(path)));
        }
        if let Some(in_flight) = &self.in_flight {
            found.push(("in_flight", in_flight.span));
        }
        found
    }
}

/// Collects errors; `syn::Error::combine` keeps each with its own span.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// An error spanning all of `tokens` (first to last token, also on stable).
    pub(crate) fn spanned(
        &mut self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn into_compile_error(self) -> TokenStream {
        self.0
            .map(syn::Error::into_compile_error)
            .unwrap_or_default()
    }
}

/// Parses the tokens inside `#[tool(..)]`. Returns what it could read even when it reports
/// errors, so the fallback can still emit a useful item.
pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> ToolAttr {
    let mut attr = ToolAttr::default();
    let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens) {
        Ok(metas) => metas,
        Err(e) => {
            errors.push(syn::Error::new(
                e.span(),
                format!("{e}; expected options like `#[tool(write, timeout = \"30s\")]`"),
            ));
            return attr;
        }
    };
    for meta in metas {
        option(&mut attr, meta, errors);
    }
    attr
}

fn option(attr: &mut ToolAttr, meta: Meta, errors: &mut Errors) {
    let Some(ident) = meta.path().get_ident().map(IdentExt::unraw) else {
        errors.spanned(
            meta.path(),
            format!("unknown option; valid options are {VALID}"),
        );
        return;
    };
    let name = ident.to_string();
    let span = ident.span();
    match name.as_str() {
        "read" | "write" => {
            if !flag(&meta, &name, errors) {
                return;
            }
            let kind = if name == "read" {
                Kind::Read
            } else {
                Kind::Write
            };
            match attr.kind {
                Some((prev, _)) if prev == kind => errors.at(span, format!("duplicate `{name}`")),
                Some(_) => {
                    errors.at(
                        span,
                        "a tool is either `read` or `write`, not both: keep `write` if the tool has an effect",
                    );
                    attr.kind_conflict = true;
                }
                None => attr.kind = Some((kind, span)),
            }
        }
        "name" | "description" => {
            let Some(lit) = string_value(&meta, &name, "\"…\"", errors) else {
                return;
            };
            let slot = if name == "name" {
                &mut attr.name
            } else {
                &mut attr.description
            };
            set_once(slot, lit, &name, span, errors);
        }
        "timeout" | "window" | "lease" | "in_flight" => {
            let example = match name.as_str() {
                "timeout" => "\"30s\"",
                "window" => "\"23h\"",
                "in_flight" => "\"2m\"",
                _ => "\"1m\"",
            };
            let Some(lit) = string_value(&meta, &name, example, errors) else {
                return;
            };
            let value = match duration::parse_millis(&lit.value()) {
                Ok(millis) if name == "lease" && millis < MIN_LEASE_MILLIS => {
                    errors.at(
                        lit.span(),
                        "`lease`: at least \"10ms\"; it is renewed every third of its length while the handler runs, and a shorter one would lapse under a live handler",
                    );
                    return;
                }
                Ok(millis) => DurationOpt {
                    millis,
                    span: lit.span(),
                },
                Err(message) => {
                    errors.at(lit.span(), format!("`{name}`: {message}"));
                    return;
                }
            };
            let slot = match name.as_str() {
                "timeout" => &mut attr.timeout,
                "window" => &mut attr.window,
                "in_flight" => &mut attr.in_flight,
                _ => &mut attr.lease,
            };
            set_once(slot, value, &name, span, errors);
        }
        "downstream" => {
            let Some(lit) = string_value(&meta, &name, "\"keyed\"", errors) else {
                return;
            };
            let value = match lit.value().as_str() {
                "keyed" => Downstream::Keyed,
                "unkeyed" => Downstream::Unkeyed,
                other => {
                    errors.at(
                        lit.span(),
                        format!(
                            "`downstream = \"{other}\"`: expected \"keyed\" (the downstream \
                             deduplicates requests by idempotency key) or \"unkeyed\" (it does not; \
                             the default)"
                        ),
                    );
                    return;
                }
            };
            set_once(&mut attr.downstream, (value, span), &name, span, errors);
        }
        "key" => {
            let Meta::List(list) = &meta else {
                errors.spanned(
                    &meta,
                    "expected `key(field, …)`: the fields of the args whose values identify the operation",
                );
                return;
            };
            let fields =
                match list.parse_args_with(Punctuated::<Ident, Token![,]>::parse_terminated) {
                    Ok(fields) => fields.into_iter().collect::<Vec<_>>(),
                    Err(e) => {
                        errors.push(syn::Error::new(
                            e.span(),
                            "expected field names: `key(customer, invoice)`",
                        ));
                        return;
                    }
                };
            if fields.is_empty() {
                errors.at(
                    list.delimiter.span().join(),
                    "`key()` names no field; name the fields that identify the operation, or remove `key` to use the whole arguments",
                );
                return;
            }
            let mut seen: Vec<String> = Vec::new();
            for field in &fields {
                let field_name = field.unraw().to_string();
                if seen.contains(&field_name) {
                    errors.at(field.span(), format!("duplicate key field `{field_name}`"));
                }
                seen.push(field_name);
            }
            set_once(&mut attr.key, KeyOpt { span, fields }, &name, span, errors);
        }
        "reconcile" => {
            let expected = "expected `reconcile = path::to_read_back`: an async fn \
                 `(ReadBackCtx, Args) -> Result<ReadBack, ToolError>` (in a `#[toolbox]`, the name of such a `&self` method)";
            let path = match &meta {
                Meta::NameValue(nv) => match &nv.value {
                    Expr::Path(p) if p.qself.is_none() => Some(p.path.clone()),
                    other => {
                        errors.spanned(other, expected);
                        None
                    }
                },
                _ => {
                    errors.spanned(&meta, expected);
                    None
                }
            };
            if let Some(path) = path {
                set_once(&mut attr.reconcile, path, &name, span, errors);
            }
        }
        "crate" => match crate::paths::crate_option(&meta) {
            Ok(path) => set_once(&mut attr.krate, (path, span), &name, span, errors),
            Err(e) => errors.push(e),
        },
        "destructive" | "no_output_schema" => {
            if flag(&meta, &name, errors) {
                let slot = if name == "destructive" {
                    &mut attr.destructive
                } else {
                    &mut attr.no_output_schema
                };
                set_once(slot, span, &name, span, errors);
            }
        }
        _ => errors.at(
            span,
            format!("unknown option `{name}`; valid options are {VALID}"),
        ),
    }
}

/// A bare word such as `write`; reports `write = …` or `write(…)`.
fn flag(meta: &Meta, name: &str, errors: &mut Errors) -> bool {
    match meta {
        Meta::Path(_) => true,
        _ => {
            errors.spanned(
                meta,
                format!("`{name}` takes no value: write just `{name}`"),
            );
            false
        }
    }
}

/// The string literal of `name = "…"`.
fn string_value(meta: &Meta, name: &str, example: &str, errors: &mut Errors) -> Option<LitStr> {
    let value = match meta {
        Meta::NameValue(nv) => &nv.value,
        _ => {
            errors.spanned(meta, format!("expected `{name} = {example}`"));
            return None;
        }
    };
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit.clone()),
        other => {
            errors.spanned(
                other,
                format!("expected a string literal: `{name} = {example}`"),
            );
            None
        }
    }
}

fn set_once<T>(slot: &mut Option<T>, value: T, name: &str, span: Span, errors: &mut Errors) {
    if slot.is_some() {
        errors.at(span, format!("duplicate `{name}`"));
    } else {
        *slot = Some(value);
    }
}
