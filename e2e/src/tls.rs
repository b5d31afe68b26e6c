//! TLS material: a fresh self-signed CA per server and a server certificate signed
//! by it, valid for `127.0.0.1`, `::1` and `localhost` (and the in-cluster names of
//! the API server). Clients verify the server for real with the CA written into the
//! kubeconfig (`certificate-authority-data`). The test harness of the real API
//! server (`kd-testenv`) uses the same generator for its certificates.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::{Error, Result};

/// The generated CA and the rustls server configuration using it.
pub struct TlsMaterial {
    /// The CA certificate (PEM) clients verify the server with.
    pub ca_pem: String,
    /// The server configuration presenting the certificate.
    pub server_config: Arc<rustls::ServerConfig>,
}

/// A CA and one serving certificate signed by it (ECDSA P-256), as PEM and DER.
pub struct Certs {
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// The CA certificate (DER).
    pub ca_der: Vec<u8>,
    /// The serving certificate (PEM).
    pub cert_pem: String,
    /// The serving certificate (DER).
    pub cert_der: Vec<u8>,
    /// The serving certificate's private key (PKCS#8 PEM).
    pub key_pem: String,
    /// The serving certificate's private key (PKCS#8 DER).
    pub key_der: Vec<u8>,
}

/// Generates a CA named `ca_name` and a serving certificate named
/// `server_name` for `127.0.0.1`, `::1`, `10.96.0.1` (the first Service IP
/// of the default range), `localhost` and `kubernetes[.default[.svc]]`.
pub fn generate_certs(ca_name: &str, server_name: &str) -> Result<Certs> {
    let mut ca_params =
        CertificateParams::new(Vec::<String>::new()).map_err(|source| Error::Cert {
            what: "CA params",
            source,
        })?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(|source| Error::Cert {
        what: "CA key",
        source,
    })?;
    let ca =
        rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(|source| Error::Cert {
            what: "self-signing CA",
            source,
        })?;

    let mut params = CertificateParams::new(
        [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ]
        .map(String::from)
        .to_vec(),
    )
    .map_err(|source| Error::Cert {
        what: "server params",
        source,
    })?;
    params
        .distinguished_name
        .push(DnType::CommonName, server_name);
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
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(|source| Error::Cert {
        what: "server key",
        source,
    })?;
    let cert = params.signed_by(&key, &ca).map_err(|source| Error::Cert {
        what: "signing server certificate",
        source,
    })?;
    Ok(Certs {
        ca_pem: ca.pem(),
        ca_der: ca.der().to_vec(),
        cert_pem: cert.pem(),
        cert_der: cert.der().to_vec(),
        key_pem: key.serialize_pem(),
        key_der: key.serialize_der(),
    })
}

impl Certs {
    /// A rustls server configuration presenting the certificate (and the CA),
    /// offering the `alpn` protocols.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>> {
        let chain = vec![
            CertificateDer::from(self.cert_der.clone()),
            CertificateDer::from(self.ca_der.clone()),
        ];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| Error::Tls {
                what: "TLS versions",
                source,
            })?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|source| Error::Tls {
                what: "server certificate",
                source,
            })?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// kube-sim's TLS: HTTP/1.1 only.
pub fn generate() -> Result<TlsMaterial> {
    let certs = generate_certs("kube-sim-ca", "kube-sim")?;
    Ok(TlsMaterial {
        server_config: certs.server_config(&[b"http/1.1"])?,
        ca_pem: certs.ca_pem,
    })
}
