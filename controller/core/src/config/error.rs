//! What every stage reports: one [`ConfigError`] per problem, each naming the
//! field path as written in the file (`discovery.kubernetes[1].id`).

use std::fmt;

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path, e.g. `discovery.kubernetes[1].id`.
    pub path: String,
    /// What is wrong (never contains a token value).
    pub message: String,
}

/// All problems found; `Display` prints one `path: message` line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {}", e.path, e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The collector the stages push into; a stage succeeds only if it stayed empty.
#[derive(Default)]
pub(super) struct Errors(pub(super) Vec<ConfigError>);

impl Errors {
    pub(super) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// How many problems so far (to tell whether a step added one).
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds garde's findings, their paths below `prefix`.
    pub(super) fn report(&mut self, prefix: &str, report: garde::Report) {
        for (path, err) in report.iter() {
            // garde names raw identifiers `r#match`; the YAML key is `match`.
            let p = path.to_string().replace("r#", "");
            let full = if p.is_empty() {
                prefix.to_string()
            } else if p.starts_with('[') {
                format!("{prefix}{p}")
            } else {
                format!("{prefix}.{p}")
            };
            self.push(full, err.message().to_string());
        }
    }

    /// `Ok(value)` when nothing was reported, else every problem.
    pub(super) fn finish<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConfigErrors(self.0))
        }
    }
}
