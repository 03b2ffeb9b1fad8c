//! Redis checks that change what every other test of a process shares, so they run in a
//! test binary of their own, after the main one and never beside it: flushing the server's
//! functions (a test running beside it would see "Function not found"), and pointing
//! `SSL_CERT_FILE` at a private CA for the whole process.

mod script_flush;
mod system_roots;
