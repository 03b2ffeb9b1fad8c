//! Durations in attribute values: `"500ms"`, `"30s"`, `"5m"`, `"23h"`, or a sum like `"1h30m"`.
//! Parsed at compile time, so a typo is a compile error, not a panic at registration.

/// Parses a duration into milliseconds. The error says what is wrong, for a spanned message.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    const HINT: &str = "write a whole number with a unit: \"500ms\", \"30s\", \"5m\" or \"23h\" (or a sum such as \"1h30m\")";
    if text.is_empty() {
        return Err(format!("empty duration; {HINT}"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("invalid duration `{text}`; {HINT}"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("duration `{text}` is too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_millis: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" if rest.starts_with('.') => {
                return Err(format!("duration `{text}` is not a whole number; {HINT}"))
            }
            "" => return Err(format!("duration `{text}` has no unit; {HINT}")),
            other => return Err(format!("unknown unit `{other}` in `{text}`; {HINT}")),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(unit_millis)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("duration `{text}` is too large"))?;
    }
    if total == 0 {
        return Err(format!(
            "duration `{text}` is zero; it must be greater than zero"
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn units_and_sums() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("23h"), Ok(82_800_000));
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "soon",
            "30",
            "s",
            "1.5s",
            "3 s",
            "10d",
            "0s",
            "99999999999999999999s",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
