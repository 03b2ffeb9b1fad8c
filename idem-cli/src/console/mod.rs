//! `idem console`: the operator console, a small web application on the store the CLI opens.
//!
//! A person lists the records waiting for someone (escalated, unknown, pending), reads one
//! record's evidence, and settles it with the decisions `idem resolve` offers, through the
//! same check and the same resolve, so the console and the CLI cannot disagree.
//!
//! Safe by default: it listens on loopback unless told otherwise; every request needs the
//! token (generated and printed at start, or given), kept in an `HttpOnly`,
//! `SameSite=Strict` cookie after the first visit or sent as `Authorization: Bearer`; every
//! decision needs a CSRF token its own pages carry, and a POST from another origin is
//! refused; its log holds the method, the path and the status of each request, never an
//! argument or an output; a store it cannot reach gets a page saying so, and the console
//! tries again on the next request.

mod auth;
mod forms;
mod pages;
mod server;

use std::net::SocketAddr;

pub(crate) use server::serve;

/// How to serve the console.
pub(crate) struct Settings {
    /// Where to listen.
    pub(crate) listen: SocketAddr,
    /// The access token; `None` generates one.
    pub(crate) token: Option<String>,
    /// The name the decision forms are prefilled with.
    pub(crate) operator: Option<String>,
}
