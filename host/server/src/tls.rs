//! HTTPS for the listeners (rustls with the ring provider), and the plain-HTTP port that answers
//! `301` to the HTTPS URL.
//!
//! A TLS listener accepts TCP connections in its own task and runs each handshake in a task of
//! its own (10 s at most), so a slow or silent client never holds up the others; finished
//! handshakes are handed to `axum::serve` through a channel.

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
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

/// A listener whose connections are TLS streams, for `axum::serve`.
pub struct TlsListener {
    local: SocketAddr,
    incoming: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, incoming) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                // As on plain TCP (`serve.rs`): small writes (SSE events) go out at once.
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { local, incoming })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(conn) => conn,
            // The acceptor task ended (it never does while the listener lives).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Serves `router` on a TLS listener with the peer address as `ConnectInfo` (as on plain TCP).
pub async fn serve_tls(
    listener: TlsListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let make = tower::service_fn(
        move |incoming: axum::serve::IncomingStream<'_, TlsListener>| {
            let service = tower::Layer::layer(
                &axum::Extension(ConnectInfo(*incoming.remote_addr())),
                router.clone(),
            );
            async move { Ok::<_, std::convert::Infallible>(service) }
        },
    );
    axum::serve(listener, make)
        .with_graceful_shutdown(shutdown)
        .await
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
