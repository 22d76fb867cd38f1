//! The Google Cloud API Keys API v2 (`apikeys.googleapis.com/v2`) and the OAuth 2.0 token
//! endpoint a service account's key file names (`token_uri`), on one listener.
//!
//! - **Token endpoint** (`POST /token`): the JWT-bearer grant (RFC 7523) as Google documents it
//!   for service accounts: an RS256 JWT signed with the key file's private key, `iss` the
//!   account's email, `aud` the token URI, `scope` the scopes asked for, `iat`/`exp` at most an
//!   hour apart and around now. Errors are OAuth 2.0 error bodies (`invalid_request`,
//!   `unsupported_grant_type`, `invalid_grant`, `invalid_scope`), as Google answers them. The
//!   JWT's parts are base64url; padding is accepted as Google accepts it (the `gcp_auth` crate
//!   pads), the standard alphabet (`+`, `/`) is not.
//! - **Scopes** are checked where Google checks them: a token is granted for the scopes asked,
//!   and an API call whose token lacks `cloud-platform` (`cloud-platform.read-only` for reads)
//!   is 403 `ACCESS_TOKEN_SCOPE_INSUFFICIENT`.
//! - **Projects** are addressed by id or number; resource names are answered with the number,
//!   as Google does (`projects/<number>/locations/global/keys/<id>`), so an adapter must not
//!   expect its project id back.
//! - **Changes** are long-running operations: a PATCH answers `{"name": "operations/..."}`
//!   (no `done` while pending: proto3 JSON leaves false out), and the key changes only when
//!   the operation completes, on the k-th `GET` of it ([`GoogleApiKeys::set_polls_until_done`]),
//!   or before the next PATCH of its key is judged, whichever comes first. Writes to one key
//!   take effect in the order they were accepted, as on any linearizable store: an operation
//!   nobody polls (its writer was killed) is not left to land later over changes accepted
//!   after it.
//! - **Stricter than the reference** where it is silent or permissive: `updateMask` is
//!   required (Google would imply one from the body), and a `name` in the PATCH body must be
//!   the key's own.

use super::{
    Faults, ServerThread, bind, is_json, json_answer, lock, now, query_pairs, random_bytes,
    random_hex, random_uuid, request_line,
};
use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::{Arc, Mutex};

const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
const CLOUD_PLATFORM_READ_ONLY: &str = "https://www.googleapis.com/auth/cloud-platform.read-only";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const KEY_TYPE: &str = "type.googleapis.com/google.api.apikeys.v2.Key";
/// What Google answers as `expires_in` for a fresh access token.
const TOKEN_LIFETIME_S: i64 = 3599;
/// How far a JWT's `iat` may be ahead of this clock (the signer's clock may run fast).
const CLOCK_SKEW_S: i64 = 300;

/// base64url as JWTs use it; trailing `=` padding allowed or not, as Google's endpoint allows.
const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

type Shared = Arc<Mutex<State>>;

/// The API Keys API v2 and the service account's token endpoint; see the module docs.
pub struct GoogleApiKeys {
    state: Shared,
    port: u16,
    project: String,
    private_key_pem: String,
    private_key_id: String,
    _server: ServerThread,
}

struct State {
    project: String,
    project_number: String,
    client_email: String,
    token_uri: String,
    private_key_id: String,
    /// PKCS#1 `RSAPublicKey`, DER: what ring verifies RS256 with.
    public_key: Vec<u8>,
    tokens: HashMap<String, Grant>,
    tokens_issued: usize,
    keys: Vec<Key>,
    page_size: usize,
    page_tokens: HashMap<String, usize>,
    referrer_limit: usize,
    polls_until_done: usize,
    operations: BTreeMap<String, Operation>,
    /// Applied to a key just before its next PATCH is judged (another writer got there first).
    races: HashMap<String, Vec<String>>,
    faults: Faults,
    patches: Vec<Value>,
    requests: Vec<String>,
}

struct Grant {
    expires_at: i64,
    scopes: Vec<String>,
}

struct Key {
    id: String,
    uid: String,
    display_name: String,
    create_time: String,
    update_time: String,
    restrictions: Option<Value>,
    annotations: Map<String, Value>,
    etag: String,
}

/// The mutable fields a PATCH's mask named, with the values they take.
#[derive(Clone)]
struct Change {
    display_name: Option<String>,
    restrictions: Option<Option<Value>>,
    annotations: Option<Map<String, Value>>,
}

struct Operation {
    key_id: String,
    change: Change,
    /// GETs of the operation so far.
    polls: usize,
    /// The key as the completed change left it.
    response: Option<Value>,
}

impl GoogleApiKeys {
    /// A server for `project` with no keys, and a fresh RSA-2048 service-account key.
    pub fn start(project: &str) -> Self {
        let (private_key_pem, public_key) = rsa_key();
        let (listener, port) = bind();
        let private_key_id = random_hex(20);
        let project_number = project_number();
        let state = Arc::new(Mutex::new(State {
            project: project.to_owned(),
            project_number,
            client_email: format!("capstan@{project}.iam.gserviceaccount.com"),
            token_uri: format!("http://127.0.0.1:{port}/token"),
            private_key_id: private_key_id.clone(),
            public_key,
            tokens: HashMap::new(),
            tokens_issued: 0,
            keys: Vec::new(),
            page_size: 300,
            page_tokens: HashMap::new(),
            referrer_limit: 1200,
            polls_until_done: 1,
            operations: BTreeMap::new(),
            races: HashMap::new(),
            faults: Faults::default(),
            patches: Vec::new(),
            requests: Vec::new(),
        }));
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let server = ServerThread::spawn("google-apikeys", listener, router);
        Self {
            state,
            port,
            project: project.to_owned(),
            private_key_pem,
            private_key_id,
            _server: server,
        }
    }

    /// The API root (`https://apikeys.googleapis.com` in production): `/v2/...` hangs under it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The token endpoint the key file names.
    pub fn token_uri(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    /// The project's number, which resource names carry.
    pub fn project_number(&self) -> String {
        lock(&self.state).project_number.clone()
    }

    pub fn client_email(&self) -> String {
        lock(&self.state).client_email.clone()
    }

    /// The service account's JSON key file, as the Cloud console downloads it (with this
    /// server's token URI).
    pub fn service_account_json(&self) -> String {
        let s = lock(&self.state);
        json!({
            "type": "service_account",
            "project_id": self.project,
            "private_key_id": self.private_key_id,
            "private_key": self.private_key_pem,
            "client_email": s.client_email,
            "client_id": "1",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": s.token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        })
        .to_string()
    }

    /// How many access tokens the token endpoint granted.
    pub fn tokens_issued(&self) -> usize {
        lock(&self.state).tokens_issued
    }

    /// The most keys one list page holds, whatever `pageSize` asks (default 300).
    pub fn set_page_size(&self, n: usize) {
        assert!(n > 0, "a page holds at least one key");
        lock(&self.state).page_size = n;
    }

    /// The most referrers a key may hold (default 1200); a PATCH over it is INVALID_ARGUMENT.
    pub fn set_referrer_limit(&self, n: usize) {
        lock(&self.state).referrer_limit = n;
    }

    /// A change completes on the k-th GET of its operation (default 1); 0: the PATCH's own
    /// answer is the completed operation. A pending operation is judged by the setting at the
    /// time of each GET: lowering it lets an operation left pending complete on its next GET.
    pub fn set_polls_until_done(&self, k: usize) {
        lock(&self.state).polls_until_done = k;
    }

    /// The next `count` `/v2` requests answer `code` with Google's error body (429
    /// RESOURCE_EXHAUSTED, 500 INTERNAL, 503 UNAVAILABLE, ...) and `Retry-After` when given.
    /// The token endpoint is not affected.
    pub fn fail_next(&self, count: usize, code: u16, retry_after_s: Option<u64>) {
        lock(&self.state).faults.set(count, code, retry_after_s);
    }

    /// A browser key: website restrictions with these referrers.
    pub fn add_key(&self, id: &str, display_name: &str, referrers: &[&str]) {
        let mut browser = json!({});
        if !referrers.is_empty() {
            browser["allowedReferrers"] = json!(referrers);
        }
        self.insert(
            id,
            display_name,
            Some(json!({"browserKeyRestrictions": browser})),
        );
    }

    /// A server key: IP address restrictions, no website restrictions.
    pub fn add_server_key(&self, id: &str, display_name: &str) {
        self.insert(
            id,
            display_name,
            Some(json!({"serverKeyRestrictions": {"allowedIps": ["203.0.113.7"]}})),
        );
    }

    /// A key without any restrictions.
    pub fn add_unrestricted_key(&self, id: &str, display_name: &str) {
        self.insert(id, display_name, None);
    }

    fn insert(&self, id: &str, display_name: &str, restrictions: Option<Value>) {
        let mut s = lock(&self.state);
        assert!(
            s.keys.iter().all(|k| k.id != id),
            "key {id} is already there"
        );
        let time = timestamp();
        s.keys.push(Key {
            id: id.to_owned(),
            uid: random_uuid(),
            display_name: display_name.to_owned(),
            create_time: time.clone(),
            update_time: time,
            restrictions,
            annotations: Map::new(),
            etag: etag(),
        });
    }

    /// The key's website referrers now (empty for a key without website restrictions).
    pub fn referrers(&self, id: &str) -> Vec<String> {
        let s = lock(&self.state);
        let key = s
            .keys
            .iter()
            .find(|k| k.id == id)
            .unwrap_or_else(|| panic!("no key {id}"));
        referrers_of(key.restrictions.as_ref())
    }

    /// The key's etag now.
    pub fn etag(&self, id: &str) -> String {
        let s = lock(&self.state);
        let key = s
            .keys
            .iter()
            .find(|k| k.id == id)
            .unwrap_or_else(|| panic!("no key {id}"));
        key.etag.clone()
    }

    /// Another writer changes the key just before its next PATCH is judged: its referrers
    /// become `referrers` and its etag changes, so a PATCH carrying the etag it read is
    /// ABORTED.
    pub fn change_before_next_patch(&self, id: &str, referrers: &[&str]) {
        lock(&self.state).races.insert(
            id.to_owned(),
            referrers.iter().map(|r| (*r).to_owned()).collect(),
        );
    }

    /// Every key as one list page would answer it (`{}` when there is none).
    pub fn keys(&self) -> Value {
        let s = lock(&self.state);
        let keys: Vec<Value> = s.keys.iter().map(|k| s.render(k)).collect();
        if keys.is_empty() {
            json!({})
        } else {
            json!({ "keys": keys })
        }
    }

    /// Every authenticated PATCH of a key, refused or not, oldest first: `{"key", "query":
    /// {name: value}, "body", "precondition", "status"}`, `precondition` telling whether the
    /// body carried a (non-empty) etag and `status` the HTTP status answered.
    pub fn patches(&self) -> Vec<Value> {
        lock(&self.state).patches.clone()
    }

    /// Every request received, `METHOD path?query`, oldest first.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }
}

/// An RSA-2048 key pair by `openssl`: the private key as PKCS#8 PEM (what a key file holds)
/// and the public key as PKCS#1 DER (what ring verifies with).
fn rsa_key() -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().expect("a temp dir for the RSA key");
    let private = dir.path().join("key.pem");
    let public = dir.path().join("public.der");
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("run openssl");
        assert!(
            out.status.success(),
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&private));
    run(Command::new("openssl")
        .arg("rsa")
        .arg("-in")
        .arg(&private)
        .args(["-RSAPublicKey_out", "-outform", "DER", "-out"])
        .arg(&public));
    let pem = std::fs::read_to_string(&private).expect("read the private key");
    assert!(
        pem.starts_with("-----BEGIN PRIVATE KEY-----"),
        "openssl genpkey wrote no PKCS#8 key"
    );
    (pem, std::fs::read(&public).expect("read the public key"))
}

/// A 12-digit project number.
fn project_number() -> String {
    let digits: String = random_bytes(12)
        .iter()
        .map(|b| char::from(b'0' + b % 10))
        .collect();
    format!("1{}", &digits[1..])
}

/// An RFC 3339 UTC timestamp with microseconds, as Google writes them.
fn timestamp() -> String {
    now().1.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A weak etag as the API answers them: `W/"<base64 of 16 bytes>"`.
fn etag() -> String {
    format!(
        "W/\"{}\"",
        base64::engine::general_purpose::STANDARD.encode(random_bytes(16))
    )
}

fn referrers_of(restrictions: Option<&Value>) -> Vec<String> {
    restrictions
        .and_then(|r| r["browserKeyRestrictions"]["allowedReferrers"].as_array())
        .map(|all| {
            all.iter()
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The canonical `google.rpc.Code` name of an HTTP status, as Google's error bodies carry it.
fn status_name(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        412 => "FAILED_PRECONDITION",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        500 => "INTERNAL",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// Google's error body: `{"error": {"code", "message", "status", "details"?}}`, with an
/// `ErrorInfo` detail when there is a machine-readable reason.
fn error_with(code: StatusCode, message: &str, reason: Option<&str>) -> Response {
    let mut error = json!({
        "code": code.as_u16(),
        "message": message,
        "status": status_name(code),
    });
    if let Some(reason) = reason {
        error["details"] = json!([{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "googleapis.com",
            "metadata": {"service": "apikeys.googleapis.com"},
        }]);
    }
    json_answer(code, json!({ "error": error }), None)
}

fn error(code: StatusCode, message: &str) -> Response {
    error_with(code, message, None)
}

fn invalid(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// An OAuth 2.0 error of the token endpoint.
fn oauth_error(code: StatusCode, error: &str, description: &str) -> Response {
    json_answer(
        code,
        json!({"error": error, "error_description": description}),
        None,
    )
}

fn unauthenticated(message: &str, reason: &str, invalid_token: bool) -> Response {
    let mut answer = error_with(StatusCode::UNAUTHORIZED, message, Some(reason));
    let challenge = if invalid_token {
        r#"Bearer realm="https://accounts.google.com/", error="invalid_token""#
    } else {
        r#"Bearer realm="https://accounts.google.com/""#
    };
    answer.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    answer
}

async fn handle(
    Extract(state): Extract<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lock(&state).answer(&method, &uri, &headers, &body)
}

/// A method's query parameters: (JSON name, proto name).
type Params = &'static [(&'static str, &'static str)];

const LIST_PARAMS: Params = &[
    ("pageSize", "page_size"),
    ("pageToken", "page_token"),
    ("showDeleted", "show_deleted"),
];
const PATCH_PARAMS: Params = &[("updateMask", "update_mask")];

impl State {
    fn answer(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
        self.requests.push(request_line(method, uri));
        let path = uri.path();
        if path == "/token" {
            return self.token(method, headers, body);
        }
        let Some(rest) = path.strip_prefix("/v2/") else {
            return error(
                StatusCode::NOT_FOUND,
                &format!("The requested URL {path} was not found on this server."),
            );
        };
        if let Some((code, retry_after_s)) = self.faults.take() {
            let mut answer = error(code, "Injected by the contract server.");
            if let Some(seconds) = retry_after_s {
                answer
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            return answer;
        }
        let scopes = match self.authenticate(headers) {
            Ok(scopes) => scopes,
            Err(answer) => return answer,
        };
        let query = query_pairs(uri.query());
        let segments: Vec<&str> = rest.split('/').collect();
        let unimplemented = || {
            error(
                StatusCode::NOT_IMPLEMENTED,
                &format!("{method} {path} is part of the API but not of this contract server."),
            )
        };
        match segments.as_slice() {
            ["operations", id] if *method == Method::GET => {
                if let Err(answer) = params(&query, &[]) {
                    return answer;
                }
                if let Err(answer) = scope(&scopes, true) {
                    return answer;
                }
                self.operation(&format!("operations/{id}"))
            }
            ["projects", project, "locations", location, "keys"] => {
                let read = *method == Method::GET;
                if !read && *method != Method::POST {
                    return error(StatusCode::NOT_FOUND, "Method not found.");
                }
                if let Err(answer) = self.resource(project, location, &scopes, read, "list") {
                    return answer;
                }
                if !read {
                    return unimplemented();
                }
                match params(&query, LIST_PARAMS) {
                    Ok(query) => self.list(&query),
                    Err(answer) => answer,
                }
            }
            ["projects", project, "locations", location, "keys", id] => {
                let (read, permission) = match method.as_str() {
                    "GET" => (true, "get"),
                    "PATCH" => (false, "update"),
                    "DELETE" => (false, "delete"),
                    "POST" if id.ends_with(":undelete") => (false, "undelete"),
                    _ => return error(StatusCode::NOT_FOUND, "Method not found."),
                };
                if let Err(answer) = self.resource(project, location, &scopes, read, permission) {
                    return answer;
                }
                match method.as_str() {
                    "GET" => match params(&query, &[]) {
                        Ok(_) => self.get(id),
                        Err(answer) => answer,
                    },
                    "PATCH" => {
                        let answer = match params(&query, PATCH_PARAMS) {
                            Ok(params) => self.patch(id, &params, headers, body),
                            Err(answer) => answer,
                        };
                        self.patches.push(json!({
                            "key": id,
                            "query": Value::Object(query.iter().map(|(k, v)| (k.clone(), json!(v))).collect()),
                            "body": serde_json::from_slice::<Value>(body)
                                .unwrap_or_else(|_| json!(String::from_utf8_lossy(body))),
                            "precondition": serde_json::from_slice::<Value>(body)
                                .is_ok_and(|b| b["etag"].as_str().is_some_and(|e| !e.is_empty())),
                            "status": answer.status().as_u16(),
                        }));
                        answer
                    }
                    _ => unimplemented(),
                }
            }
            ["projects", _, "locations", _, "keys", _, "keyString"] | ["keys:lookupKey"] => {
                unimplemented()
            }
            _ => error(
                StatusCode::NOT_FOUND,
                &format!("The requested URL {path} was not found on this server."),
            ),
        }
    }

    /// The scopes of the request's access token, or 401.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Vec<String>, Response> {
        const MISSING: &str = "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.";
        const INVALID: &str = "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.";
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(unauthenticated(MISSING, "CREDENTIALS_MISSING", false));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        let Some(token) = token else {
            return Err(unauthenticated(
                INVALID,
                "ACCESS_TOKEN_TYPE_UNSUPPORTED",
                true,
            ));
        };
        let Some(grant) = self.tokens.get(token) else {
            return Err(unauthenticated(
                INVALID,
                "ACCESS_TOKEN_TYPE_UNSUPPORTED",
                true,
            ));
        };
        if grant.expires_at <= now().0 {
            return Err(unauthenticated(INVALID, "ACCESS_TOKEN_EXPIRED", true));
        }
        Ok(grant.scopes.clone())
    }

    /// Scope, project and location checks of a request on `projects/{p}/locations/{l}/keys`.
    fn resource(
        &self,
        project: &str,
        location: &str,
        scopes: &[String],
        read: bool,
        permission: &str,
    ) -> Result<(), Response> {
        scope(scopes, read)?;
        if project != self.project && project != self.project_number {
            return Err(error_with(
                StatusCode::FORBIDDEN,
                &format!(
                    "Permission 'apikeys.keys.{permission}' denied on resource (or it may not exist)."
                ),
                Some("IAM_PERMISSION_DENIED"),
            ));
        }
        if location != "global" {
            return Err(invalid(&format!(
                "Location '{location}' is not supported: keys are global resources, the only supported location is 'global'."
            )));
        }
        Ok(())
    }

    fn render(&self, key: &Key) -> Value {
        let mut v = json!({
            "name": format!("projects/{}/locations/global/keys/{}", self.project_number, key.id),
            "uid": key.uid,
            "createTime": key.create_time,
            "updateTime": key.update_time,
            "etag": key.etag,
        });
        // proto3 JSON leaves out empty strings and maps and unset messages.
        if !key.display_name.is_empty() {
            v["displayName"] = json!(key.display_name);
        }
        if let Some(restrictions) = &key.restrictions {
            v["restrictions"] = restrictions.clone();
        }
        if !key.annotations.is_empty() {
            v["annotations"] = Value::Object(key.annotations.clone());
        }
        v
    }

    fn list(&mut self, query: &HashMap<&'static str, String>) -> Response {
        let requested = match query.get("pageSize").map(|v| v.parse::<i32>()) {
            None => 0,
            Some(Ok(n)) if n >= 0 => n,
            Some(Ok(_)) => return invalid("The page size must not be negative."),
            Some(Err(_)) => {
                return invalid(&format!(
                    "Invalid value at 'page_size' (TYPE_INT32), \"{}\"",
                    query["pageSize"]
                ));
            }
        };
        if let Some(show) = query.get("showDeleted")
            && show != "true"
            && show != "false"
        {
            return invalid(&format!(
                "Invalid value at 'show_deleted' (TYPE_BOOL), \"{show}\""
            ));
        }
        let offset = match query.get("pageToken").map(String::as_str) {
            None | Some("") => 0,
            Some(token) => match self.page_tokens.get(token) {
                Some(offset) => *offset,
                None => return invalid("The page token is not valid."),
            },
        };
        let size = match usize::try_from(requested) {
            Ok(0) | Err(_) => self.page_size,
            Ok(n) => n.min(self.page_size),
        };
        let end = (offset + size).min(self.keys.len());
        let keys: Vec<Value> = self
            .keys
            .get(offset..end)
            .unwrap_or_default()
            .iter()
            .map(|k| self.render(k))
            .collect();
        let mut body = json!({});
        if !keys.is_empty() {
            body["keys"] = json!(keys);
        }
        if end < self.keys.len() {
            let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(24));
            self.page_tokens.insert(token.clone(), end);
            body["nextPageToken"] = json!(token);
        }
        json_answer(StatusCode::OK, body, None)
    }

    fn key_not_found(&self, id: &str) -> Response {
        error(
            StatusCode::NOT_FOUND,
            &format!(
                "Key 'projects/{}/locations/global/keys/{id}' not found.",
                self.project_number
            ),
        )
    }

    fn get(&self, id: &str) -> Response {
        match self.keys.iter().find(|k| k.id == id) {
            Some(key) => json_answer(StatusCode::OK, self.render(key), None),
            None => self.key_not_found(id),
        }
    }

    fn patch(
        &mut self,
        id: &str,
        query: &HashMap<&'static str, String>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Response {
        let Some(mask) = query.get("updateMask") else {
            return invalid(
                "updateMask is required: name the fields to change (displayName, restrictions, annotations).",
            );
        };
        let mut fields = Vec::new();
        for path in mask.split(',').map(str::trim) {
            let field = match path {
                "displayName" | "display_name" => "displayName",
                "restrictions" => "restrictions",
                "annotations" => "annotations",
                "*" => "*",
                other => {
                    return invalid(&format!(
                        "Invalid update mask path '{other}': the mutable fields are displayName, restrictions and annotations."
                    ));
                }
            };
            fields.push(field);
        }
        if !is_json(headers) {
            return invalid("Invalid JSON payload received: the body must be application/json.");
        }
        let parsed: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return invalid(&format!("Invalid JSON payload received. {e}")),
        };
        let key_body = match normalise(&parsed, &Ty::Obj(KEY), "key") {
            Ok(Some(v)) => v,
            Ok(None) => json!({}),
            Err(message) => return invalid(&message),
        };
        if let Some(name) = key_body["name"].as_str()
            && name != format!("projects/{}/locations/global/keys/{id}", self.project)
            && name
                != format!(
                    "projects/{}/locations/global/keys/{id}",
                    self.project_number
                )
        {
            return invalid(&format!(
                "The key's name '{name}' is not the name in the URL."
            ));
        }
        self.complete_pending(id);
        if let Some(referrers) = self.races.remove(id)
            && let Some(key) = self.keys.iter_mut().find(|k| k.id == id)
        {
            let mut restrictions = key.restrictions.clone().unwrap_or_else(|| json!({}));
            restrictions["browserKeyRestrictions"] = if referrers.is_empty() {
                json!({})
            } else {
                json!({ "allowedReferrers": referrers })
            };
            key.restrictions = Some(restrictions);
            key.etag = etag();
            key.update_time = timestamp();
        }
        let Some(key) = self.keys.iter().find(|k| k.id == id) else {
            return self.key_not_found(id);
        };
        if let Some(sent) = key_body["etag"].as_str()
            && sent != key.etag
        {
            return error(StatusCode::CONFLICT, "etag mismatch");
        }
        let all = fields.contains(&"*");
        let named = |field: &str| all || fields.contains(&field);
        let change = Change {
            display_name: named("displayName").then(|| {
                key_body["displayName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            }),
            restrictions: named("restrictions").then(|| key_body.get("restrictions").cloned()),
            annotations: named("annotations").then(|| {
                key_body["annotations"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
            }),
        };
        if let Some(restrictions) = &change.restrictions {
            let referrers = referrers_of(restrictions.as_ref());
            if referrers.len() > self.referrer_limit {
                return invalid(&format!(
                    "A key allows at most {} HTTP referrers; this one names {}.",
                    self.referrer_limit,
                    referrers.len()
                ));
            }
        }
        let name = format!(
            "operations/akmf.p7-{}-{}",
            self.project_number,
            random_uuid()
        );
        self.operations.insert(
            name.clone(),
            Operation {
                key_id: id.to_owned(),
                change,
                polls: 0,
                response: None,
            },
        );
        if self.polls_until_done == 0 {
            self.complete(&name);
        }
        json_answer(StatusCode::OK, self.render_operation(&name), None)
    }

    /// Completes the key's pending operation, so a PATCH is judged against every change
    /// accepted before it. There is at most one: each PATCH completes the one before it.
    fn complete_pending(&mut self, key_id: &str) {
        let pending = self
            .operations
            .iter()
            .find(|(_, op)| op.key_id == key_id && op.response.is_none())
            .map(|(name, _)| name.clone());
        if let Some(name) = pending {
            self.complete(&name);
        }
    }

    /// Applies a pending operation's change to its key.
    fn complete(&mut self, name: &str) {
        let Some(op) = self.operations.get(name) else {
            return;
        };
        let (key_id, change) = (op.key_id.clone(), op.change.clone());
        let Some(index) = self.keys.iter().position(|k| k.id == key_id) else {
            return;
        };
        let key = &mut self.keys[index];
        if let Some(display_name) = change.display_name {
            key.display_name = display_name;
        }
        if let Some(restrictions) = change.restrictions {
            key.restrictions = restrictions;
        }
        if let Some(annotations) = change.annotations {
            key.annotations = annotations;
        }
        key.etag = etag();
        key.update_time = timestamp();
        let mut response = Map::new();
        response.insert("@type".to_owned(), json!(KEY_TYPE));
        if let Value::Object(fields) = self.render(&self.keys[index]) {
            response.extend(fields);
        }
        if let Some(op) = self.operations.get_mut(name) {
            op.response = Some(Value::Object(response));
        }
    }

    fn render_operation(&self, name: &str) -> Value {
        match self
            .operations
            .get(name)
            .and_then(|op| op.response.as_ref())
        {
            Some(response) => json!({"name": name, "done": true, "response": response}),
            None => json!({ "name": name }),
        }
    }

    fn operation(&mut self, name: &str) -> Response {
        let polls_until_done = self.polls_until_done;
        let Some(op) = self.operations.get_mut(name) else {
            return error(
                StatusCode::NOT_FOUND,
                &format!("Operation '{name}' not found."),
            );
        };
        if op.response.is_none() {
            op.polls += 1;
            // Against the setting now, so a test can let an operation it left pending finish.
            if op.polls >= polls_until_done {
                self.complete(name);
            }
        }
        json_answer(StatusCode::OK, self.render_operation(name), None)
    }

    fn token(&mut self, method: &Method, headers: &HeaderMap, body: &[u8]) -> Response {
        if *method != Method::POST {
            return oauth_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request",
                "The token endpoint only accepts POST.",
            );
        }
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| {
                v.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            });
        let Some(text) = std::str::from_utf8(body).ok().filter(|_| form) else {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "The request body must be application/x-www-form-urlencoded.",
            );
        };
        let pairs = query_pairs(Some(text));
        let one = |name: &str| -> Result<Option<String>, Response> {
            let mut values = pairs.iter().filter(|(k, _)| k == name).map(|(_, v)| v);
            let first = values.next().cloned();
            if values.next().is_some() {
                return Err(oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    &format!("Duplicate parameter: {name}"),
                ));
            }
            Ok(first)
        };
        let grant_type = match one("grant_type") {
            Ok(Some(g)) => g,
            Ok(None) => {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "Missing required parameter: grant_type",
                );
            }
            Err(answer) => return answer,
        };
        if grant_type != JWT_BEARER {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                &format!("Invalid grant_type: {grant_type}"),
            );
        }
        let assertion = match one("assertion") {
            Ok(Some(a)) => a,
            Ok(None) => {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "Missing required parameter: assertion",
                );
            }
            Err(answer) => return answer,
        };
        let scopes = match self.verify(&assertion) {
            Ok(scopes) => scopes,
            Err((error, description)) => {
                return oauth_error(StatusCode::BAD_REQUEST, error, &description);
            }
        };
        let token = format!(
            "ya29.c.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(48))
        );
        self.tokens.insert(
            token.clone(),
            Grant {
                expires_at: now().0 + TOKEN_LIFETIME_S,
                scopes,
            },
        );
        self.tokens_issued += 1;
        json_answer(
            StatusCode::OK,
            json!({"access_token": token, "expires_in": TOKEN_LIFETIME_S, "token_type": "Bearer"}),
            None,
        )
    }

    /// The scopes a JWT-bearer assertion asks for, or the OAuth error and its description.
    fn verify(&self, assertion: &str) -> Result<Vec<String>, (&'static str, String)> {
        let grant = |d: &str| ("invalid_grant", d.to_owned());
        let parts: Vec<&str> = assertion.split('.').collect();
        let [header, payload, signature] = parts.as_slice() else {
            return Err(grant(
                "Invalid JWT: the assertion is not three dot-separated parts.",
            ));
        };
        let decode = |part: &str| BASE64URL.decode(part).ok().filter(|_| !part.is_empty());
        let (Some(header_json), Some(claims_json), Some(signature_bytes)) =
            (decode(header), decode(payload), decode(signature))
        else {
            return Err(grant("Invalid JWT: a part is not base64url."));
        };
        let (Ok(Value::Object(head)), Ok(Value::Object(claims))) = (
            serde_json::from_slice::<Value>(&header_json),
            serde_json::from_slice::<Value>(&claims_json),
        ) else {
            return Err(grant(
                "Invalid JWT: the header or the claims are not a JSON object.",
            ));
        };
        if head.get("alg").and_then(Value::as_str) != Some("RS256") {
            return Err(grant("Invalid JWT: the algorithm must be RS256."));
        }
        if head.get("typ").is_some_and(|t| t != "JWT") {
            return Err(grant("Invalid JWT: typ must be JWT."));
        }
        if head.contains_key("crit") {
            return Err(grant(
                "Invalid JWT: unsupported critical header parameters.",
            ));
        }
        if let Some(kid) = head.get("kid")
            && kid != self.private_key_id.as_str()
        {
            return Err(grant("Invalid JWT Signature."));
        }
        let signed = &assertion[..header.len() + 1 + payload.len()];
        let key = ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            &self.public_key,
        );
        if key.verify(signed.as_bytes(), &signature_bytes).is_err() {
            return Err(grant("Invalid JWT Signature."));
        }
        if claims.get("iss").and_then(Value::as_str) != Some(self.client_email.as_str()) {
            return Err(grant("Invalid grant: account not found"));
        }
        if claims.get("aud").and_then(Value::as_str) != Some(self.token_uri.as_str()) {
            return Err(grant(&format!(
                "Invalid JWT: Failed audience check. The expected audience is {}.",
                self.token_uri
            )));
        }
        let timeframe = "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.";
        let (Some(iat), Some(exp)) = (
            claims.get("iat").and_then(Value::as_i64),
            claims.get("exp").and_then(Value::as_i64),
        ) else {
            return Err(grant(timeframe));
        };
        let now = now().0;
        if exp - iat <= 0 || exp - iat > 3600 || iat > now + CLOCK_SKEW_S || exp <= now {
            return Err(grant(timeframe));
        }
        let scopes: Vec<String> = claims
            .get("scope")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let known = |s: &String| {
            s.starts_with("https://www.googleapis.com/auth/")
                || matches!(s.as_str(), "openid" | "email" | "profile")
        };
        if scopes.is_empty() || !scopes.iter().all(known) {
            return Err((
                "invalid_scope",
                "Invalid OAuth scope or ID token audience provided.".to_owned(),
            ));
        }
        Ok(scopes)
    }
}

/// 403 unless the token's scopes allow the call.
fn scope(scopes: &[String], read: bool) -> Result<(), Response> {
    let allowed = scopes
        .iter()
        .any(|s| s == CLOUD_PLATFORM || (read && s == CLOUD_PLATFORM_READ_ONLY));
    if allowed {
        Ok(())
    } else {
        Err(error_with(
            StatusCode::FORBIDDEN,
            "Request had insufficient authentication scopes.",
            Some("ACCESS_TOKEN_SCOPE_INSUFFICIENT"),
        ))
    }
}

/// A method's query parameters by JSON name, after Google's checks: every parameter must be
/// the method's or a system parameter this server models, and none may repeat.
fn params(
    query: &[(String, String)],
    method: Params,
) -> Result<HashMap<&'static str, String>, Response> {
    let mut found = HashMap::new();
    for (name, value) in query {
        let canonical = method
            .iter()
            .find(|(json, proto)| name == json || name == proto)
            .map(|(json, _)| *json);
        let canonical = match (canonical, name.as_str()) {
            (Some(c), _) => c,
            (None, "alt") if value == "json" => "alt",
            (None, "prettyPrint") if value == "true" || value == "false" => "prettyPrint",
            (None, "quotaUser") => "quotaUser",
            (None, "$.xgafv") if value == "1" || value == "2" => "$.xgafv",
            (None, "fields") => {
                return Err(invalid(
                    "The contract server does not model the `fields` system parameter.",
                ));
            }
            _ => {
                return Err(invalid(&format!(
                    "Invalid JSON payload received. Unknown name \"{name}\": Cannot bind query parameter. Field '{name}' could not be found in request message."
                )));
            }
        };
        if found.insert(canonical, value.clone()).is_some() {
            return Err(invalid(&format!(
                "Invalid JSON payload received. Repeated value for non-repeated field \"{name}\"."
            )));
        }
    }
    Ok(found)
}

/// The proto3 JSON shape of a message field, for checking a request body the way Google's
/// JSON parser does (either the JSON or the proto name; unknown names and wrong types refused).
enum Ty {
    Str,
    Strs,
    StrMap,
    Obj(&'static [Field]),
    List(&'static Ty),
}

/// (JSON name, proto name, type).
type Field = (&'static str, &'static str, Ty);

const KEY: &[Field] = &[
    ("name", "name", Ty::Str),
    ("uid", "uid", Ty::Str),
    ("displayName", "display_name", Ty::Str),
    ("keyString", "key_string", Ty::Str),
    ("createTime", "create_time", Ty::Str),
    ("updateTime", "update_time", Ty::Str),
    ("deleteTime", "delete_time", Ty::Str),
    ("annotations", "annotations", Ty::StrMap),
    ("restrictions", "restrictions", Ty::Obj(RESTRICTIONS)),
    ("etag", "etag", Ty::Str),
];
const RESTRICTIONS: &[Field] = &[
    (
        "browserKeyRestrictions",
        "browser_key_restrictions",
        Ty::Obj(BROWSER),
    ),
    (
        "serverKeyRestrictions",
        "server_key_restrictions",
        Ty::Obj(SERVER),
    ),
    (
        "androidKeyRestrictions",
        "android_key_restrictions",
        Ty::Obj(ANDROID),
    ),
    ("iosKeyRestrictions", "ios_key_restrictions", Ty::Obj(IOS)),
    ("apiTargets", "api_targets", Ty::List(&Ty::Obj(API_TARGET))),
];
/// The members of the `client_restrictions` oneof: at most one may be set.
const CLIENT_RESTRICTIONS: [&str; 4] = [
    "browserKeyRestrictions",
    "serverKeyRestrictions",
    "androidKeyRestrictions",
    "iosKeyRestrictions",
];
const BROWSER: &[Field] = &[("allowedReferrers", "allowed_referrers", Ty::Strs)];
const SERVER: &[Field] = &[("allowedIps", "allowed_ips", Ty::Strs)];
const ANDROID: &[Field] = &[(
    "allowedApplications",
    "allowed_applications",
    Ty::List(&Ty::Obj(ANDROID_APP)),
)];
const ANDROID_APP: &[Field] = &[
    ("sha1Fingerprint", "sha1_fingerprint", Ty::Str),
    ("packageName", "package_name", Ty::Str),
];
const IOS: &[Field] = &[("allowedBundleIds", "allowed_bundle_ids", Ty::Strs)];
const API_TARGET: &[Field] = &[
    ("service", "service", Ty::Str),
    ("methods", "methods", Ty::Strs),
];

/// `value` checked against `ty` and rewritten with JSON names, nulls and empty lists left out;
/// `None` for a null. Errors are Google's "Invalid JSON payload" messages.
fn normalise(value: &Value, ty: &Ty, path: &str) -> Result<Option<Value>, String> {
    let wrong = |expected: &str| Err(format!("Invalid value at '{path}' ({expected}), {value}"));
    if value.is_null() {
        return Ok(None);
    }
    match ty {
        Ty::Str => match value {
            Value::String(_) => Ok(Some(value.clone())),
            _ => wrong("TYPE_STRING"),
        },
        Ty::Strs => {
            let Some(all) = value.as_array() else {
                return wrong("TYPE_STRING");
            };
            if !all.iter().all(Value::is_string) {
                return wrong("TYPE_STRING");
            }
            if path.ends_with("allowed_referrers") && all.iter().any(|r| r == "") {
                return Err(format!("Invalid value at '{path}': a referrer is empty."));
            }
            Ok((!all.is_empty()).then(|| value.clone()))
        }
        Ty::StrMap => {
            let Some(map) = value.as_object() else {
                return wrong("TYPE_MESSAGE");
            };
            if !map.values().all(Value::is_string) {
                return wrong("TYPE_STRING");
            }
            Ok((!map.is_empty()).then(|| value.clone()))
        }
        Ty::List(item) => {
            let Some(all) = value.as_array() else {
                return wrong("TYPE_MESSAGE");
            };
            let mut out = Vec::new();
            for (i, v) in all.iter().enumerate() {
                match normalise(v, item, &format!("{path}[{i}]"))? {
                    Some(v) => out.push(v),
                    None => return Err(format!("Invalid value at '{path}[{i}]': null.")),
                }
            }
            Ok((!out.is_empty()).then(|| json!(out)))
        }
        Ty::Obj(fields) => {
            let Some(map) = value.as_object() else {
                return wrong("TYPE_MESSAGE");
            };
            let mut out = Map::new();
            for (name, v) in map {
                let Some((json_name, proto_name, ty)) =
                    fields.iter().find(|(j, p, _)| name == j || name == p)
                else {
                    return Err(format!(
                        "Invalid JSON payload received. Unknown name \"{name}\" at '{path}': Cannot find field."
                    ));
                };
                if out.contains_key(*json_name) {
                    return Err(format!(
                        "Invalid JSON payload received. Field '{path}.{proto_name}' is given twice."
                    ));
                }
                if let Some(v) = normalise(v, ty, &format!("{path}.{proto_name}"))? {
                    out.insert((*json_name).to_owned(), v);
                }
            }
            let set: Vec<&str> = CLIENT_RESTRICTIONS
                .iter()
                .copied()
                .filter(|k| out.contains_key(*k))
                .collect();
            if set.len() > 1 {
                return Err(format!(
                    "Invalid JSON payload received. Oneof field 'client_restrictions' is already set. Cannot set '{}'.",
                    set[1]
                ));
            }
            Ok(Some(Value::Object(out)))
        }
    }
}
