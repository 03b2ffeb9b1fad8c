//! Expansion snapshots: what `#[tool]` and `#[toolbox]` generate, pretty-printed, so a reviewer
//! reads the generated code in a diff. Update with `INSTA_UPDATE=always cargo test -p
//! idem-macros`, then review the `.snap` files.

use proc_macro2::TokenStream;
use quote::quote;

fn pretty(tokens: TokenStream) -> String {
    match syn::parse2::<syn::File>(tokens.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(e) => format!("/* does not parse as a file: {e} */\n{tokens}"),
    }
}

#[test]
fn read_tool() {
    let out = crate::expand::tool(
        quote!(read, timeout = "5s"),
        quote! {
            /// List a customer's charges.
            pub async fn list_charges(ctx: ReadCtx, args: ListArgs) -> Result<Vec<Charge>, ToolError> {
                billing::list(ctx.run_id(), &args.customer).await
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn read_tool_without_output_schema() {
    let out = crate::expand::tool(
        quote!(read, no_output_schema),
        quote! {
            /// Count a customer's charges.
            async fn count_charges(ctx: ReadCtx) -> Result<Count, ToolError> {
                billing::count(ctx.run_id()).await
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn write_tool() {
    let out = crate::expand::tool(
        quote!(
            write,
            key(customer, invoice),
            downstream = "keyed",
            window = "23h",
            destructive
        ),
        quote! {
            /// Charge a customer's card
            /// for one invoice.
            async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, BillingError> {
                billing::charge(&args, ctx.key().as_str()).await
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn write_tool_with_pointers_exclusions_and_a_key_name() {
    let out = crate::expand::tool(
        quote!(
            write,
            name = "charge_card",
            key_name = "charge",
            key("/customer/id", invoice),
            exclude(memo, "/note/text")
        ),
        quote! {
            /// Charge a customer's card.
            async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, BillingError> {
                billing::charge(&args, ctx.key().as_str()).await
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn toolbox() {
    let out = crate::toolbox::toolbox(
        quote!(),
        quote! {
            impl Billing {
                /// Refund a charge.
                #[tool(write, key(charge))]
                async fn refund(&self, ctx: WriteCtx, args: RefundArgs) -> Result<Refund, ToolError> {
                    self.client.refund(&args.charge, ctx.key().as_str()).await
                }
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}

#[test]
fn error_keeps_the_item() {
    let out = crate::expand::tool(
        quote!(write, timeout = "soon"),
        quote! {
            /// Charge.
            async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, ToolError> {
                todo!()
            }
        },
    );
    insta::assert_snapshot!(pretty(out));
}
