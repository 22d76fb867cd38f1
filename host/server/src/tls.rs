//! HTTPS for the listeners (rustls with the ring provider), and the plain-HTTP port that answers
//! `301` to the HTTPS URL.
//! Connections, handshakes included, are taken by `listen::serve`.

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server TLS configuration from PEM files (certificate chain, private key).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| anyhow::anyhow!("cannot read the TLS certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("bad certificate PEM in {}: {e}", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("cannot read the TLS private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| anyhow::anyhow!("the TLS certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The plain-HTTP port: every request is answered `301` to the same path on the HTTPS listener.
pub fn redirect_router(https_port: u16) -> Router {
    Router::new().fallback(move |headers: HeaderMap, uri: Uri| async move {
        redirect(https_port, &headers, &uri)
    })
}

fn redirect(https_port: u16, headers: &HeaderMap, uri: &Uri) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| match h.rsplit_once(':') {
            // Keep IPv6 literals whole: `[::1]:80` → `[::1]`.
            Some((name, port)) if !name.ends_with(']') || h.starts_with('[') => {
                if port.chars().all(|c| c.is_ascii_digit()) {
                    name
                } else {
                    h
                }
            }
            _ => h,
        })
        .unwrap_or("localhost");
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let location = if https_port == 443 {
        format!("https://{host}{path}")
    } else {
        format!("https://{host}:{https_port}{path}")
    };
    (
        StatusCode::MOVED_PERMANENTLY,
        [(header::LOCATION, location.clone())],
        axum::Json(serde_json::json!({"status": 301, "error": {"code": "E_HTTPS_REQUIRED", "message": format!("HTTPS only: use {location}")}})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_keep_host_path_and_query() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "api.example.com:8080".parse().unwrap());
        let r = redirect(
            8443,
            &h,
            &"/api/public/v2/products/?cityCode=ROME".parse().unwrap(),
        );
        assert_eq!(r.status(), 301);
        assert_eq!(
            r.headers()[header::LOCATION],
            "https://api.example.com:8443/api/public/v2/products/?cityCode=ROME"
        );
        h.insert(header::HOST, "api.example.com".parse().unwrap());
        let r = redirect(443, &h, &"/x".parse().unwrap());
        assert_eq!(r.headers()[header::LOCATION], "https://api.example.com/x");
    }
}
