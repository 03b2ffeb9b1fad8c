//! The store's Lua code on the server (`script.lua`): a Redis Function library, loaded once
//! per server with `FUNCTION LOAD` and called with `FCALL` (Redis ≥ 7), or, on a Redis
//! without `FUNCTION`, the same code run as a script with `EVALSHA`.
//!
//! Why a library: a script's body runs on every `EVALSHA`, so every call re-created the
//! code's ~40 local functions and tables before doing its work; a library's body runs once,
//! when it is loaded, and a call runs only `main`.
//!
//! The library and its one function are named `idem_` and a hash of the code, so two idem
//! versions sharing one server each load and call their own code, never each other's; an
//! older version's library stays on the server, unused once no worker runs that version
//! (`FUNCTION DELETE` it at leisure).

use std::sync::LazyLock;

use ::redis::{cmd, Cmd, RedisError, Script, Value};
use idem_runtime::store::StoreError;

use crate::codec::map_err;
use crate::connection::Conn;
use sha2::{Digest, Sha256};

/// The code as written, with `IDEM_LIBRARY` where its name goes.
const TEMPLATE: &str = include_str!("script.lua");

/// The placeholder for the library's (and its function's) name in [`TEMPLATE`].
const PLACEHOLDER: &str = "IDEM_LIBRARY";

/// This build's code, ready to load or run.
pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| Library::new(TEMPLATE));

/// The store's code in both forms: a Function library and a script.
pub(super) struct Library {
    /// The library's and its function's name: `idem_` and 16 hex digits of the code's hash.
    name: String,
    /// The library's source, for `FUNCTION LOAD`.
    code: String,
    /// The same code as a script whose every run calls `main` (Redis < 7).
    script: Script,
}

/// How a store calls its code on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Calls {
    /// `FCALL` of the loaded library (Redis ≥ 7).
    Function,
    /// `EVALSHA` of the script (a server without `FUNCTION`).
    Script,
}

impl Library {
    fn new(template: &str) -> Library {
        let hash = Sha256::digest(template.as_bytes());
        let name: String = std::iter::once("idem_".to_owned())
            .chain(hash.iter().take(8).map(|b| format!("{b:02x}")))
            .collect();
        let code = template.replace(PLACEHOLDER, &name);
        // The script form: the library's body (without its `#!lua` line) inside a function
        // that returns `main`, so its `local KEYS, ARGV` do not hide the script's globals,
        // and every run then calls `main` with them instead of registering it.
        let body = code
            .split_once('\n')
            .map_or("", |(_, rest)| rest)
            .rsplit_once("redis.register_function(")
            .map_or("", |(body, _)| body);
        let script = Script::new(&format!(
            "local main = (function()\n{body}\nreturn main\nend)()\nreturn main(KEYS, ARGV)\n"
        ));
        Library { name, code, script }
    }

    /// The library's and its function's name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The script form, for [`Calls::Script`].
    pub(super) fn script(&self) -> &Script {
        &self.script
    }

    /// `FUNCTION LOAD` of the library: on a cluster the client sends it to every master.
    /// A server that already holds it (its name is its code's hash, so it is this code)
    /// counts as loaded, so a fleet of workers connecting never recompiles it.
    pub(super) fn load_cmd(&self) -> Cmd {
        let mut c = cmd("FUNCTION");
        c.arg("LOAD").arg(self.code.as_str());
        c
    }

    /// `FCALL` of the library's function with `keys` and `args`.
    pub(super) fn fcall<K: AsRef<[u8]>>(&self, keys: &[K], args: &[&[u8]]) -> Cmd {
        let mut c = cmd("FCALL");
        c.arg(self.name.as_str()).arg(keys.len());
        for k in keys {
            c.arg(k.as_ref());
        }
        for a in args {
            c.arg(*a);
        }
        c
    }
}

/// True when `FUNCTION LOAD` failed only because the server (or one master) already holds
/// the library: this very code, by its name.
pub(super) fn already_loaded(e: &RedisError) -> bool {
    e.to_string().contains("already exists")
}

/// True when the server does not know `FUNCTION` (Redis < 7, or a server compatible with
/// older Redis): the store then runs its code as a script.
pub(super) fn no_functions(e: &RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unknown command") && text.contains("function")
}

/// True when the connection's ACL user may not load functions (`NOPERM … 'function|load'`)
/// while it may run scripts: the store then runs its code as a script, as it did before it
/// became a library, so an upgrade does not break on an ACL written for `EVALSHA`.
pub(super) fn functions_denied(e: &RedisError) -> bool {
    e.code() == Some("NOPERM") && e.to_string().to_ascii_lowercase().contains("function")
}

/// True when an `FCALL` found no such function: the server's functions were flushed
/// (`FUNCTION FLUSH`), or it restarted without persistence. The store loads the library
/// again and retries once, as `EVALSHA` does after `NOSCRIPT`.
pub(super) fn function_missing(e: &RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// Loads the store's Function library (on a cluster, on every master); a server that holds
/// it already counts as loaded.
pub(crate) async fn load_library(conn: &mut Conn) -> Result<(), RedisError> {
    match LIBRARY.load_cmd().query_async::<Value>(conn).await {
        Ok(_) => Ok(()),
        Err(e) if already_loaded(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Loads the script form of the code (Redis < 7).
pub(crate) async fn load_script(conn: &mut Conn) -> Result<(), StoreError> {
    LIBRARY
        .script()
        .prepare_invoke()
        .load_async(conn)
        .await
        .map(|_| ())
        .map_err(map_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name follows the code: any change to the code names another library, so two
    /// versions on one server never call each other's.
    #[test]
    fn the_name_is_the_code_hash() {
        let a = Library::new(TEMPLATE);
        let b = Library::new(&format!("{TEMPLATE}\n-- one more line\n"));
        assert_ne!(a.name(), b.name());
        assert_eq!(a.name(), LIBRARY.name());
        assert!(a.name().starts_with("idem_") && a.name().len() == 5 + 16);
        assert!(a.code.starts_with(&format!("#!lua name={}\n", a.name())));
        assert!(!a.code.contains(PLACEHOLDER));
        assert!(a
            .code
            .contains(&format!("redis.register_function('{}', main)", a.name())));
    }

    /// A server's error reply, as the client reports it.
    fn reply(raw: &str) -> RedisError {
        ::redis::parse_redis_value(format!("-{raw}\r\n").as_bytes())
            .expect("an error reply parses")
            .extract_error()
            .expect_err("an error reply is an error")
    }

    /// Which replies make the store fall back to scripts, reload, or count as loaded, as
    /// the servers word them: Redis 6.x has no FUNCTION; 7.x answers FCALL of a flushed
    /// library and a second FUNCTION LOAD of one so; an ACL may deny FUNCTION. Anything
    /// else (another unknown command) is none of these, and surfaces as an error.
    #[test]
    fn server_replies_are_told_apart() {
        let redis6 = reply(
            "ERR unknown command `FUNCTION`, with args beginning with: `LOAD`, `#!lua name=idem_0`, ",
        );
        let flushed = reply("ERR Function not found");
        let loaded = reply("ERR Library 'idem_0123456789abcdef' already exists");
        let denied =
            reply("NOPERM this user has no permissions to run the 'function|load' command");
        let other = reply("ERR unknown command `FCALL`, with args beginning with: ");
        assert!(no_functions(&redis6) && functions_denied(&denied));
        assert!(function_missing(&flushed) && already_loaded(&loaded));
        for e in [&redis6, &flushed, &loaded, &other] {
            assert!(!functions_denied(e), "{e}");
        }
        for e in [&flushed, &loaded, &denied, &other] {
            assert!(!no_functions(e), "{e}");
        }
        for e in [&redis6, &loaded, &denied, &other] {
            assert!(!function_missing(e), "{e}");
        }
        for e in [&redis6, &flushed, &denied, &other] {
            assert!(!already_loaded(e), "{e}");
        }
    }
}
