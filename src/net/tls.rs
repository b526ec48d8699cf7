//! The TLS roots: those compiled into the binary (a `FROM scratch` image has
//! no CA store), the system's where it has some, and `--ca-file`. rustls
//! with the ring provider: no OpenSSL, nothing to find at run time.
//!
//! A self-signed certificate given with `--ca-file` is also accepted as
//! the server's own certificate when the server presents exactly it (and
//! it names the host), as curl and Docker accept it: webpki alone refuses
//! a CA certificate used as an end entity.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::error;
use crate::sys;

/// `--ca-file` may be a bundle, not a whole CA store.
const MAX_CA_FILE: u64 = 4 << 20;

pub fn config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // The system's store, where there is one: unreadable entries only cost
    // those roots (the compiled-in ones remain).
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let mut pinned = Vec::new();
    if let Some(path) = ca_file {
        let shown = path.display();
        let pem = sys::read_bounded(path, MAX_CA_FILE)
            .map_err(|e| error::usage(format!("{shown}: cannot read --ca-file: {e}")))?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| error::usage(format!("{shown}: not PEM certificates (--ca-file): {e}")))?;
        if certs.is_empty() {
            return Err(error::usage(format!(
                "{shown}: no certificate in --ca-file"
            )));
        }
        pinned = certs.clone();
        for cert in certs {
            roots.add(cert).map_err(|e| {
                error::usage(format!(
                    "{shown}: a certificate of --ca-file is unusable: {e}"
                ))
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Verifier { webpki, pinned }))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// webpki's verdict, except that a certificate of `--ca-file` presented as
/// the whole chain and naming the host is accepted.
#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verdict {
            Err(rustls::Error::InvalidCertificate(_))
                if self
                    .pinned
                    .iter()
                    .any(|p| p.as_ref() == end_entity.as_ref()) =>
            {
                let parsed = ParsedCertificate::try_from(end_entity)?;
                verify_server_name(&parsed, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            v => v,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
