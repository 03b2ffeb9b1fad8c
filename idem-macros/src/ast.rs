//! The typed view of one tool handler: its options, its parameters by role, its name and
//! description. Built from the user's tokens, which it keeps for spans.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::{Attribute, Ident, Signature};

use crate::attr::{Errors, Kind, ToolAttr};
use crate::classify::{self, Mode, Params};
use crate::docs;

/// One `#[tool(..)]` handler, free fn or toolbox method.
pub(crate) struct ToolFn {
    pub(crate) attr: ToolAttr,
    /// `None` when the attribute said neither `read` nor `write` (already an error).
    pub(crate) kind: Option<Kind>,
    /// The fn's name.
    pub(crate) ident: Ident,
    /// The tool's name, as the model sees it.
    pub(crate) name: String,
    /// Where the name came from: the `name = "…"` literal or the fn's name.
    pub(crate) name_span: Span,
    pub(crate) description: String,
    pub(crate) params: Params,
    /// `#[cfg(..)]` attributes: they apply to everything generated for the tool.
    pub(crate) cfgs: Vec<Attribute>,
}

impl ToolFn {
    pub(crate) fn new(
        attr: ToolAttr,
        attrs: &[Attribute],
        sig: &Signature,
        mode: Mode,
        errors: &mut Errors,
    ) -> ToolFn {
        // With both `read` and `write` given (reported already), judge nothing by the kind.
        let kind = attr
            .kind
            .filter(|_| !attr.kind_conflict)
            .map(|(kind, _)| kind);
        let params = classify::classify(sig, kind, mode, errors);
        let (name, name_span) = match &attr.name {
            Some(lit) => (lit.value(), lit.span()),
            None => (sig.ident.unraw().to_string(), sig.ident.span()),
        };
        let description = match &attr.description {
            Some(lit) => lit.value(),
            None => {
                if let Some(unread) = docs::unreadable_doc(attrs) {
                    // Skipping it would hand the model an empty or partial description.
                    errors.spanned(
                        unread,
                        "this doc is not a string literal, so `#[tool]` cannot read it as the tool's description: give the description with `#[tool(…, description = \"…\")]`",
                    );
                }
                docs::fold(&docs::doc_lines(attrs))
            }
        };
        ToolFn {
            kind,
            ident: sig.ident.clone(),
            name,
            name_span,
            description,
            params,
            cfgs: cfg_attrs(attrs),
            attr,
        }
    }
}

/// The `#[cfg]` attributes among `attrs`.
pub(crate) fn cfg_attrs(attrs: &[Attribute]) -> Vec<Attribute> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .cloned()
        .collect()
}

/// The `#[allow(..)]` attributes among `attrs`: a lint the user allows on the handler is
/// allowed on what is generated from it too (a plain fn's `#[allow(private_interfaces)]`).
pub(crate) fn allow_attrs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("allow"))
        .collect()
}

/// Whether an attribute is documentation.
pub(crate) fn is_doc(attr: &Attribute) -> bool {
    attr.path().is_ident("doc")
}
