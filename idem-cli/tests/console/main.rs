//! `idem console`, run as a binary against real stores and spoken to over a real socket
//! (plain HTTP/1.1, no browser): every request needs the token, every decision the CSRF
//! token and the console's own origin; what a record holds is escaped; the list pages and
//! filters; a release inside the in-flight bound is refused; a store it cannot reach gets a
//! page saying so. And in a real browser (headless Chromium through chromedriver): a person
//! finds an escalated record made by a real call, reads its evidence and settles it.

mod browser;
mod decisions;
mod escaping;
mod list_pages;
mod support;
mod token;
mod unreachable_store;
