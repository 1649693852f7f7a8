//! How stored values are read: exactly as `lua/lib.lua` reads them, so that
//! the operator tools call corrupt what the scripts call corrupt.

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
