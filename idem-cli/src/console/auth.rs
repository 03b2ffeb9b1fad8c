//! Who may use the console: the holder of its token. Every request carries it (a cookie the
//! first visit's `?token=` sets, or `Authorization: Bearer`), and every decision carries a
//! CSRF token that only a page the console served holds.

use sha2::{Digest, Sha256};

/// The console's secrets: the digest of its access token and the CSRF token its forms carry.
pub(crate) struct Auth {
    token: [u8; 32],
    csrf: String,
    cookie: String,
}

/// The characters a token may hold: they go into a cookie and a URL unescaped.
fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~')
}

/// The shortest token accepted: a guessable one would open the store to anyone on the host.
const MIN_TOKEN_LEN: usize = 16;

/// A fresh token: 32 random bytes from the operating system, in hex.
pub(crate) fn generate_token() -> Result<String, String> {
    random_hex().map_err(|e| format!("cannot generate a console token: {e}"))
}

fn random_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Equal digests, compared without an early exit: the time taken says nothing about how
/// much of a guess was right.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// The secrets for `token` (checked: at least 16 characters of `A-Z a-z 0-9 - _ . ~`),
    /// with a CSRF token derived from a secret of this start, so it changes on every start.
    /// `port` names the cookie, so consoles on other ports of the host keep theirs.
    pub(crate) fn new(token: &str, port: u16) -> Result<Auth, String> {
        if token.chars().count() < MIN_TOKEN_LEN || !token.chars().all(token_char) {
            return Err(format!(
                "the console token must be at least {MIN_TOKEN_LEN} characters of A-Z, a-z, \
                 0-9, '-', '_', '.' and '~'"
            ));
        }
        let secret = random_hex().map_err(|e| format!("cannot generate a CSRF secret: {e}"))?;
        let csrf = hex(&Sha256::digest(
            format!("idem console csrf\0{secret}\0{token}").as_bytes(),
        ));
        Ok(Auth {
            token: digest(token),
            csrf,
            cookie: format!("idem_console_{port}"),
        })
    }

    /// True when `given` is the token.
    pub(crate) fn accepts(&self, given: &str) -> bool {
        same(&digest(given), &self.token)
    }

    /// The CSRF token the console's forms carry.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// True when `given` is the CSRF token.
    pub(crate) fn csrf_matches(&self, given: &str) -> bool {
        same(&digest(given), &digest(&self.csrf))
    }

    /// The `Set-Cookie` value that keeps `token` for this browser session: not readable by
    /// scripts, and never sent with a request another site starts.
    pub(crate) fn set_cookie(&self, token: &str) -> String {
        format!("{}={token}; HttpOnly; SameSite=Strict; Path=/", self.cookie)
    }

    /// The token in a `Cookie` header, if it holds this console's cookie.
    pub(crate) fn token_in_cookies<'a>(&self, header: &'a str) -> Option<&'a str> {
        header.split(';').find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == self.cookie).then_some(value)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_csrf() {
        let t = generate_token().unwrap();
        assert_eq!(t.len(), 64);
        let a = Auth::new(&t, 8087).unwrap();
        assert!(a.accepts(&t));
        assert!(!a.accepts(&t[1..]));
        assert!(!a.accepts(""));
        assert!(a.csrf_matches(a.csrf()));
        assert!(!a.csrf_matches(""));
        let b = Auth::new(&t, 8087).unwrap();
        assert_ne!(a.csrf(), b.csrf(), "a new secret on every start");
        for bad in [
            "short",
            "has spaces in it, long enough",
            "semi;colon-long-enough-x",
        ] {
            assert!(Auth::new(bad, 1).is_err(), "{bad}");
        }
        let header = format!("a=b; idem_console_8087={t}; c=d");
        assert_eq!(a.token_in_cookies(&header), Some(t.as_str()));
        assert_eq!(a.token_in_cookies("idem_console_8088=x"), None);
    }
}
