//! Certificates and keys of a test control plane, generated fresh per start:
//! a CA and one serving certificate for `127.0.0.1`/`::1`/`localhost` (kube-sim's
//! generator, [`kube_sim::tls::generate_certs`]; the API server and the fault
//! proxy both present it), and the ServiceAccount token signing key pair.

use std::sync::Arc;

use kube_sim::tls::Certs;
use rcgen::KeyPair;
use rustls::pki_types::CertificateDer;

use crate::{Error, Result};

/// PEM material of one control plane.
pub struct Pki {
    /// The CA certificate clients verify the servers with.
    pub ca_pem: String,
    /// Serving certificate (leaf) and its key.
    pub serving_cert_pem: String,
    /// The serving certificate's private key (PKCS#8).
    pub serving_key_pem: String,
    certs: Certs,
    /// ServiceAccount token signing key (PKCS#8) and its public key.
    pub sa_key_pem: String,
    /// The public key of `sa_key_pem`.
    pub sa_pub_pem: String,
}

impl Pki {
    /// Generates a CA, a serving certificate signed by it and an SA key pair
    /// (all ECDSA P-256).
    pub fn generate() -> Result<Pki> {
        let certs = kube_sim::tls::generate_certs("kd-testenv-ca", "kube-apiserver")?;
        let sa = KeyPair::generate().map_err(|source| Error::Cert {
            what: "ServiceAccount signing key",
            source,
        })?;
        Ok(Pki {
            ca_pem: certs.ca_pem.clone(),
            serving_cert_pem: certs.cert_pem.clone(),
            serving_key_pem: certs.key_pem.clone(),
            certs,
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
        })
    }

    /// A rustls server configuration presenting the serving certificate,
    /// offering HTTP/2 and HTTP/1.1 (as kube-apiserver does).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        Ok(self.certs.server_config(&[b"h2", b"http/1.1"])?)
    }

    /// A rustls client configuration trusting only this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(self.certs.ca_der.clone()))
            .map_err(|source| Error::Tls {
                what: "CA into the root store",
                source,
            })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| Error::Tls {
                what: "TLS versions",
                source,
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(cfg))
    }
}
