//! Text from records is shown, never obeyed.
//!
//! A record's reason, its attempts' and read-backs' messages, its arguments, even its tool
//! name came from a model, a downstream or a stuck dependency. Printed raw, an ANSI escape in
//! one of them could clear the operator's screen, move the cursor over the line above
//! ("state: completed"), retitle the window or, with a bidi override, show text in another
//! order than it is stored. So every human-readable line goes through [`escape`], and JSON
//! goes through [`to_json`], which writes the same characters as `\u` escapes: the value a
//! JSON reader decodes is exactly the one stored, and the bytes on the terminal are inert.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::io;

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// True for the characters a terminal acts on or that reorder what it shows: the C0 controls
/// (newline and tab included: they would break a table's rows), DEL, the C1 controls (a
/// lone U+009B is a CSI to some terminals), the line and paragraph separators, and the
/// bidirectional marks, embeddings, overrides and isolates ("Trojan Source").
pub(crate) fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every character of [`needs_escape`] written as a visible escape (`\n`, `\r`,
/// `\t`, else `\u{1b}` style), so a person sees that it was there and the terminal does not
/// act on it. Borrowed when there is nothing to escape.
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Displays a string escaped (see [`escape`]), honouring width and alignment, so it can sit
/// in a table cell: `format!("{:<20}", Esc(&tool))`.
pub(crate) struct Esc<'a>(pub &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(self.0))
    }
}

/// Serializes `value` as JSON (pretty or compact) whose bytes hold no character of
/// [`needs_escape`]: serde_json already escapes C0; the rest are written as `\uXXXX`, which
/// every JSON reader decodes back to the same character. Exact JSON, inert on a terminal.
pub(crate) fn to_json<T: Serialize + ?Sized>(
    value: &T,
    pretty: bool,
) -> serde_json::Result<String> {
    let mut out = Vec::new();
    if pretty {
        let mut ser =
            serde_json::Serializer::with_formatter(&mut out, Inert(PrettyFormatter::new()));
        value.serialize(&mut ser)?;
    } else {
        let mut ser = serde_json::Serializer::with_formatter(&mut out, Inert(CompactFormatter));
        value.serialize(&mut ser)?;
    }
    // The serializer writes UTF-8 only (every string fragment comes from a `&str`).
    String::from_utf8(out).map_err(|e| serde_json::Error::io(io::Error::other(e)))
}

/// A JSON formatter that escapes what [`needs_escape`] flags and serde_json would leave raw;
/// layout is the wrapped formatter's.
struct Inert<F>(F);

impl<F: Formatter> Formatter for Inert<F> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|(_, c)| needs_escape(*c)) {
            writer.write_all(&rest.as_bytes()[..at])?;
            // Every flagged character is in the Basic Multilingual Plane: one \u escape.
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn end_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_key(w)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flagged_characters_become_visible_escapes() {
        assert_eq!(escape("plain ü ✓ 𝄞"), Cow::Borrowed("plain ü ✓ 𝄞"));
        assert_eq!(
            escape("a\u{1b}[2Jb\r\n\t\u{7f}\u{9b}\u{202e}\u{2066}\u{200f}\u{2028}"),
            "a\\u{1b}[2Jb\\r\\n\\t\\u{7f}\\u{9b}\\u{202e}\\u{2066}\\u{200f}\\u{2028}"
        );
        assert_eq!(format!("[{:<6}]", Esc("\u{7}x")), "[\\u{7}x]");
        assert_eq!(format!("[{:<4}]", Esc("ab")), "[ab  ]");
    }

    #[test]
    fn json_is_inert_and_decodes_to_the_same_value() {
        let every: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        let value = serde_json::json!({ "k\u{202e}": [every.clone(), "\u{85}\u{1b}[31m"] });
        for pretty in [false, true] {
            let text = to_json(&value, pretty).unwrap();
            assert!(
                !text.chars().any(|c| needs_escape(c) && c != '\n'),
                "{text:?}"
            );
            if !pretty {
                assert!(!text.contains('\n'));
            }
            let back: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, value);
        }
    }
}
