//! Where generated code finds the runtime: always an absolute path through the facade's hidden
//! module. The facade is `::idem` (the library name of the `idem-rs` package), unless the
//! macro says otherwise with `crate = "…"`, as serde's `#[serde(crate = "…")]` does: a crate
//! that renames the dependency (`idem2 = { package = "idem-rs" }`) writes
//! `#[tool(write, crate = "::idem2")]`. The macros read no manifest: what a build of the
//! user's crate means never depends on a file the compiler does not track.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, Meta, Token};

/// What `crate = …` takes, for the error messages.
pub(crate) const CRATE_OPTION: &str = "`crate = \"::idem\"` (the path of the idem crate, \
     for a crate that renames the `idem-rs` dependency)";

/// The facade of one macro invocation: `::idem`, or the path its `crate = "…"` gave.
#[derive(Clone)]
pub(crate) struct Facade(Option<syn::Path>);

impl Facade {
    /// `::idem`, or `path` when the invocation gave one.
    pub(crate) fn new(path: Option<syn::Path>) -> Facade {
        Facade(path)
    }

    /// The absolute path of the facade, e.g. `::idem` (or `::idem2` when told so).
    pub(crate) fn path(&self) -> TokenStream {
        match &self.0 {
            Some(path) => path.to_token_stream(),
            None => quote!(::idem),
        }
    }

    /// [`Facade::path`] as text, for attributes that take a path in a string
    /// (`#[serde(crate = "…")]`).
    pub(crate) fn string(&self) -> String {
        self.path().to_string().replace(' ', "")
    }

    /// The absolute path of the runtime, e.g. `::idem::__private::idem_runtime`.
    pub(crate) fn runtime(&self) -> TokenStream {
        let facade = self.path();
        quote!(#facade::__private::idem_runtime)
    }
}

/// The options of a macro whose only option is `crate = "…"` (`#[toolbox]`, `#[args]`): the
/// path, if given, and an error spanned on each other option (`expected` says what to do).
pub(crate) fn only_crate_option(
    tokens: TokenStream,
    expected: &str,
) -> (Option<syn::Path>, Vec<syn::Error>) {
    let mut errors = Vec::new();
    if tokens.is_empty() {
        return (None, errors);
    }
    let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens.clone()) {
        Ok(metas) => metas,
        Err(_) => {
            errors.push(syn::Error::new(tokens.span(), expected));
            return (None, errors);
        }
    };
    let mut found = None;
    for meta in metas {
        if !meta.path().is_ident("crate") {
            errors.push(syn::Error::new_spanned(&meta, expected));
        } else if found.is_some() {
            errors.push(syn::Error::new_spanned(meta.path(), "duplicate `crate`"));
        } else {
            match crate_option(&meta) {
                Ok(path) => found = Some(path),
                Err(e) => errors.push(e),
            }
        }
    }
    (found, errors)
}

/// The path of `crate = "::idem2"`; `Err` with a spanned message for any other form.
pub(crate) fn crate_option(meta: &Meta) -> Result<syn::Path, syn::Error> {
    let expected = || format!("expected {CRATE_OPTION}");
    let Meta::NameValue(nv) = meta else {
        return Err(syn::Error::new_spanned(meta, expected()));
    };
    let Expr::Lit(ExprLit {
        lit: Lit::Str(lit), ..
    }) = &nv.value
    else {
        return Err(syn::Error::new_spanned(&nv.value, expected()));
    };
    match lit.parse::<syn::Path>() {
        Ok(path) => Ok(path),
        Err(_) => Err(syn::Error::new(
            lit.span(),
            format!("`crate = {}` is not a path; {}", lit.token(), expected()),
        )),
    }
}
