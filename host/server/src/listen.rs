//! How every listener takes connections: a cap on open connections, a deadline on each TLS
//! handshake, on reading each request's headers (which is also the keep-alive idle limit: the
//! clock starts when the connection waits for its next request) and on producing each response,
//! HTTP/2 pings that drop dead peers, and a bounded drain at shutdown.
//!
//! `axum::serve` has none of these (it runs hyper without a timer, which also switches off
//! hyper's own 30 s header deadline), so a client that opens connections and sends nothing, or a
//! header a byte a minute, could hold the node's sockets and tasks for ever.

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// `[connections]`: the limits of every listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionLimits {
    /// Connections open at once per listener; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// To finish a TLS handshake.
    pub tls_handshake_ms: u64,
    /// To send a request's headers, counted from when the connection is ready for it (so also
    /// how long a kept-alive HTTP/1 connection may sit idle).
    pub header_read_ms: u64,
    /// To read a request's body and produce its response head (a stream's body may then run
    /// on: event streams end on their own terms).
    pub request_ms: u64,
    /// At shutdown, for requests in flight to finish before their connections are closed.
    pub drain_ms: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            tls_handshake_ms: 10_000,
            header_read_ms: 10_000,
            request_ms: 30_000,
            drain_ms: 30_000,
        }
    }
}

/// Serves `router` on `listener` (TLS when `tls` is given) under `limits` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let request_ms = limits.request_ms;
    let router = router.layer(axum::middleware::from_fn(move |req, next| {
        request_deadline(Duration::from_millis(request_ms), req, next)
    }));
    let acceptor = tls.map(TlsAcceptor::from);
    // Plain HTTP sent to a TLS port is answered 301 to the same port over HTTPS (the partner
    // contract: "plain HTTP is redirected with status 301") rather than with a failed handshake.
    let plain_redirect = crate::tls::redirect_router(listener.local_addr()?.port());
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_ms));
    builder
        .http2()
        .timer(TokioTimer::new())
        .enable_connect_protocol()
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let handshake = Duration::from_millis(limits.tls_handshake_ms);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, say: wait a little instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // TCP_NODELAY: without it, Nagle's algorithm holds a small write (an SSE event, a
        // response written in pieces) while an earlier segment awaits its ACK, which the peer
        // may delay by up to 40 ms (measured in BENCHMARKS.md).
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(tower::Layer::layer(
            &axum::Extension(ConnectInfo(peer)),
            router.clone(),
        ));
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let plain_redirect = plain_redirect.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let served = match acceptor {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                    watcher.watch(conn.into_owned()).await
                }
                Some(acceptor) => {
                    // One deadline for the first byte and the handshake together.
                    let deadline = tokio::time::Instant::now() + handshake;
                    // A TLS connection opens with a handshake record (content type 22).
                    let mut first = [0u8; 1];
                    match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
                        Ok(Ok(1)) if first[0] != 0x16 => {
                            let service = TowerToHyperService::new(plain_redirect);
                            let conn = builder.serve_connection(TokioIo::new(tcp), service);
                            if let Err(error) = watcher.watch(conn.into_owned()).await {
                                tracing::debug!(%peer, %error, "plain-HTTP redirect ended with an error");
                            }
                            return;
                        }
                        Ok(Ok(1)) => {}
                        // Closed, failed, or silent past the handshake deadline.
                        _ => return,
                    }
                    match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let conn = builder
                                .serve_connection_with_upgrades(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let drain = Duration::from_millis(limits.drain_ms);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_ms = limits.drain_ms,
            "connections still busy after the drain deadline: closing them"
        );
    }
    Ok(())
}

/// Answers 408 when a request's body and response head take longer than `limit`; the error is
/// in the shape of the API the path belongs to.
async fn request_deadline(limit: Duration, req: Request, next: Next) -> Response {
    let partner = req.uri().path().starts_with("/api/public/");
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            let message = format!(
                "The request did not complete within {} ms.",
                limit.as_millis()
            );
            let body = if partner {
                json!({"status": 408, "error": {"code": "E_REQUEST_TIMEOUT", "message": message}})
            } else {
                json!({"error": "request_timeout", "message": message})
            };
            (StatusCode::REQUEST_TIMEOUT, axum::Json(body)).into_response()
        }
    }
}
