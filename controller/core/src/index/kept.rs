//! [`KeptText`]: a short string the index keeps per EndpointSlice (the
//! owner Service's UID, the slice's `resourceVersion`) without a heap block
//! of its own in the usual case.
//!
//! Why: each of these strings was a separate allocation per slice, for
//! text that is a 128-bit or 64-bit number in its canonical spelling
//! (BENCHMARKS.md, "Peak RSS met"). Hand-written rather
//! than the `uuid` crate: only the canonical lowercase form is packed, and
//! checking that is a dozen lines.
//!
//! Exactness: a string is packed only when it is the ONE canonical
//! spelling of its number (decimal without a leading zero or sign; a UUID
//! in lowercase 8-4-4-4-12 hex), so packing is injective, the derived
//! equality is exactly string equality, and [`KeptText::as_string`] gives
//! back the very text. Anything else is kept as text.

use std::fmt;

/// See the module docs.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum KeptText {
    /// Canonical decimal (a `resourceVersion` of etcd or kube-sim).
    Decimal(u64),
    /// Canonical lowercase UUID (a Kubernetes UID).
    Uuid([u8; 16]),
    /// Anything else, as it was.
    Other(Box<str>),
}

impl KeptText {
    pub(super) fn new(s: &str) -> Self {
        if let Some(n) = canonical_decimal(s) {
            Self::Decimal(n)
        } else if let Some(u) = canonical_uuid(s) {
            Self::Uuid(u)
        } else {
            Self::Other(s.into())
        }
    }

    /// Whether this is the text `s` (the comparison it replaces).
    pub(super) fn is(&self, s: &str) -> bool {
        *self == Self::new(s)
    }

    /// The text back, exactly as given to [`KeptText::new`].
    pub(super) fn as_string(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for KeptText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decimal(n) => write!(f, "{n}"),
            Self::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            Self::Other(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for KeptText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// `s` as a number when it is its canonical decimal spelling.
fn canonical_decimal(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// `s` as 16 bytes when it is a UUID in canonical lowercase form.
fn canonical_uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut digits = b.iter().copied().filter(|c| *c != b'-');
    let mut out = [0u8; 16];
    for byte in &mut out {
        let hi = nibble(digits.next()?)?;
        let lo = nibble(digits.next()?)?;
        *byte = (hi << 4) | lo;
    }
    // 32 digits and the four hyphens checked above: nothing else is left.
    digits.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests;
