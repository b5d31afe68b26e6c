//! TLS material: a fresh self-signed CA per server and a server certificate signed
//! by it, valid for `127.0.0.1`, `::1` and `localhost`. Clients verify the server for
//! real with the CA written into the kubeconfig (`certificate-authority-data`).

use std::sync::Arc;

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The generated CA and the rustls server configuration using it.
pub struct TlsMaterial {
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

pub fn generate() -> anyhow::Result<TlsMaterial> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-sim-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().context("CA key")?;
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).context("self-signing CA")?;

    let mut params =
        CertificateParams::new(vec!["localhost".to_string()]).context("server params")?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-sim");
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from(
            std::net::Ipv6Addr::LOCALHOST,
        )));
    params.subject_alt_names.push(SanType::DnsName(
        "kubernetes.default.svc".try_into().context("san")?,
    ));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().context("server key")?;
    let cert = params
        .signed_by(&key, &ca)
        .context("signing server certificate")?;

    let chain = vec![CertificateDer::from(cert.der().to_vec()), ca.der().clone()];
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .context("server certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsMaterial {
        ca_pem: ca.pem(),
        server_config: Arc::new(config),
    })
}
