use super::*;

/// Packed or not, a kept text is exactly its string: it comes back
/// unchanged and compares equal exactly when the strings are equal.
#[test]
fn kept_text_round_trips_and_compares_like_the_string() {
    let texts = [
        "0",
        "1",
        "12345",
        "18446744073709551615",
        "18446744073709551616", // beyond u64: text
        "012",                  // leading zero: text
        "+12",
        "",
        "abc",
        "1d0c6a41-3a5c-4f0e-9d3b-2b8f1c3e4a5f",
        "1D0C6A41-3A5C-4F0E-9D3B-2B8F1C3E4A5F", // uppercase: text
        "1d0c6a413a5c4f0e9d3b2b8f1c3e4a5f",     // no hyphens: text
        "1d0c6a41-3a5c-4f0e-9d3b-2b8f1c3e4a5",  // 35 characters
        "1d0c6a41-3a5c-4f0e-9d3b-2b8f1c3e4a5g", // not hex
        "1d0c6a41-3a5c-4f0e-9d3b2-b8f1c3e4a5f", // hyphen moved
        "00000000-0000-0000-0000-000000000000",
    ];
    for a in texts {
        let k = KeptText::new(a);
        assert_eq!(k.as_string(), a, "{k:?}");
        for b in texts {
            assert_eq!(k.is(b), a == b, "{a:?} vs {b:?}");
            assert_eq!(k == KeptText::new(b), a == b, "{a:?} vs {b:?}");
        }
    }
    assert!(matches!(KeptText::new("12345"), KeptText::Decimal(12345)));
    assert!(matches!(
        KeptText::new("1d0c6a41-3a5c-4f0e-9d3b-2b8f1c3e4a5f"),
        KeptText::Uuid(_)
    ));
    assert!(matches!(KeptText::new("012"), KeptText::Other(_)));
    assert_eq!(std::mem::size_of::<Option<KeptText>>(), 24);
}
