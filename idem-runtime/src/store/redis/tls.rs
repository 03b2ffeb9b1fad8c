//! The certificates a `rediss://` store is given beyond the system's trust store: a private
//! CA's roots, and a client certificate for servers that require one (Redis's own default,
//! `tls-auth-clients yes`).
//!
//! Both are checked when the store connects, so a file that holds no certificate or no key
//! fails there with a message naming it, not as a handshake error on every call later.

use std::fmt;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::store::StoreError;

/// TLS material for the store's connections, as PEM bytes.
#[derive(Clone, Default)]
pub(super) struct TlsOptions {
    /// Trust exactly these roots instead of the system's.
    pub(super) roots: Option<Vec<u8>>,
    /// The client certificate chain and its private key.
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
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
    pub(super) fn is_set(&self) -> bool {
        self.roots.is_some() || self.client.is_some()
    }

    /// The certificates in the `redis` client's form, after checking each PEM holds what it
    /// must; `None` when nothing was given (the system's roots, no client certificate).
    pub(super) fn certificates(&self) -> Result<Option<::redis::TlsCertificates>, StoreError> {
        if !self.is_set() {
            return Ok(None);
        }
        if let Some(roots) = &self.roots {
            certificate_count(roots, "tls_root_certificates")?;
        }
        if let Some((cert, key)) = &self.client {
            certificate_count(cert, "tls_client_certificate (the certificate)")?;
            PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                StoreError::Backend(format!(
                    "the private key given to tls_client_certificate is not a PEM private key \
                     (PKCS#8, PKCS#1 or SEC1): {e}"
                ))
            })?;
        }
        Ok(Some(::redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| ::redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.roots.clone(),
        }))
    }
}

/// How many certificates `pem` holds: at least one, or an error naming `what`.
fn certificate_count(pem: &[u8], what: &str) -> Result<usize, StoreError> {
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| {
            StoreError::Backend(format!("the PEM given to {what} does not parse: {e}"))
        })?;
        n += 1;
    }
    if n == 0 {
        return Err(StoreError::Backend(format!(
            "the PEM given to {what} holds no certificate (expected one or more \
             `-----BEGIN CERTIFICATE-----` blocks)"
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_given_means_the_defaults() {
        assert!(TlsOptions::default().certificates().unwrap().is_none());
    }

    #[test]
    fn a_pem_without_a_certificate_is_refused_by_name() {
        let options = TlsOptions {
            roots: Some(b"not a certificate".to_vec()),
            client: None,
        };
        let Err(StoreError::Backend(msg)) = options.certificates() else {
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
        let Err(StoreError::Backend(msg)) = options.certificates() else {
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
