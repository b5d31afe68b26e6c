//! Certificates and keys of a test control plane, generated fresh per start:
//! a CA, one serving certificate for `127.0.0.1`/`::1`/`localhost` (the API
//! server and the fault proxy both present it), and the ServiceAccount token
//! signing key pair.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// PEM material of one control plane.
pub struct Pki {
    /// The CA certificate clients verify the servers with.
    pub ca_pem: String,
    /// Serving certificate (leaf) and its key.
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    serving_cert_der: Vec<u8>,
    serving_key_der: Vec<u8>,
    ca_der: Vec<u8>,
    /// ServiceAccount token signing key (PKCS#8) and its public key.
    pub sa_key_pem: String,
    pub sa_pub_pem: String,
}

impl Pki {
    /// Generates a CA, a serving certificate signed by it and an SA key pair
    /// (all ECDSA P-256).
    pub fn generate() -> anyhow::Result<Pki> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kd-testenv-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().context("CA key")?)
            .context("self-signing the CA")?;

        let mut params = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])
        .context("serving certificate params")?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        for ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)),
        ] {
            params.subject_alt_names.push(SanType::IpAddress(ip));
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().context("serving key")?;
        let cert = params
            .signed_by(&key, &ca)
            .context("signing the serving certificate")?;

        let sa = KeyPair::generate().context("ServiceAccount signing key")?;
        Ok(Pki {
            ca_pem: ca.pem(),
            serving_cert_pem: cert.pem(),
            serving_key_pem: key.serialize_pem(),
            serving_cert_der: cert.der().to_vec(),
            serving_key_der: key.serialize_der(),
            ca_der: ca.der().to_vec(),
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
        })
    }

    /// A rustls server configuration presenting the serving certificate,
    /// offering HTTP/2 and HTTP/1.1 (as kube-apiserver does).
    pub fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let chain = vec![
            CertificateDer::from(self.serving_cert_der.clone()),
            CertificateDer::from(self.ca_der.clone()),
        ];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.serving_key_der.clone()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("serving certificate")?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// A rustls client configuration trusting only this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(self.ca_der.clone()))
            .context("CA into the root store")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(cfg))
    }
}
