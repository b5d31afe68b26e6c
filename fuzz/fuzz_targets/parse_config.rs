//! Any text as a configuration: `parse_config` returns a `Config` or one line
//! per problem, each with a field path and a message; never a panic.
#![no_main]

use kube_discovery_core::config::parse_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let env = |k: &str| (k == "SET").then(|| "10.0.0.1".to_string());
    match parse_config(&text, &env) {
        Ok(cfg) => {
            // The redacted views must not panic either.
            let _ = cfg.redacted_json();
            let _ = cfg.kubernetes_redacted_json();
        }
        Err(e) => {
            assert!(!e.0.is_empty(), "an error without a line");
            for line in &e.0 {
                assert!(!line.path.is_empty(), "an error line without a path: {line:?}");
                assert!(!line.message.is_empty(), "an error line without a message: {line:?}");
            }
        }
    }
});
