//! Which parameter is the context, which the args, and what the handler returns.
//!
//! The rule is positional: `(ctx, args)`, the args optional. The checks here catch the
//! mistakes visible in the syntax (a reference to a context, the wrong context's name, a
//! missing return type) with a precise message. They are not the last word: a type the syntax
//! cannot judge (an alias, a look-alike struct named `WriteCtx`) goes through a hidden trait in
//! the generated code, and the type checker decides (see `expand`).

use syn::{
    FnArg, GenericArgument, PathArguments, ReceiverKind, ReturnType, Safety, Signature, Type,
};

use crate::attr::{Errors, Kind};

/// Where the handler lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A free `async fn`.
    Free,
    /// A `&self` method of a `#[toolbox]` impl.
    Method,
}

/// The handler's parameters by role.
#[derive(Clone)]
pub(crate) struct Params {
    /// The context's type, as written.
    pub(crate) ctx: Option<Type>,
    /// The args type, as written; `None` for a handler without args.
    pub(crate) args: Option<Type>,
    /// The return type, as written.
    pub(crate) ret: Option<Type>,
    /// `T` when the return type is spelled `…Result<T, …>`. The generated code still asks the
    /// type checker whether the return type is a `Result` whose `Ok` is `T`; naming `T`
    /// directly only spares the user a cascade of errors when it is not.
    pub(crate) output: Option<Type>,
}

/// The context a type names syntactically (`WriteCtx`, `idem::ReadCtx`, …), if any.
fn ctx_named(ty: &Type) -> Option<Kind> {
    match ty {
        Type::Group(g) => ctx_named(&g.elem),
        Type::Paren(p) => ctx_named(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            if !last.arguments.is_none() {
                return None;
            }
            if last.ident == "WriteCtx" {
                Some(Kind::Write)
            } else if last.ident == "ReadCtx" {
                Some(Kind::Read)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn ctx_type_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Read => "ReadCtx",
        Kind::Write => "WriteCtx",
    }
}

/// Reads the signature, reporting every rule it breaks.
pub(crate) fn classify(
    sig: &Signature,
    kind: Option<Kind>,
    mode: Mode,
    errors: &mut Errors,
) -> Params {
    let name = &sig.ident;
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span,
            format!("a tool handler must be an `async fn`: write `async fn {name}(…)`"),
        );
    }
    if let Some(constness) = &sig.constness {
        errors.at(constness.span, "a tool handler cannot be `const`");
    }
    if let Safety::Unsafe(unsafety) = &sig.safety {
        errors.at(
            unsafety.span,
            "a tool handler cannot be `unsafe`: the model decides when it runs",
        );
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, "a tool handler cannot have an ABI");
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(variadic, "a tool handler cannot be variadic");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.spanned(
            &sig.generics,
            "a tool handler cannot be generic: the model's JSON is decoded into one concrete args type",
        );
    }

    let mut inputs = sig.inputs.iter().peekable();
    let receiver = match inputs.peek() {
        Some(FnArg::Receiver(r)) => {
            inputs.next();
            Some(r)
        }
        _ => None,
    };
    match (mode, receiver) {
        (Mode::Free, Some(r)) => errors.spanned(
            r,
            "a `#[tool]` method needs `#[toolbox]` on its impl block: `#[toolbox] impl MyState { … }`",
        ),
        (Mode::Method, None) => errors.at(
            sig.paren_token.span.open(),
            "a `#[toolbox]` tool is a method: take `&self` first, then the context",
        ),
        (Mode::Method, Some(r)) => {
            let shared_ref = r.mutability.is_none()
                && matches!(&r.kind, ReceiverKind::Reference(_, _, None));
            if !shared_ref {
                errors.spanned(
                    r,
                    "a `#[toolbox]` tool takes `&self`: tools of one toolbox run concurrently and share it",
                );
            }
        }
        (Mode::Free, None) => {}
    }

    let typed: Vec<_> = inputs
        .filter_map(|arg| match arg {
            FnArg::Typed(pat) => Some(pat),
            FnArg::Receiver(r) => {
                errors.spanned(r, "`self` must come first");
                None
            }
        })
        .collect();

    let expected = kind.map(ctx_type_name).unwrap_or("WriteCtx` or `ReadCtx");
    let ctx = match typed.first() {
        Some(pat) => {
            check_ctx(&pat.ty, kind, errors);
            Some((*pat.ty).clone())
        }
        None => {
            let why = match kind {
                Some(Kind::Write) => " (it carries the idempotency key)",
                _ => "",
            };
            errors.at(
                sig.paren_token.span.join(),
                format!(
                    "missing the context: a tool handler takes `ctx: {expected}` first{why}, then its args: `async fn {name}(ctx: {expected}, args: Args)`"
                ),
            );
            None
        }
    };

    let first_is_ctx = typed
        .first()
        .is_some_and(|pat| ctx_named(strip_ref(&pat.ty)).is_some());
    let args = typed.get(1).map(|pat| {
        check_args(&pat.ty, first_is_ctx, errors);
        (*pat.ty).clone()
    });
    for extra in typed.iter().skip(2) {
        errors.spanned(
            extra,
            "a tool handler takes two parameters, the context and the args: move this into the args struct",
        );
    }

    let ret = match &sig.output {
        ReturnType::Default => {
            errors.at(
                sig.paren_token.span.close(),
                "a tool handler returns a `Result`: add `-> Result<Output, ToolError>`",
            );
            None
        }
        ReturnType::Type(_, ty) => {
            if let Type::ImplTrait(_) = **ty {
                errors.spanned(
                    ty,
                    "a tool handler returns a concrete `Result<Output, ToolError>`, not `impl Trait`",
                );
            } else if surely_not_result(ty) {
                errors.spanned(
                    ty,
                    "a tool handler must return `Result<T, E>` with `T: Serialize` and `E: Into<ToolError>`: write `-> Result<Output, ToolError>`",
                );
            }
            Some((**ty).clone())
        }
    };
    let output = ret.as_ref().and_then(result_ok_type);
    if let Some(out @ Type::ImplTrait(_)) = &output {
        errors.spanned(
            out,
            "the output needs a concrete type that implements `Serialize`, not `impl Trait`: the executor saves it and replays it to repeats",
        );
    }

    Params {
        ctx,
        args,
        ret,
        output,
    }
}

/// `T` of a type spelled `Result<T, E>`, `io::Result<T>`, `anyhow::Result<T>`, ….
fn result_ok_type(ty: &Type) -> Option<Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(args) => args.args.iter().find_map(|a| match a {
            GenericArgument::Type(t) => Some(t.clone()),
            _ => None,
        }),
        _ => None,
    }
}

/// Types no alias can make a `Result`: tuples, references, arrays, primitives, `String`.
fn surely_not_result(ty: &Type) -> bool {
    const PRIMITIVES: &[&str] = &[
        "bool", "char", "str", "String", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16",
        "i32", "i64", "i128", "isize", "f32", "f64",
    ];
    match ty {
        Type::Group(g) => surely_not_result(&g.elem),
        Type::Paren(p) => surely_not_result(&p.elem),
        Type::Tuple(_)
        | Type::Reference(_)
        | Type::Array(_)
        | Type::Slice(_)
        | Type::Never(_)
        | Type::Ptr(_)
        | Type::FnPtr(_)
        | Type::TraitObject(_) => true,
        Type::Path(p) => {
            p.qself.is_none()
                && p.path.segments.len() == 1
                && PRIMITIVES
                    .iter()
                    .any(|name| p.path.segments[0].ident == name)
        }
        _ => false,
    }
}

fn check_ctx(ty: &Type, kind: Option<Kind>, errors: &mut Errors) {
    if let Type::Reference(r) = ty {
        if let Some(named) = ctx_named(&r.elem) {
            let ctx = ctx_type_name(named);
            errors.spanned(
                ty,
                format!("take the context by value: `ctx: {ctx}` (each attempt gets its own)"),
            );
            return;
        }
    }
    match (kind, ctx_named(ty)) {
        (Some(Kind::Read), Some(Kind::Write)) => errors.spanned(
            ty,
            "a read tool cannot take `WriteCtx`: it has no idempotency key. Take `ctx: ReadCtx`, or make the tool `#[tool(write)]` if it has an effect",
        ),
        (Some(Kind::Write), Some(Kind::Read)) => errors.spanned(
            ty,
            "a write tool takes `WriteCtx`, not `ReadCtx`: the `WriteCtx` carries the idempotency key to pass downstream",
        ),
        _ => {}
    }
}

fn strip_ref(ty: &Type) -> &Type {
    match ty {
        Type::Reference(r) => &r.elem,
        other => other,
    }
}

fn check_args(ty: &Type, first_is_ctx: bool, errors: &mut Errors) {
    if let Some(named) = ctx_named(strip_ref(ty)) {
        let message = if first_is_ctx {
            format!(
                "the context is taken twice: a tool handler takes one context, then its args (`args: Args`), not a second `{}`",
                ctx_type_name(named)
            )
        } else {
            format!(
                "the context comes first, then the args: swap the two parameters (`ctx: {}, args: …`)",
                ctx_type_name(named)
            )
        };
        errors.spanned(ty, message);
        return;
    }
    match ty {
        Type::Reference(_) => errors.spanned(
            ty,
            "take the args by value: `args: Args` (the handler owns the decoded arguments)",
        ),
        Type::ImplTrait(_) | Type::Infer(_) => errors.spanned(
            ty,
            "the args need a concrete type that derives `Deserialize`, `Serialize` and `JsonSchema`",
        ),
        _ => {}
    }
}
