//! The `idem` operator CLI, run as a binary against real stores: a person lists, shows,
//! resolves and reconciles records, copies them between stores, pages through long lists;
//! store URLs and options are parsed as documented, and nothing a record holds can drive
//! the operator's terminal.

mod copy;
mod escalation_evidence;
mod escalations_on_every_store;
mod list_pages;
mod reconcile_every_record;
mod release_bound;
mod resolve_evidence;
mod resolve_on_every_store;
mod store_options;
mod store_urls;
mod support;
mod terminal_escapes;
