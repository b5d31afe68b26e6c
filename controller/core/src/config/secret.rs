//! [`Secret`]: a token whose value no `Debug`, `Display` or redacted JSON
//! shows. The raw document deserializes it (`raw.rs`), the rules check it
//! (`rules.rs`), the validated configuration carries it (`validated.rs`).

use std::fmt;

/// What a secret is shown as.
pub(super) const REDACTED: &str = "<redacted>";

/// A token. `Debug`, `Display` and the redacted JSON never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret value (hand it only to the HTTP client).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({REDACTED})")
    }
}
