//! TLS for the PostgreSQL group writer's and point readers' connections (`pg_wire.rs`), on
//! rustls with the ring provider (what sqlx's own connections use here), meaning what the URL's
//! `sslmode` means to sqlx and libpq:
//! `require` encrypts without checking the server's certificate, `verify-ca` checks that a
//! trusted authority issued it, `verify-full` checks that and the host name too. The trusted
//! authorities are the URL's `sslrootcert` (or `PGSSLROOTCERT`) if given, else the Web PKI's.

use std::io;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// `sslmode=require`: nothing (the connection is encrypted, the server unauthenticated).
    Nothing,
    /// `sslmode=verify-ca`: the chain to a trusted authority, not the name.
    Authority,
    /// `sslmode=verify-full`: the chain and the host name.
    Full,
}

/// Makes the writer's TLS sessions (`crate::pg_wire`).
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl MakeRustls {
    /// `root_cert`: a PEM file of the authorities to trust; `None`: the Web PKI's.
    pub(crate) fn new(verify: Verify, root_cert: Option<&str>) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        match root_cert {
            Some(path) => {
                use rustls::pki_types::pem::PemObject;
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect())
                    .map_err(|e| format!("cannot read sslrootcert {path}: {e}"))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("sslrootcert {path} holds no certificate"));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots.clone()),
            provider.clone(),
        )
        .build()
        .map_err(|e| e.to_string())?;
        let config = match verify {
            Verify::Full => builder.with_root_certificates(roots),
            Verify::Authority | Verify::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Lenient {
                    webpki,
                    verify,
                    provider,
                })),
        }
        .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The TLS session over `stream`, to `host` (the name `verify-full` checks). No channel
    /// binding: SCRAM then authenticates without it, as it does for sqlx's connections.
    pub(crate) async fn handshake(
        &self,
        host: &str,
        stream: tokio::net::TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, stream)
            .await
    }
}

/// `verify-ca` (a trusted chain, any name) and `require` (anything): the handshake's
/// signatures are still checked, so the session is bound to the certificate presented.
#[derive(Debug)]
struct Lenient {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    verify: Verify,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.verify == Verify::Nothing {
            return Ok(ServerCertVerified::assertion());
        }
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
