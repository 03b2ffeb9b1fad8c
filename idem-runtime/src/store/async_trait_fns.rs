//! The method signatures `#[async_trait]` would generate, written once.
//!
//! [`IdemStore`](super::IdemStore) and the escalation sink are used as trait objects, and
//! users implement them with `#[async_trait]`, so their methods must have exactly the
//! signatures that attribute gives an `async fn`. The runtime keeps the async-trait crate out
//! of its default build by spelling them out, through this macro rather than by hand at every
//! trait, impl and method.

/// Writes each `fn name<'life1, …>(&self, arg: Type, …) -> Ret` as `#[async_trait]` would:
/// `self` borrowed for `'life0`, a lifetime `'async_trait` that `Ret` names (the future
/// borrows for it), and `'life0`, `'life1`, … and `Self` bound to outlive `'async_trait`.
/// List the lifetimes the arguments borrow for, not `'life0` or `'async_trait`. A method
/// ends with `;` (a trait's required method) or its body.
///
/// Starting with `forward to EXPR;`, every method listed (each ending with `;`) calls the
/// same method of `EXPR` with the same arguments, for a store that stands for another.
// `self` is taken from the caller (`&$this`): one the macro wrote would, by hygiene, not be
// the `self` the caller's body names.
macro_rules! async_trait_fns {
    () => {};
    (
        forward to $to:expr;
        $(
            $(#[$attr:meta])*
            fn $name:ident $(<$($life:lifetime),+>)? (&$this:ident $(, $arg:ident: $ty:ty)* $(,)?)
                -> $ret:ty;
        )*
    ) => {
        $crate::store::async_trait_fns! {
            $(
                $(#[$attr])*
                fn $name $(<$($life),+>)? (&$this $(, $arg: $ty)*) -> $ret {
                    $to.$name($($arg),*)
                }
            )*
        }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident $(<$($life:lifetime),+>)? (&$this:ident $(, $arg:ident: $ty:ty)* $(,)?)
            -> $ret:ty;
        $($rest:tt)*
    ) => {
        $(#[$attr])*
        fn $name<'life0, $($($life,)+)? 'async_trait>(&'life0 $this $(, $arg: $ty)*) -> $ret
        where
            'life0: 'async_trait,
            $($($life: 'async_trait,)+)?
            Self: 'async_trait;

        $crate::store::async_trait_fns! { $($rest)* }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident $(<$($life:lifetime),+>)? (&$this:ident $(, $arg:ident: $ty:ty)* $(,)?)
            -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$attr])*
        fn $name<'life0, $($($life,)+)? 'async_trait>(&'life0 $this $(, $arg: $ty)*) -> $ret
        where
            'life0: 'async_trait,
            $($($life: 'async_trait,)+)?
            Self: 'async_trait,
        $body

        $crate::store::async_trait_fns! { $($rest)* }
    };
}

pub(crate) use async_trait_fns;
