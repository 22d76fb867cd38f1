//! Contract servers for the two HTTP APIs the production adapters speak that have no emulator:
//! the Google Cloud API Keys API v2 with Google's OAuth 2.0 token endpoint for service accounts
//! ([`GoogleApiKeys`]), and the Jira Cloud platform REST API v3 ([`Jira`]).
//!
//! Nobody publishes a local stand-in for either service, so these servers are written here, in
//! the tests, from the public references:
//!
//! - **Google**: the API Keys v2 REST reference (`projects.locations.keys.list`, `.get`,
//!   `.patch`, `operations.get`, the `Key` and `Operation` resources), the AIP rules those
//!   follow (field masks, page tokens, `google.rpc.Status` error bodies, etags), and the
//!   "Using OAuth 2.0 for server to server applications" guide for the JWT-bearer grant
//!   (RFC 7523) at the key file's `token_uri`.
//! - **Jira**: the Jira Cloud platform REST API v3 reference (issues, issue comments with
//!   entity properties, transitions, `myself`), its Basic authentication with an API token, and
//!   the Atlassian Document Format structure for comment bodies.
//!
//! They are *strict*: a request a real server would refuse is refused, with the status and the
//! error body that server documents, so an adapter that passes here fails there only on what
//! these servers leave out. Where the reference leaves a detail open the servers take the
//! stricter reading and say so on the item. Each runs on a thread of its own with its own tokio
//! runtime (a test may block its runtime with synchronous work while an adapter waits on the
//! server), listens on 127.0.0.1 at a port of the system's choosing, and stops when its handle
//! is dropped. The handle seeds state, injects faults (`fail_next`) and shows what was received.
//!
//! What they do **not** model:
//!
//! - Google: creating, deleting, undeleting or looking up keys, key strings
//!   (`.../keyString`, `keys:lookupKey`), deleted keys and `showDeleted` (accepted, no effect),
//!   the `fields` system parameter (refused rather than ignored, so a partial answer is never
//!   mistaken for a whole one), `access_token` in the query string, IAM beyond "the one
//!   project of the service account", operations that end in an error, quotas other than the
//!   injected faults, key-type restrictions' own validity rules (fingerprints, IP ranges, referrer
//!   syntax) beyond their JSON types and a non-empty referrer, and nested field-mask paths
//!   (`restrictions.browserKeyRestrictions` is refused; Google may accept it). The token
//!   endpoint checks what the JWT-bearer grant documents; it does not model user consent,
//!   domain-wide delegation (`sub` is accepted, unchecked), refresh tokens or ID tokens.
//! - Jira: projects, issue types, custom fields, screens (any `fields`/`update` on a
//!   transition is refused as Jira refuses a field not on the transition's screen), resolutions,
//!   users other than the one account, groups and roles (comment `visibility` is accepted by
//!   shape only), editing or deleting comments, comment property endpoints, JQL search, XSRF
//!   checks (Jira skips them for API-token requests that do not look like a browser), Atlassian
//!   Document Format nodes other than `paragraph`, `text` (with marks) and `hardBreak` (valid
//!   in Jira, refused here so an adapter's bodies stay in the subset it is known to render),
//!   anonymous access (every request must authenticate), OAuth and Connect JWT authentication.
//! - Both: HTTP/2, TLS, request size limits other than axum's default (2 MB), rate limits other
//!   than the injected faults, and time passing other than the wall clock.

// A refusal is the HTTP answer itself, built at most once per request: boxing it would buy
// nothing.
#![allow(clippy::result_large_err)]

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

pub mod google;
pub mod jira;

pub use google::GoogleApiKeys;
pub use jira::Jira;

/// The thread one contract server runs on; dropping it stops the server and joins the thread.
struct ServerThread {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// A listener on 127.0.0.1 at a port of the system's choosing, bound before the server's state
/// is built so the state can know its own address (a token URI, `self` links).
fn bind() -> (TcpListener, u16) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("local address").port();
    (listener, port)
}

impl ServerThread {
    fn spawn(name: &str, listener: TcpListener, router: Router) -> Self {
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener for tokio");
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the contract server");
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let serve = std::future::IntoFuture::into_future(axum::serve(listener, router));
                    // The stop signal ends the server at once: dropping the runtime drops every
                    // connection, so a client's idle keep-alive cannot hold the thread.
                    tokio::select! {
                        served = serve => {
                            if let Err(e) = served {
                                eprintln!("contract server stopped: {e}");
                            }
                        }
                        _ = stopped => {}
                    }
                });
            })
            .expect("spawn the contract server's thread");
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The state behind a mutex, whether or not a handler panicked while holding it (a panicking
/// test must still be able to read what the server received).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The next `remaining` requests answer `code` (and `Retry-After: retry_after_s` when set).
#[derive(Debug, Default)]
struct Faults {
    remaining: usize,
    code: u16,
    retry_after_s: Option<u64>,
}

impl Faults {
    fn set(&mut self, count: usize, code: u16, retry_after_s: Option<u64>) {
        assert!(
            StatusCode::from_u16(code).is_ok_and(|s| s.is_client_error() || s.is_server_error()),
            "fail_next needs an error status, not {code}"
        );
        *self = Self {
            remaining: count,
            code,
            retry_after_s,
        };
    }

    /// The fault this request answers with, if one is pending.
    fn take(&mut self) -> Option<(StatusCode, Option<u64>)> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Some((status, self.retry_after_s))
    }
}

/// A JSON answer, with `Retry-After` when given.
fn json_answer(status: StatusCode, body: Value, retry_after_s: Option<u64>) -> Response {
    let mut answer = (status, axum::Json(body)).into_response();
    if let Some(seconds) = retry_after_s {
        answer.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(seconds),
        );
    }
    answer
}

/// `n` random bytes from the operating system.
fn random_bytes(n: usize) -> Vec<u8> {
    use ring::rand::SecureRandom;
    let mut bytes = vec![0; n];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("random bytes");
    bytes
}

fn random_hex(n: usize) -> String {
    random_bytes(n).iter().map(|b| format!("{b:02x}")).collect()
}

/// A random UUID-shaped string (8-4-4-4-12 hex digits), the shape of Google's key ids and uids.
fn random_uuid() -> String {
    let hex = random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Seconds since the Unix epoch, and the moment as chrono's UTC time.
fn now() -> (i64, chrono::DateTime<chrono::Utc>) {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    let seconds = i64::try_from(since.as_secs()).expect("seconds fit i64");
    let moment = chrono::DateTime::from_timestamp(seconds, since.subsec_nanos())
        .expect("a representable time");
    (seconds, moment)
}

/// A query string's pairs, percent-decoded, in order.
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The request as the servers' logs show it: `METHOD path?query`.
fn request_line(method: &axum::http::Method, uri: &axum::http::Uri) -> String {
    match uri.query() {
        Some(q) => format!("{method} {}?{q}", uri.path()),
        None => format!("{method} {}", uri.path()),
    }
}

/// Whether the request says its body is JSON (`application/json`, any parameters).
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}
