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
     `no_output_schema`, `crate = \"::idem\"` (a renamed dependency), and for write tools \
     `key(field, \"/json/pointer\", …)`, `exclude(field, \"/json/pointer\", …)`, `key_name = \"…\"`, \
     `downstream = \"keyed\" | \"unkeyed\"`, `key_travels = \"…\"`, `window = \"23h\"`, `lease = \"1m\"`, \
     `destructive`, `reconcile = path::to_read_back`, `in_flight = \"2m\"`";

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

/// One part of the args named by `key(…)` or `exclude(…)`.
#[derive(Clone)]
pub(crate) enum PathItem {
    /// A field of the args type, by its Rust name.
    Field(Ident),
    /// A JSON Pointer into the serialized args, checked well-formed.
    Pointer(LitStr),
}

impl PathItem {
    /// What the item names, for duplicates: a field's name, a one-step pointer's member, a
    /// deeper pointer's text.
    fn identity(&self) -> String {
        match self {
            PathItem::Field(ident) => ident.unraw().to_string(),
            PathItem::Pointer(lit) => {
                let text = lit.value();
                match unescape_pointer(&text).ok().as_deref() {
                    Some([only]) if !only.starts_with('/') => only.clone(),
                    _ => text,
                }
            }
        }
    }
}

impl syn::parse::Parse for PathItem {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        if input.peek(LitStr) {
            input.parse().map(PathItem::Pointer)
        } else {
            input.parse().map(PathItem::Field)
        }
    }
}

/// The reference tokens of a JSON Pointer (RFC 6901), or why it is not one.
fn unescape_pointer(text: &str) -> Result<Vec<String>, String> {
    let Some(rest) = text.strip_prefix('/') else {
        return Err(format!(
            "`\"{text}\"` is not a JSON Pointer: a quoted path begins with `/`, e.g. `\"/{text}\"` (or name a field of the args without quotes)"
        ));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::new();
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => {
                        return Err(format!(
                            "`\"{text}\"` is not a JSON Pointer: `~` must be followed by `0` (for `~`) or `1` (for `/`)"
                        ))
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

/// `key(field, "/pointer", …)` or `exclude(…)`.
#[derive(Clone)]
pub(crate) struct PathsOpt {
    /// The option's token.
    pub(crate) span: Span,
    pub(crate) items: Vec<PathItem>,
}

impl PathsOpt {
    /// The fields named by their Rust name.
    pub(crate) fn fields(&self) -> impl Iterator<Item = &Ident> {
        self.items.iter().filter_map(|i| match i {
            PathItem::Field(ident) => Some(ident),
            PathItem::Pointer(_) => None,
        })
    }
}

/// The parsed `#[tool(..)]` attribute.
#[derive(Clone, Default)]
pub(crate) struct ToolAttr {
    pub(crate) kind: Option<(Kind, Span)>,
    pub(crate) name: Option<LitStr>,
    pub(crate) description: Option<LitStr>,
    pub(crate) timeout: Option<DurationOpt>,
    pub(crate) key: Option<PathsOpt>,
    /// `exclude(…)`: parts of the args left out of the fingerprint and the key.
    pub(crate) exclude: Option<PathsOpt>,
    /// `key_name = "…"`: the name keys are derived under instead of the tool's.
    pub(crate) key_name: Option<LitStr>,
    /// `key_travels = "…"`: a keyed handler that hands the key on some other way than
    /// through its context binding (the text says how).
    pub(crate) key_travels: Option<LitStr>,
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
        if let Some(exclude) = &self.exclude {
            found.push(("exclude", exclude.span));
        }
        if let Some(lit) = &self.key_name {
            found.push(("key_name", lit.span()));
        }
        if let Some(lit) = &self.key_travels {
            found.push(("key_travels", lit.span()));
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
        "name" | "description" | "key_name" | "key_travels" => {
            let Some(lit) = string_value(&meta, &name, "\"…\"", errors) else {
                return;
            };
            if name == "key_travels" && lit.value().trim().is_empty() {
                errors.at(
                    lit.span(),
                    "`key_travels`: say how the key reaches the downstream, e.g. `key_travels = \"the client's middleware sets the Idempotency-Key header from the task-local key\"`",
                );
                return;
            }
            let slot = match name.as_str() {
                "name" => &mut attr.name,
                "description" => &mut attr.description,
                "key_name" => &mut attr.key_name,
                _ => &mut attr.key_travels,
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
        "key" | "exclude" => {
            let (example, empty) = if name == "key" {
                (
                    "expected `key(field, …)`: the fields of the args (or JSON Pointers into them, `key(\"/customer/id\")`) whose values identify the operation",
                    "`key()` names no field; name the fields that identify the operation, or remove `key` to use the whole arguments",
                )
            } else {
                (
                    "expected `exclude(field, …)`: the fields of the args (or JSON Pointers into them, `exclude(\"/note/text\")`) that do not change the operation",
                    "`exclude()` names no field; name the fields to leave out of the fingerprint, or remove `exclude`",
                )
            };
            let Meta::List(list) = &meta else {
                errors.spanned(&meta, example);
                return;
            };
            let items = match list
                .parse_args_with(Punctuated::<PathItem, Token![,]>::parse_terminated)
            {
                Ok(items) => items.into_iter().collect::<Vec<_>>(),
                Err(e) => {
                    errors.push(syn::Error::new(
                            e.span(),
                            format!(
                                "expected field names or JSON Pointers: `{name}(customer, \"/invoice/id\")`"
                            ),
                        ));
                    return;
                }
            };
            if items.is_empty() {
                errors.at(list.delimiter.span().join(), empty);
                return;
            }
            let mut seen: Vec<String> = Vec::new();
            for item in &items {
                if let PathItem::Pointer(lit) = item {
                    if let Err(message) = unescape_pointer(&lit.value()) {
                        errors.at(lit.span(), message);
                        continue;
                    }
                }
                let identity = item.identity();
                if seen.contains(&identity) {
                    let at = match item {
                        PathItem::Field(ident) => ident.span(),
                        PathItem::Pointer(lit) => lit.span(),
                    };
                    errors.at(at, format!("duplicate {name} field `{identity}`"));
                }
                seen.push(identity);
            }
            let slot = if name == "key" {
                &mut attr.key
            } else {
                &mut attr.exclude
            };
            set_once(slot, PathsOpt { span, items }, &name, span, errors);
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
