//! The bearer token of the dump and nodes APIs (`kube_discovery.http.auth_token_file`),
//! re-read while the process runs: a rotated Secret (the kubelet swaps the
//! mounted file within about a minute) is picked up without a restart, the
//! old token stops working.
//!
//! The policy is kube-client's for the API token file (its `TokenFile` is
//! private to kube, so it cannot be shared): the file is read at start (an
//! unreadable or empty file is a configuration error), then again when the
//! cached token is older than [`RECHECK`], on the request that needs it; a
//! read that fails, or finds the file empty, keeps the last token (never "no
//! authentication"), as client-go does for files that are removed after start.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::SettingError;

/// The setting the errors name (the HTTP API's; [`ApiToken::from_setting`]
/// names another, e.g. xDS's).
const SETTING: &str = "kube_discovery.http.auth_token_file";

/// How old the cached token may get before the file is read again: a file
/// read (a few bytes) at most once a second, a rotation seen within a second.
pub const RECHECK: Duration = Duration::from_secs(1);

/// The token required by the dump and nodes APIs.
#[derive(Debug)]
pub struct ApiToken {
    /// Where it is re-read from (`None`: a fixed token).
    path: Option<PathBuf>,
    /// The setting it comes from (errors and logs name it).
    setting: &'static str,
    cached: Mutex<Cached>,
}

#[derive(Debug)]
struct Cached {
    token: String,
    read_at: Instant,
    /// The last re-read failed (logged once until one succeeds).
    failing: bool,
}

/// The file's token (trimmed), or why there is none.
fn read(path: &Path, setting: &'static str) -> Result<String, SettingError> {
    let t = std::fs::read_to_string(path).map_err(|source| SettingError::Unreadable {
        setting,
        path: path.to_path_buf(),
        source,
    })?;
    let t = t.trim();
    if t.is_empty() {
        return Err(SettingError::EmptyFile {
            setting,
            path: path.to_path_buf(),
        });
    }
    Ok(t.to_string())
}

impl ApiToken {
    /// Reads `path` (the start-up check: unreadable or empty is an error).
    pub fn from_file(path: &Path) -> Result<Self, SettingError> {
        Self::from_setting(path, SETTING)
    }

    /// [`ApiToken::from_file`] for the token file of `setting`.
    pub fn from_setting(path: &Path, setting: &'static str) -> Result<Self, SettingError> {
        let token = read(path, setting)?;
        Ok(Self {
            path: Some(path.to_path_buf()),
            setting,
            cached: Mutex::new(Cached {
                token,
                read_at: Instant::now(),
                failing: false,
            }),
        })
    }

    /// A token that never changes (tests, embedding).
    pub fn fixed(token: impl Into<String>) -> Self {
        Self {
            path: None,
            setting: SETTING,
            cached: Mutex::new(Cached {
                token: token.into(),
                read_at: Instant::now(),
                failing: false,
            }),
        }
    }

    /// Whether `got` is the current token (re-read first when the cached one
    /// is older than [`RECHECK`]). Equal-length inputs are compared in time
    /// independent of where they differ.
    pub fn matches(&self, got: &str) -> bool {
        let mut c = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(path) = &self.path
            && c.read_at.elapsed() >= RECHECK
        {
            c.read_at = Instant::now();
            match read(path, self.setting) {
                Ok(t) => {
                    if t != c.token {
                        tracing::info!(file = %path.display(), setting = self.setting, "API token changed: the new one is required from now on");
                        c.token = t;
                    }
                    c.failing = false;
                }
                Err(e) => {
                    if !c.failing {
                        tracing::warn!(error = %e, "API token not re-read; the last one stays in force");
                    }
                    c.failing = true;
                }
            }
        }
        let want = c.token.as_bytes();
        got.len() == want.len()
            && got
                .bytes()
                .zip(want.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

#[cfg(test)]
mod tests;
