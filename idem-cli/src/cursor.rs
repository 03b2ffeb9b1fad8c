//! A listing's position on the command line: `MILLIS:KEY`, the `created_at` (milliseconds
//! since the Unix epoch) and key of the last record of a page, as `idem list` prints it.

use idem_runtime::store::ListCursor;
use idem_runtime::{identity::IdemKey, store::Timestamp};

/// The text `--after` takes for `cursor`.
pub(crate) fn format(cursor: &ListCursor) -> String {
    format!("{}:{}", cursor.created_at.as_millis(), cursor.key)
}

/// Parses what [`format`] wrote (clap's value parser for `--after`).
pub(crate) fn parse(s: &str) -> Result<ListCursor, String> {
    let bad = || String::from("want MILLIS:idem:…, as the previous page printed after `--after`");
    let (millis, key) = s.split_once(':').ok_or_else(bad)?;
    let created_at = millis.parse::<u64>().map_err(|_| bad())?;
    let key = IdemKey::parse(key).map_err(|e| format!("{e}; {}", bad()))?;
    Ok(ListCursor {
        created_at: Timestamp(created_at),
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let key = IdemKey::parse(&format!("idem:{}", "ab".repeat(32))).unwrap();
        let c = ListCursor {
            created_at: Timestamp(1_764_514_182_123),
            key,
        };
        assert_eq!(parse(&format(&c)), Ok(c));
        for bad in [
            "",
            "12",
            "x:idem:00",
            "12:idem:zz",
            "-1:idem:00",
            ":idem:00",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
