//! How stored values are read: exactly as `lua/lib.lua` reads them, so that
//! the operator tools call corrupt what the scripts call corrupt.

use std::collections::HashMap;

/// The most digits a stored number may have: 15 keep every value exact in
/// the scripts' Lua doubles (`MAX_DIGITS` of lib.lua).
pub const MAX_DIGITS: usize = 15;

/// lib.lua's `canonical(s)`: a non-negative integer without sign, leading
/// zero, exponent, blank or other character, of at most [`MAX_DIGITS`]
/// digits (`0`, `42`; never `007`, `+5`, `-1`, `1e3`, ` 5`, `abc`, `0x10`).
/// `None` is what the scripts call corrupt.
pub fn canonical(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let ok = s == "0"
        || (!b.is_empty()
            && b.len() <= MAX_DIGITS
            && (b'1'..=b'9').contains(&b[0])
            && b.iter().all(u8::is_ascii_digit));
    if ok {
        s.parse().ok()
    } else {
        None
    }
}

/// lib.lua's `event_id(s)`: 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub fn event_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The positional fields of a record in the lean layout (`RECORD_FIELDS` of
/// lib.lua; docs/contract.md section 2), in their order.
pub const RECORD_FIELDS: [&str; 10] = [
    "state", "event", "budget", "stock", "budget0", "stock0", "customer", "counted", "gen",
    "absorbed",
];

/// lib.lua's `decode_record(v)`: a record `promo:{P}:order:{O}` stored in the
/// lean layout (one string, `|` between fields) as the field map a hash of
/// the previous layout holds, or `None` when the value is not one (corrupt).
/// The fields' own values are then judged as for a hash.
pub fn record_fields(v: &str) -> Option<HashMap<String, String>> {
    let mut h = HashMap::new();
    for (i, tok) in v.split('|').enumerate() {
        if let Some(name) = RECORD_FIELDS.get(i) {
            if !tok.is_empty() {
                h.insert((*name).to_owned(), tok.to_owned());
            }
            continue;
        }
        let (name, value) = tok.split_once('=')?;
        if name.is_empty()
            || !(name.starts_with("absorbed:") || name.starts_with("refund:"))
            || h.contains_key(name)
        {
            return None;
        }
        h.insert(name.to_owned(), value.to_owned());
    }
    let state = match h.get("state").map(String::as_str) {
        Some("d") => "deducted",
        Some("r") => "reverted",
        _ => return None,
    };
    h.insert("state".into(), state.into());
    for (zero, now) in [("budget0", "budget"), ("stock0", "stock")] {
        if !h.contains_key(zero) {
            if let Some(v) = h.get(now).cloned() {
                h.insert(zero.into(), v);
            }
        }
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn corrupt_is_corrupt() {
        for ok in ["0", "1", "42", "999999999999999"] {
            assert_eq!(canonical(ok), ok.parse().ok(), "{ok}");
        }
        for bad in [
            "",
            "abc",
            "1e3",
            "007",
            "+5",
            "-1",
            "-0",
            " 5",
            "5 ",
            "0x10",
            "nan",
            "inf",
            "1.0",
            "1000000000000000",
            "00",
            "٣",
        ] {
            assert_eq!(canonical(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_lean_record_reads_as_the_hash_it_replaces() {
        let h = record_fields("d|e-1|100|1|||c-9|1|3").expect("a record");
        let want: HashMap<String, String> = [
            ("state", "deducted"),
            ("event", "e-1"),
            ("budget", "100"),
            ("stock", "1"),
            ("budget0", "100"),
            ("stock0", "1"),
            ("customer", "c-9"),
            ("counted", "1"),
            ("gen", "3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(h, want);
        let h = record_fields("r||0|0|100|1|c-9|1|||absorbed:e-2=1|refund:e-3=applied 100 1")
            .expect("a record");
        assert_eq!(h["state"], "reverted");
        assert!(!h.contains_key("event") && !h.contains_key("gen"));
        assert_eq!((h["budget0"].as_str(), h["budget"].as_str()), ("100", "0"));
        assert_eq!(h["absorbed:e-2"], "1");
        assert_eq!(h["refund:e-3"], "applied 100 1");
        for bad in [
            "",
            "x|e|1|1",
            "deducted|e|1|1",
            "d|e|1|1|||c|1|||other=1",
            "d|e|1|1|||c|1|||refund:e",
            "d|e|1|1|||c|1|||refund:e=a|refund:e=b",
        ] {
            assert_eq!(record_fields(bad), None, "{bad:?}");
        }
    }

    proptest! {
        /// Whatever the text, a number read back prints as the same text
        /// (canonical means one spelling per number).
        #[test]
        fn a_canonical_number_has_one_spelling(s in "\\PC{0,20}|[-+0-9e. ]{0,18}") {
            if let Some(n) = canonical(&s) {
                prop_assert_eq!(n.to_string(), s);
            }
        }
    }
}
