//! The default description: the handler's doc comment, folded for a model to read.
//!
//! Rustdoc wraps prose at ~100 columns; a model should see one line per paragraph. Line breaks
//! inside a paragraph become spaces; blank lines, list items, headings and fenced code keep
//! their own lines, since folding them would change their meaning.

use syn::{Attribute, Expr, ExprLit, Lit, Meta};

/// A doc attribute whose text a macro cannot see (`#[doc = include_str!(..)]`, a
/// `concat!`): the caller asks for `description = "…"` instead.
pub(crate) fn unreadable_doc(attrs: &[Attribute]) -> Option<&Attribute> {
    attrs.iter().find(|attr| match &attr.meta {
        Meta::NameValue(nv) if nv.path.is_ident("doc") => !matches!(
            &nv.value,
            Expr::Lit(ExprLit {
                lit: Lit::Str(_),
                ..
            })
        ),
        _ => false,
    })
}

/// The literal text of the `///` and `#[doc = "…"]` attributes, one entry per line. Doc
/// attributes that are not literals (`#[doc = include_str!(..)]`) cannot be read here and are
/// skipped ([`unreadable_doc`] finds them).
pub(crate) fn doc_lines(attrs: &[Attribute]) -> Vec<String> {
    let mut lines = Vec::new();
    for attr in attrs {
        let Meta::NameValue(nv) = &attr.meta else {
            continue;
        };
        if !nv.path.is_ident("doc") {
            continue;
        }
        if let Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) = &nv.value
        {
            // A `/** … */` block is one attribute with several lines; a bare `///` is one
            // empty line (which `str::lines` would drop).
            let text = s.value();
            if text.is_empty() {
                lines.push(String::new());
            }
            lines.extend(text.lines().map(str::to_owned));
        }
    }
    lines
}

/// Folds doc lines into a description.
pub(crate) fn fold(lines: &[String]) -> String {
    // `///` lines start with one space by convention; drop exactly the common indentation.
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut out = String::new();
    let mut in_fence = false;
    let mut paragraph_open = false;
    for raw in lines {
        let line = raw.get(indent..).unwrap_or(raw.trim_start()).trim_end();
        let fence = line.trim_start().starts_with("```");
        if in_fence || fence {
            push_line(&mut out, line);
            paragraph_open = false;
            if fence {
                in_fence = !in_fence;
            }
            continue;
        }
        if line.is_empty() {
            if !out.is_empty() && !out.ends_with("\n\n") {
                out.push_str("\n\n");
            }
            paragraph_open = false;
            continue;
        }
        if paragraph_open && !starts_block(line) {
            out.push(' ');
            out.push_str(line.trim_start());
        } else {
            push_line(&mut out, line);
            paragraph_open = true;
        }
    }
    out.trim().to_owned()
}

fn push_line(out: &mut String, line: &str) {
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
}

/// A line that starts a list item, heading, quote or table row.
fn starts_block(line: &str) -> bool {
    let t = line.trim_start();
    if ["- ", "* ", "+ ", "#", "> ", "|"]
        .iter()
        .any(|p| t.starts_with(p))
    {
        return true;
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && (t[digits..].starts_with(". ") || t[digits..].starts_with(") "))
}

#[cfg(test)]
mod tests {
    use super::fold;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| (*l).to_owned()).collect()
    }

    #[test]
    fn folds_wrapped_prose_and_keeps_paragraphs() {
        let doc = lines(&[
            " Charge a customer's card",
            " for an invoice.",
            "",
            " Amounts are in cents.",
        ]);
        assert_eq!(
            fold(&doc),
            "Charge a customer's card for an invoice.\n\nAmounts are in cents."
        );
    }

    #[test]
    fn keeps_lists_and_code() {
        let doc = lines(&[
            " Modes:",
            " - fast",
            "   and cheap",
            " - slow",
            " ```",
            " let x = 1;",
            " ```",
        ]);
        assert_eq!(
            fold(&doc),
            "Modes:\n- fast and cheap\n- slow\n```\nlet x = 1;\n```"
        );
    }

    #[test]
    fn empty() {
        assert_eq!(fold(&[]), "");
    }
}
