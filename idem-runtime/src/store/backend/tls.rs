//! The certificates a network store is given beyond the system's trust store: a private
//! CA's roots, and a client certificate for servers that require one (Redis's own default
//! with TLS, `tls-auth-clients yes`; Postgres with `clientcert=` in `pg_hba.conf`). One type
//! for both stores, so they check and name them alike.
//!
//! For backend authors (feature `tls`): `idem-redis` and `idem-postgres` keep what their
//! builders are given here and check it the same way.
//!
//! Both are checked when the store connects, so a file that holds no certificate or no key
//! fails there with a message naming it, not as a handshake error on every call later.

use std::fmt;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::store::StoreError;

/// TLS material for a store's connections, as PEM bytes: what a store builder's
/// `tls_root_certificates` and `tls_client_certificate` were given.
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// Trust exactly these roots instead of the system's.
    pub roots: Option<Vec<u8>>,
    /// The client certificate chain and its private key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsOptions {
    // A private key must not reach a log through `{:?}` of the builder.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("roots", &self.roots.as_ref().map(|_| "<PEM>"))
            .field(
                "client",
                &self.client.as_ref().map(|_| "<certificate and key>"),
            )
            .finish()
    }
}

impl TlsOptions {
    /// True when anything beyond the defaults was given.
    pub fn is_set(&self) -> bool {
        self.roots.is_some() || self.client.is_some()
    }

    /// The given roots, parsed: at least one certificate, or an error naming the method.
    pub fn parsed_roots(&self) -> Result<Option<Vec<CertificateDer<'static>>>, StoreError> {
        self.roots
            .as_deref()
            .map(|pem| certificates(pem, "tls_root_certificates"))
            .transpose()
    }

    /// The given client certificate chain and key, parsed.
    pub fn parsed_client(
        &self,
    ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, StoreError> {
        let Some((cert, key)) = &self.client else {
            return Ok(None);
        };
        let chain = certificates(cert, "tls_client_certificate (the certificate)")?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
            StoreError::Backend(format!(
                "the private key given to tls_client_certificate is not a PEM private key \
                 (PKCS#8, PKCS#1 or SEC1): {e}"
            ))
        })?;
        Ok(Some((chain, key)))
    }

    /// A rustls client configuration: the given roots (else the system's), full
    /// verification of the chain and host name, and the client certificate if one was
    /// given.
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, StoreError> {
        let roots = match self.parsed_roots()? {
            Some(certs) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certs {
                    roots.add(cert).map_err(|e| {
                        StoreError::Backend(format!(
                            "a certificate given to tls_root_certificates is not a usable \
                             trust anchor: {e}"
                        ))
                    })?;
                }
                roots
            }
            None => system_roots(),
        };
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match self.parsed_client()? {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).map_err(|e| {
                StoreError::Backend(format!(
                    "the certificate and key given to tls_client_certificate do not go \
                     together: {e}"
                ))
            }),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The operating system's root certificates (honouring `SSL_CERT_FILE` and
/// `SSL_CERT_DIR`).
pub fn system_roots() -> rustls::RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    for cert in found.certs {
        // A certificate the OS store holds but rustls cannot parse is skipped, as browsers do.
        let _ = roots.add(cert);
    }
    for e in &found.errors {
        tracing::warn!(error = %e, "reading the system's root certificates");
    }
    roots
}

/// The certificates in `pem`: at least one, or an error naming `what`.
fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Backend(format!("the PEM given to {what} does not parse: {e}")))?;
    if certs.is_empty() {
        return Err(StoreError::Backend(format!(
            "the PEM given to {what} holds no certificate (expected one or more \
             `-----BEGIN CERTIFICATE-----` blocks)"
        )));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_given_means_the_defaults() {
        let options = TlsOptions::default();
        assert!(!options.is_set());
        assert!(options.parsed_roots().unwrap().is_none());
        assert!(options.parsed_client().unwrap().is_none());
    }

    #[test]
    fn a_pem_without_a_certificate_is_refused_by_name() {
        let options = TlsOptions {
            roots: Some(b"not a certificate".to_vec()),
            client: None,
        };
        let Err(StoreError::Backend(msg)) = options.parsed_roots() else {
            panic!("an empty root PEM must be refused");
        };
        assert!(msg.contains("tls_root_certificates"), "{msg}");
        assert!(msg.contains("holds no certificate"), "{msg}");
    }

    #[test]
    fn a_client_key_that_is_not_a_key_is_refused_by_name() {
        // A syntactically valid certificate block (the content is not checked here; the
        // handshake would), and a key that is not PEM at all.
        let cert = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
        let options = TlsOptions {
            roots: None,
            client: Some((cert, b"no key here".to_vec())),
        };
        let Err(StoreError::Backend(msg)) = options.parsed_client() else {
            panic!("a missing private key must be refused");
        };
        assert!(msg.contains("private key"), "{msg}");
    }

    #[test]
    fn debug_never_prints_the_key() {
        let options = TlsOptions {
            roots: None,
            client: Some((b"CERT".to_vec(), b"SECRET-KEY-BYTES".to_vec())),
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
    }
}
