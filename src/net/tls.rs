//! The TLS roots: those compiled into the binary (a `FROM scratch` image has
//! no CA store), the system's where it has some, and `--ca-file`. rustls
//! with the ring provider: no OpenSSL, nothing to find at run time.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

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
        for cert in certs {
            roots.add(cert).map_err(|e| {
                error::usage(format!(
                    "{shown}: a certificate of --ca-file is unusable: {e}"
                ))
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}
