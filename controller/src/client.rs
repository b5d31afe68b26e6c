//! Building a kube [`Client`] for one cluster from the configuration.
//!
//! Two ways in, as the issue asks:
//! * APISIX style: `service: {schema, host, port, ssl_verify, ca_file}` plus
//!   `client: {token | token_file}`. TLS verification is ON by default
//!   (APISIX defaults it off); `ca_file` adds the API server's CA. A
//!   `token_file` is handed to kube as a token FILE, which kube re-reads
//!   periodically, so rotating bound ServiceAccount tokens keep working.
//! * A kubeconfig (path and optional context; `--kubeconfig`/`KUBECONFIG`),
//!   which brings contexts, client certificates and exec plugins.

use kube::{Client, Config};

use crate::{Result, SettingError};

pub use kube_discovery_core::config::{Connection, Credentials};

/// Objects per page of every list the controller makes (sources, its own
/// DiscoveredServices, snapshot ConfigMaps). kube-runtime's default is 500.
/// A page is received and decoded whole, so its size bounds the transient
/// memory of a (re)list: 500 EndpointSlices of 100 endpoints would be
/// 50,000 decoded endpoints at once, and 500 sharded DiscoveredServices up to
/// 500 times [`kube_discovery_core::crd::MAX_OBJECT_PORTS_BYTES`] of JSON.
/// The price is five times the requests per list (BENCHMARKS.md, issue 6,
/// has the measured effect of both).
pub const LIST_PAGE_SIZE: u32 = 100;

/// Formats a host for a URL (IPv6 literals get brackets).
fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Builds the kube [`Config`] for `conn`.
pub async fn kube_config(conn: &Connection) -> Result<Config> {
    match conn {
        Connection::Service {
            schema,
            host,
            port,
            ssl_verify,
            ca_file,
            credentials,
        } => {
            let url = format!("{}://{}:{port}", schema.as_str(), url_host(host));
            let uri: http::Uri = url
                .parse()
                .map_err(|source| SettingError::ServiceUrl { url, source })?;
            let mut cfg = Config::new(uri);
            cfg.accept_invalid_certs = !ssl_verify;
            if let Some(ca) = ca_file {
                if !ca.exists() {
                    return Err(SettingError::MissingFile {
                        setting: "discovery.kubernetes.service.ca_file",
                        path: ca.clone(),
                    }
                    .into());
                }
                cfg.root_cert_file = Some(ca.clone());
            }
            match credentials {
                Credentials::Token(t) => {
                    cfg.auth_info.token = Some(t.expose().trim().to_string().into());
                }
                Credentials::TokenFile(f) => {
                    if !f.exists() {
                        return Err(SettingError::MissingFile {
                            setting: "discovery.kubernetes.client.token_file",
                            path: f.clone(),
                        }
                        .into());
                    }
                    cfg.auth_info.token_file = Some(f.display().to_string());
                }
            }
            Ok(cfg)
        }
        Connection::Kubeconfig { path, context } => Ok(
            kube_discovery_client::connect::kube_config(path.as_deref(), context.as_deref())
                .await?,
        ),
    }
}

/// Builds a [`Client`] for `conn`.
pub async fn client(conn: &Connection) -> Result<Client> {
    let cfg = kube_config(conn).await?;
    Ok(Client::try_from(cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::config::{Schema, Secret};

    #[tokio::test]
    async fn service_connection_verifies_tls_by_default_and_uses_token_file() {
        let dir = tempfile::tempdir().unwrap();
        let tf = dir.path().join("token");
        std::fs::write(&tf, "abc").unwrap();
        let conn = Connection::Service {
            schema: Schema::Https,
            host: "::1".into(),
            port: 6443,
            ssl_verify: true,
            ca_file: None,
            credentials: Credentials::TokenFile(tf.clone()),
        };
        let cfg = kube_config(&conn).await.unwrap();
        assert_eq!(cfg.cluster_url.to_string(), "https://[::1]:6443/");
        assert!(!cfg.accept_invalid_certs);
        assert_eq!(
            cfg.auth_info.token_file.as_deref(),
            Some(tf.display().to_string().as_str())
        );
    }

    #[tokio::test]
    async fn missing_files_are_named_in_the_error() {
        let conn = Connection::Service {
            schema: Schema::Https,
            host: "10.0.0.1".into(),
            port: 443,
            ssl_verify: true,
            ca_file: Some("/nonexistent/ca.crt".into()),
            credentials: Credentials::Token(Secret::new("secret-token")),
        };
        let e = kube_config(&conn).await.unwrap_err().to_string();
        assert!(
            e.contains("service.ca_file") && e.contains("/nonexistent/ca.crt"),
            "{e}"
        );
        assert!(!e.contains("secret-token"));
    }
}
