//! The contract servers themselves (`capstan_e2e::contract`): what they grant, answer and
//! refuse, in the status codes and body shapes of the APIs they stand in for. The Google
//! server's token endpoint is also exercised by `gcp_auth`, the crate the production adapter
//! gets its tokens with.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use capstan_e2e::contract::{GoogleApiKeys, Jira};
use gcp_auth::TokenProvider;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::time::{SystemTime, UNIX_EPOCH};

const PROJECT: &str = "capstan-test";
const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";

// ---------------------------------------------------------------------------------------------
// Google API Keys
// ---------------------------------------------------------------------------------------------

fn unix_now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// An access token the way the production adapter gets one: `gcp_auth` with the key file.
async fn token(google: &GoogleApiKeys) -> String {
    let account =
        gcp_auth::CustomServiceAccount::from_json(&google.service_account_json()).unwrap();
    account
        .token(&[CLOUD_PLATFORM])
        .await
        .unwrap()
        .as_str()
        .to_owned()
}

/// A JWT signed with `signer`'s service-account key; base64url with or without padding.
fn jwt(signer: &GoogleApiKeys, header: &Value, claims: &Value, padded: bool) -> String {
    let account: Value = serde_json::from_str(&signer.service_account_json()).unwrap();
    let pem = account["private_key"].as_str().unwrap();
    let der = STANDARD
        .decode(
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .unwrap();
    let key = ring::signature::RsaKeyPair::from_pkcs8(&der).unwrap();
    let engine = if padded { URL_SAFE } else { URL_SAFE_NO_PAD };
    let signed = format!(
        "{}.{}",
        engine.encode(header.to_string()),
        engine.encode(claims.to_string())
    );
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .unwrap();
    format!("{signed}.{}", engine.encode(signature))
}

fn rs256() -> Value {
    json!({"alg": "RS256", "typ": "JWT"})
}

fn claims(google: &GoogleApiKeys, scope: &str) -> Value {
    let now = unix_now();
    json!({
        "iss": google.client_email(),
        "aud": google.token_uri(),
        "scope": scope,
        "iat": now,
        "exp": now + 3595,
    })
}

async fn grant(google: &GoogleApiKeys, form: &[(&str, &str)]) -> (StatusCode, Value) {
    let answer = Client::new()
        .post(google.token_uri())
        .form(form)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    (status, answer.json().await.unwrap())
}

async fn assertion_grant(google: &GoogleApiKeys, assertion: &str) -> (StatusCode, Value) {
    grant(
        google,
        &[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", assertion),
        ],
    )
    .await
}

/// A request with a bearer token; the status, the `Retry-After` and the JSON body.
async fn call(
    method: reqwest::Method,
    url: &str,
    bearer: Option<&str>,
    body: Option<&Value>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = Client::new().request(method, url);
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let retry_after = answer
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = answer.text().await.unwrap();
    let json = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap()
    };
    (status, retry_after, json)
}

fn keys_url(google: &GoogleApiKeys) -> String {
    format!(
        "{}/v2/projects/{PROJECT}/locations/global/keys",
        google.endpoint()
    )
}

fn assert_google_error(body: &Value, code: u16, status: &str) {
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["status"], status, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn google_grants_gcp_auth_a_token_and_lists_keys_page_by_page() {
    let google = GoogleApiKeys::start(PROJECT);
    let account: Value = serde_json::from_str(&google.service_account_json()).unwrap();
    assert_eq!(account["type"], "service_account");
    assert_eq!(account["project_id"], PROJECT);
    assert_eq!(
        account["client_email"],
        format!("capstan@{PROJECT}.iam.gserviceaccount.com")
    );
    assert_eq!(account["token_uri"], format!("{}/token", google.endpoint()));

    let token = token(&google).await;
    assert_eq!(google.tokens_issued(), 1);

    // No keys: Google leaves `keys` out.
    let (status, _, body) =
        call(reqwest::Method::GET, &keys_url(&google), Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({}));
    assert_eq!(google.keys(), json!({}));

    google.add_key("web", "Website", &["*.example.com/*", "example.com/*"]);
    google.add_server_key("backend", "Backend");
    google.add_unrestricted_key("open", "Open");
    google.set_page_size(1);

    let mut names = Vec::new();
    let mut page_token: Option<String> = None;
    loop {
        let mut url = format!("{}?pageSize=300", keys_url(&google));
        if let Some(t) = &page_token {
            url.push_str(&format!("&pageToken={t}"));
        }
        let (status, _, page) = call(reqwest::Method::GET, &url, Some(&token), None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let keys = page["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "the server's page size wins: {page}");
        for key in keys {
            assert!(
                key.get("keyString").is_none(),
                "list never shows key strings"
            );
            assert!(key["etag"].as_str().unwrap().starts_with("W/\""));
            for field in ["uid", "createTime", "updateTime"] {
                assert!(key[field].is_string(), "{field} in {key}");
            }
            names.push(key["name"].as_str().unwrap().to_owned());
        }
        match page.get("nextPageToken") {
            Some(t) => page_token = Some(t.as_str().unwrap().to_owned()),
            None => break,
        }
    }
    let number = google.project_number();
    assert_eq!(
        names,
        ["web", "backend", "open"]
            .map(|id| format!("projects/{number}/locations/global/keys/{id}"))
    );
    let all = google.keys();
    assert_eq!(
        all["keys"][0]["restrictions"],
        json!({"browserKeyRestrictions": {"allowedReferrers": ["*.example.com/*", "example.com/*"]}})
    );
    assert!(all["keys"][1]["restrictions"]["serverKeyRestrictions"].is_object());
    assert!(all["keys"][2].get("restrictions").is_none());
    assert_eq!(google.referrers("backend"), Vec::<String>::new());

    // The project number addresses the project as well as its id; a page token is the
    // server's own or refused.
    let by_number = format!(
        "{}/v2/projects/{number}/locations/global/keys/web",
        google.endpoint()
    );
    let (status, _, key) = call(reqwest::Method::GET, &by_number, Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(key["displayName"], "Website");
    let (status, _, body) = call(
        reqwest::Method::GET,
        &format!("{}?pageToken=made-up", keys_url(&google)),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT");
    assert!(
        google
            .requests()
            .iter()
            .any(|r| r == &format!("GET /v2/projects/{PROJECT}/locations/global/keys?pageSize=300")),
        "{:?}",
        google.requests()
    );
}

#[tokio::test]
async fn google_token_endpoint_refuses_what_google_refuses() {
    let google = GoogleApiKeys::start(PROJECT);
    let stranger = GoogleApiKeys::start("someone-else");

    // Padded (as gcp_auth writes them) and unpadded base64url are both accepted.
    for padded in [true, false] {
        let (status, body) = assertion_grant(
            &google,
            &jwt(&google, &rs256(), &claims(&google, CLOUD_PLATFORM), padded),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["token_type"], "Bearer");
        assert_eq!(body["expires_in"], 3599);
        assert!(body["access_token"].as_str().is_some_and(|t| !t.is_empty()));
    }
    assert_eq!(google.tokens_issued(), 2);

    let now = unix_now();
    let mut wrong_audience = claims(&google, CLOUD_PLATFORM);
    wrong_audience["aud"] = json!("https://oauth2.googleapis.com/token");
    let mut wrong_issuer = claims(&google, CLOUD_PLATFORM);
    wrong_issuer["iss"] = json!("intruder@example.iam.gserviceaccount.com");
    let mut too_long = claims(&google, CLOUD_PLATFORM);
    too_long["exp"] = json!(now + 7200);
    let mut expired = claims(&google, CLOUD_PLATFORM);
    expired["iat"] = json!(now - 4000);
    expired["exp"] = json!(now - 400);
    let mut text_times = claims(&google, CLOUD_PLATFORM);
    text_times["iat"] = json!(now.to_string());
    // A valid token written in the standard alphabet, which is not base64url: one with a
    // character only base64url has ('-' or '_'; a signature may have neither, so the claims'
    // times move a second at a time until one does).
    let standard_alphabet = (0..64)
        .map(|back: i64| {
            let mut moved = claims(&google, CLOUD_PLATFORM);
            moved["iat"] = json!(now - back);
            moved["exp"] = json!(now - back + 3595);
            jwt(&google, &rs256(), &moved, false)
        })
        .find(|token| token.contains(['-', '_']))
        .expect("a token with a base64url-only character")
        .replace('-', "+")
        .replace('_', "/");
    let refused = [
        // Signed with another key.
        jwt(&stranger, &rs256(), &claims(&google, CLOUD_PLATFORM), false),
        jwt(
            &google,
            &json!({"alg": "HS256", "typ": "JWT"}),
            &claims(&google, CLOUD_PLATFORM),
            false,
        ),
        jwt(&google, &rs256(), &wrong_audience, false),
        jwt(&google, &rs256(), &wrong_issuer, false),
        jwt(&google, &rs256(), &too_long, false),
        jwt(&google, &rs256(), &expired, false),
        jwt(&google, &rs256(), &text_times, false),
        "not-a-jwt".to_owned(),
        standard_alphabet,
    ];
    for assertion in &refused {
        let (status, body) = assertion_grant(&google, assertion).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{assertion}: {body}");
        assert_eq!(body["error"], "invalid_grant", "{body}");
        assert!(body["error_description"].is_string());
    }

    let (status, body) = assertion_grant(
        &google,
        &jwt(&google, &rs256(), &claims(&google, ""), false),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_scope"))
    );

    let (status, body) = grant(&google, &[("grant_type", "client_credentials")]).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("unsupported_grant_type"))
    );
    let (status, body) = grant(
        &google,
        &[("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")],
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    // A JSON body is not the form the endpoint takes.
    let answer = Client::new()
        .post(google.token_uri())
        .json(&json!({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    assert_eq!(google.tokens_issued(), 2);
}

#[tokio::test]
async fn google_api_refuses_missing_tokens_scopes_projects_and_locations() {
    let google = GoogleApiKeys::start(PROJECT);
    google.add_key("web", "Website", &["example.com/*"]);
    let token = token(&google).await;
    let key_url = format!("{}/web", keys_url(&google));

    let (status, _, body) = call(reqwest::Method::GET, &key_url, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_google_error(&body, 401, "UNAUTHENTICATED");
    let (status, _, body) = call(reqwest::Method::GET, &key_url, Some("ya29.forged"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_google_error(&body, 401, "UNAUTHENTICATED");

    let other_project = format!(
        "{}/v2/projects/another-project/locations/global/keys",
        google.endpoint()
    );
    let (status, _, body) = call(reqwest::Method::GET, &other_project, Some(&token), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_google_error(&body, 403, "PERMISSION_DENIED");

    let regional = format!(
        "{}/v2/projects/{PROJECT}/locations/us-central1/keys",
        google.endpoint()
    );
    let (status, _, body) = call(reqwest::Method::GET, &regional, Some(&token), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&body, 400, "INVALID_ARGUMENT");

    let (status, _, body) = call(
        reqwest::Method::GET,
        &format!("{}/nope", keys_url(&google)),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_google_error(&body, 404, "NOT_FOUND");

    for query in [
        "?colour=blue",
        "?fields=keys.name",
        "?pageSize=-1",
        "?pageSize=ten",
    ] {
        let (status, _, body) = call(
            reqwest::Method::GET,
            &format!("{}{query}", keys_url(&google)),
            Some(&token),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_google_error(&body, 400, "INVALID_ARGUMENT");
    }

    // A token granted for a read-only scope reads but does not write.
    let read_only = "https://www.googleapis.com/auth/cloud-platform.read-only";
    let (status, granted) = assertion_grant(
        &google,
        &jwt(&google, &rs256(), &claims(&google, read_only), false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let reader = granted["access_token"].as_str().unwrap();
    let (status, _, _) = call(reqwest::Method::GET, &key_url, Some(reader), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = call(
        reqwest::Method::PATCH,
        &format!("{key_url}?updateMask=displayName"),
        Some(reader),
        Some(&json!({"displayName": "Renamed"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_google_error(&body, 403, "PERMISSION_DENIED");
    assert_eq!(
        body["error"]["details"][0]["reason"],
        "ACCESS_TOKEN_SCOPE_INSUFFICIENT"
    );
}

#[tokio::test]
async fn google_patch_is_an_etag_guarded_long_running_operation() {
    let google = GoogleApiKeys::start(PROJECT);
    google.add_key("web", "Website", &["a.example/*"]);
    let token = token(&google).await;
    let key_url = format!("{}/web", keys_url(&google));
    let (_, _, key) = call(reqwest::Method::GET, &key_url, Some(&token), None).await;
    let etag = key["etag"].as_str().unwrap().to_owned();
    let referrers = |list: &[&str]| {
        json!({
            "name": key["name"],
            "etag": etag,
            "restrictions": {"browserKeyRestrictions": {"allowedReferrers": list}},
        })
    };
    let patch = |query: &str, body: Value| {
        let url = format!("{key_url}{query}");
        let token = token.clone();
        async move { call(reqwest::Method::PATCH, &url, Some(&token), Some(&body)).await }
    };

    // Refused: no mask, an immutable field in it, unknown or mistyped fields, two kinds of
    // client restriction, another key's name.
    let bad = [
        ("", referrers(&["a.example/*", "b.example/*"])),
        ("?updateMask=keyString", referrers(&["b.example/*"])),
        (
            "?updateMask=restrictions.browserKeyRestrictions",
            referrers(&["b.example/*"]),
        ),
        (
            "?updateMask=restrictions",
            json!({"restrictions": {"browserKeyRestriction": {}}}),
        ),
        (
            "?updateMask=restrictions",
            json!({"restrictions": {"browserKeyRestrictions": {"allowedReferrers": "b.example/*"}}}),
        ),
        ("?updateMask=restrictions", json!({"colour": "blue"})),
        (
            "?updateMask=restrictions",
            json!({"restrictions": {
                "browserKeyRestrictions": {"allowedReferrers": ["b.example/*"]},
                "serverKeyRestrictions": {"allowedIps": ["203.0.113.1"]},
            }}),
        ),
        (
            "?updateMask=displayName",
            json!({"name": "projects/x/locations/global/keys/other", "displayName": "x"}),
        ),
    ];
    for (query, body) in bad {
        let (status, _, answer) = patch(query, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query} {body}: {answer}");
        assert_google_error(&answer, 400, "INVALID_ARGUMENT");
    }

    // Over the referrer limit.
    google.set_referrer_limit(2);
    let (status, _, answer) = patch(
        "?updateMask=restrictions",
        referrers(&["a.example/*", "b.example/*", "c.example/*"]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_google_error(&answer, 400, "INVALID_ARGUMENT");

    // A stale etag is ABORTED.
    let mut stale = referrers(&["b.example/*"]);
    stale["etag"] = json!("W/\"c3RhbGU=\"");
    let (status, _, answer) = patch("?updateMask=restrictions", stale).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_google_error(&answer, 409, "ABORTED");
    assert_eq!(google.referrers("web"), ["a.example/*"]);

    // Accepted: an operation, pending until its first poll; the key changes only then.
    let (status, _, operation) = patch(
        "?updateMask=restrictions",
        referrers(&["a.example/*", "b.example/*"]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{operation}");
    let name = operation["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("operations/akmf.p7-"), "{name}");
    assert!(operation.get("done").is_none() && operation.get("response").is_none());
    let (_, _, unchanged) = call(reqwest::Method::GET, &key_url, Some(&token), None).await;
    assert_eq!(unchanged["etag"], etag.as_str());
    assert_eq!(google.referrers("web"), ["a.example/*"]);
    let operation_url = format!("{}/v2/{name}", google.endpoint());
    let (status, _, done) = call(reqwest::Method::GET, &operation_url, Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["done"], true);
    assert_eq!(
        done["response"]["@type"],
        "type.googleapis.com/google.api.apikeys.v2.Key"
    );
    assert_eq!(
        done["response"]["restrictions"]["browserKeyRestrictions"]["allowedReferrers"],
        json!(["a.example/*", "b.example/*"])
    );
    let (_, _, changed) = call(reqwest::Method::GET, &key_url, Some(&token), None).await;
    assert_ne!(
        changed["etag"],
        etag.as_str(),
        "the etag changes with every update"
    );
    assert_eq!(changed["etag"], done["response"]["etag"]);
    assert_eq!(google.referrers("web"), ["a.example/*", "b.example/*"]);
    assert!(changed.get("keyString").is_none());

    // The old etag is now stale.
    let (status, _, _) = patch("?updateMask=restrictions", referrers(&["a.example/*"])).await;
    assert_eq!(status, StatusCode::CONFLICT);

    // Done at once with 0 polls; after three with 3.
    let fresh = |list: &[&str]| {
        json!({
            "etag": google.etag("web"),
            "restrictions": {"browserKeyRestrictions": {"allowedReferrers": list}},
        })
    };
    google.set_polls_until_done(0);
    let (_, _, done) = patch("?updateMask=restrictions", fresh(&["a.example/*"])).await;
    assert_eq!(done["done"], true, "{done}");
    assert_eq!(google.referrers("web"), ["a.example/*"]);
    google.set_polls_until_done(3);
    let (_, _, pending) = patch("?update_mask=restrictions", fresh(&[])).await;
    let url = format!(
        "{}/v2/{}",
        google.endpoint(),
        pending["name"].as_str().unwrap()
    );
    for _ in 0..2 {
        let (_, _, op) = call(reqwest::Method::GET, &url, Some(&token), None).await;
        assert!(op.get("done").is_none(), "{op}");
    }
    let (_, _, op) = call(reqwest::Method::GET, &url, Some(&token), None).await;
    assert_eq!(op["done"], true);
    assert_eq!(google.referrers("web"), Vec::<String>::new());
    assert_eq!(
        google.keys()["keys"][0]["restrictions"],
        json!({"browserKeyRestrictions": {}})
    );

    // Another writer between the read and the PATCH.
    google.set_polls_until_done(1);
    google.change_before_next_patch("web", &["other.example/*"]);
    let (status, _, _) = patch("?updateMask=restrictions", fresh(&["a.example/*"])).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(google.referrers("web"), ["other.example/*"]);

    let (status, _, body) = call(
        reqwest::Method::GET,
        &format!("{}/v2/operations/akmf.p7-1-nothing", google.endpoint()),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_google_error(&body, 404, "NOT_FOUND");

    let patches = google.patches();
    assert!(patches.len() >= 14, "{patches:?}");
    assert_eq!(patches[0]["status"], 400);
    assert_eq!(patches[0]["precondition"], true);
    assert_eq!(patches[0]["query"], json!({}));
    assert_eq!(patches[1]["query"], json!({"updateMask": "keyString"}));
    assert!(
        patches
            .iter()
            .any(|p| p["status"] == 200 && p["precondition"] == true)
    );
}

#[tokio::test]
async fn google_injected_faults_answer_google_errors_with_retry_after() {
    let google = GoogleApiKeys::start(PROJECT);
    let token = token(&google).await;
    google.fail_next(2, 429, Some(7));
    for _ in 0..2 {
        let (status, retry_after, body) =
            call(reqwest::Method::GET, &keys_url(&google), Some(&token), None).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after.as_deref(), Some("7"));
        assert_google_error(&body, 429, "RESOURCE_EXHAUSTED");
    }
    let (status, _, _) = call(reqwest::Method::GET, &keys_url(&google), Some(&token), None).await;
    assert_eq!(status, StatusCode::OK);

    google.fail_next(1, 503, None);
    // The token endpoint is not a /v2 request: it does not take the fault.
    let again = gcp_auth::CustomServiceAccount::from_json(&google.service_account_json())
        .unwrap()
        .token(&[CLOUD_PLATFORM])
        .await;
    assert!(again.is_ok());
    let (status, retry_after, body) =
        call(reqwest::Method::GET, &keys_url(&google), Some(&token), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after, None);
    assert_google_error(&body, 503, "UNAVAILABLE");
    google.fail_next(1, 500, None);
    let (_, _, body) = call(reqwest::Method::GET, &keys_url(&google), Some(&token), None).await;
    assert_google_error(&body, 500, "INTERNAL");
}

// ---------------------------------------------------------------------------------------------
// Jira
// ---------------------------------------------------------------------------------------------

const EMAIL: &str = "ops@example.com";
const API_TOKEN: &str = "atlassian-api-token";

fn adf(lines: &[&str]) -> Value {
    let content: Vec<Value> = lines
        .iter()
        .map(|l| json!({"type": "paragraph", "content": [{"type": "text", "text": l}]}))
        .collect();
    json!({"type": "doc", "version": 1, "content": content})
}

/// A request as the account; the status, the `Retry-After` and the JSON body (null if empty).
async fn jira(
    server: &Jira,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Option<String>, Value) {
    jira_as(server, method, path, body, Some((EMAIL, API_TOKEN))).await
}

async fn jira_as(
    server: &Jira,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
    credentials: Option<(&str, &str)>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = Client::new().request(method, format!("{}{path}", server.base_url()));
    if let Some((user, password)) = credentials {
        request = request.basic_auth(user, Some(password));
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let retry_after = answer
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = answer.text().await.unwrap();
    let json = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap()
    };
    (status, retry_after, json)
}

#[tokio::test]
async fn jira_refuses_requests_without_the_account_s_credentials() {
    let server = Jira::start(EMAIL, API_TOKEN);
    server.add_issue("OPS-1", "Onboard example.com", "To Do");
    for credentials in [
        None,
        Some((EMAIL, "wrong")),
        Some(("other@example.com", API_TOKEN)),
    ] {
        let (status, _, body) = jira_as(
            &server,
            reqwest::Method::GET,
            "/rest/api/3/issue/OPS-1",
            None,
            credentials,
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{credentials:?}");
        assert_eq!(
            body,
            json!({"errorMessages": ["You are not authenticated. Authentication required to perform this operation."], "errors": {}})
        );
    }
    let (status, _, me) = jira(&server, reqwest::Method::GET, "/rest/api/3/myself", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["emailAddress"], EMAIL);
    assert_eq!(me["accountId"], server.account_id());
}

#[tokio::test]
async fn jira_issues_answer_the_fields_asked_for() {
    let server = Jira::start(EMAIL, API_TOKEN);
    server.add_issue("OPS-1", "Onboard example.com", "In Progress");
    server.add_comment("OPS-1", adf(&["first"]));
    let (status, _, issue) = jira(
        &server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-1?fields=summary,status",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(issue["key"], "OPS-1");
    assert_eq!(issue["id"], server.issue_id("OPS-1"));
    let mut fields: Vec<&String> = issue["fields"].as_object().unwrap().keys().collect();
    fields.sort();
    assert_eq!(fields, ["status", "summary"]);
    assert_eq!(issue["fields"]["summary"], "Onboard example.com");
    let status_object = &issue["fields"]["status"];
    assert_eq!(status_object["name"], "In Progress");
    assert_eq!(status_object["id"], "3");
    assert_eq!(status_object["statusCategory"]["key"], "indeterminate");

    let by_id = format!("/rest/api/3/issue/{}", server.issue_id("OPS-1"));
    let (status, _, issue) = jira(&server, reqwest::Method::GET, &by_id, None).await;
    assert_eq!(status, StatusCode::OK);
    let comment = &issue["fields"]["comment"];
    assert_eq!(
        (comment["total"].as_u64(), comment["startAt"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(comment["comments"][0]["body"], adf(&["first"]));
    assert!(comment["comments"][0].get("properties").is_none());

    let (status, _, body) = jira(
        &server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-404",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"errorMessages": ["Issue does not exist or you do not have permission to see it."], "errors": {}})
    );
}

#[tokio::test]
async fn jira_comments_are_strict_adf_and_keep_their_properties() {
    let server = Jira::start(EMAIL, API_TOKEN);
    server.add_issue("OPS-1", "Onboard example.com", "To Do");
    let path = "/rest/api/3/issue/OPS-1/comment";
    let body = json!({
        "body": {"type": "doc", "version": 1, "content": [
            {"type": "paragraph", "content": [
                {"type": "text", "text": "Done: "},
                {"type": "text", "text": "example.com", "marks": [{"type": "strong"}]},
                {"type": "hardBreak"},
                {"type": "text", "text": "see the plan"},
            ]},
            {"type": "paragraph"},
        ]},
        "properties": [{"key": "capstan", "value": {"token": "t-1"}}],
    });
    let (status, _, created) = jira(&server, reqwest::Method::POST, path, Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["id"], "10000");
    assert_eq!(created["body"], body["body"]);
    assert_eq!(created["author"]["emailAddress"], EMAIL);
    assert!(created.get("properties").is_none());

    let invalid_bodies = [
        // The v2 API's plain string.
        json!({"body": "plain text"}),
        json!({"body": {"type": "doc", "version": 2, "content": []}}),
        json!({"body": {"type": "doc", "version": 1, "content": [
            {"type": "heading", "attrs": {"level": 1}, "content": [{"type": "text", "text": "h"}]}
        ]}}),
        json!({"body": {"type": "doc", "version": 1, "content": [
            {"type": "paragraph", "content": [{"type": "text", "text": ""}]}
        ]}}),
        json!({"body": {"type": "doc", "version": 1, "content": [
            {"type": "paragraph", "content": [{"type": "text", "text": "x", "marks": [{"type": "blink"}]}]}
        ]}}),
        json!({"body": {"type": "doc", "version": 1, "content": [{"type": "paragraph", "text": "x"}]}}),
    ];
    for invalid in &invalid_bodies {
        let (status, _, answer) = jira(&server, reqwest::Method::POST, path, Some(invalid)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{invalid}");
        assert_eq!(
            answer,
            json!({"errorMessages": [], "errors": {"comment": "Comment body is not valid!"}}),
            "{invalid}"
        );
    }
    for empty in [
        json!({}),
        json!({"body": {"type": "doc", "version": 1, "content": []}}),
    ] {
        let (status, _, answer) = jira(&server, reqwest::Method::POST, path, Some(&empty)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            answer["errors"]["comment"],
            "Comment body can not be empty!"
        );
    }
    let mut unknown = json!({"body": adf(&["x"]), "labels": ["a"]});
    let (status, _, answer) = jira(&server, reqwest::Method::POST, path, Some(&unknown)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        answer["errorMessages"][0]
            .as_str()
            .unwrap()
            .contains("labels")
    );
    unknown = json!({"body": adf(&["x"]), "properties": [{"key": "", "value": 1}]});
    let (status, _, _) = jira(&server, reqwest::Method::POST, path, Some(&unknown)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let answer = Client::new()
        .post(format!("{}{path}", server.base_url()))
        .basic_auth(EMAIL, Some(API_TOKEN))
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let comments = server.comments("OPS-1");
    assert_eq!(comments.len(), 1, "refused comments are not kept");
    assert_eq!(
        comments[0]["properties"],
        json!([{"key": "capstan", "value": {"token": "t-1"}}])
    );
    let (_, _, page) = jira(
        &server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-1/comment?expand=properties",
        None,
    )
    .await;
    assert_eq!(
        page["comments"][0]["properties"][0]["value"]["token"],
        "t-1"
    );
    let (_, _, page) = jira(&server, reqwest::Method::GET, path, None).await;
    assert!(page["comments"][0].get("properties").is_none());
}

#[tokio::test]
async fn jira_comment_pages_are_capped_by_the_server() {
    let server = Jira::start(EMAIL, API_TOKEN);
    server.add_issue("OPS-1", "Onboard example.com", "To Do");
    for n in 0..5 {
        server.add_comment("OPS-1", adf(&[&format!("comment {n}")]));
    }
    server.set_comment_page(2);
    let mut seen = Vec::new();
    loop {
        let path = format!(
            "/rest/api/3/issue/OPS-1/comment?startAt={}&maxResults=100",
            seen.len()
        );
        let (status, _, page) = jira(&server, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(page["maxResults"], 2);
        assert_eq!(page["total"], 5);
        assert_eq!(page["startAt"], seen.len());
        let comments = page["comments"].as_array().unwrap();
        if comments.is_empty() {
            break;
        }
        seen.extend(
            comments
                .iter()
                .map(|c| c["body"]["content"][0]["content"][0]["text"].clone()),
        );
    }
    assert_eq!(
        seen,
        (0..5)
            .map(|n| json!(format!("comment {n}")))
            .collect::<Vec<_>>()
    );
    let (status, _, _) = jira(
        &server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-1/comment?startAt=minus",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

async fn transition_ids(server: &Jira) -> Vec<(String, String, String)> {
    let (status, _, body) = jira(
        server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-1/transitions",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["expand"], "transitions");
    body["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["isAvailable"], true);
            assert!(t["to"]["statusCategory"]["key"].is_string());
            (
                t["id"].as_str().unwrap().to_owned(),
                t["name"].as_str().unwrap().to_owned(),
                t["to"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn jira_transitions_follow_the_workflow_graph() {
    let server = Jira::start(EMAIL, API_TOKEN);
    server.add_issue("OPS-1", "Onboard example.com", "To Do");
    let ids = |all: Vec<(String, String, String)>| all.into_iter().map(|t| t.0).collect::<Vec<_>>();
    assert_eq!(ids(transition_ids(&server).await), ["11", "21", "31"]);

    let path = "/rest/api/3/issue/OPS-1/transitions";
    let (status, _, body) = jira(
        &server,
        reqwest::Method::POST,
        path,
        Some(&json!({"transition": {"id": "21"}})),
    )
    .await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(server.status("OPS-1"), "Pending Assistance");
    assert_eq!(ids(transition_ids(&server).await), ["71", "81"]);

    // Not available from Pending Assistance.
    let (status, _, body) = jira(
        &server,
        reqwest::Method::POST,
        path,
        Some(&json!({"transition": {"id": "21"}})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        json!({"errorMessages": ["Transition id '21' is not valid for this issue."], "errors": {}})
    );
    // No screen: fields cannot be set; unknown fields are refused.
    for refused in [
        json!({"transition": {"id": "81"}, "fields": {"resolution": {"name": "Done"}}}),
        json!({"transition": {"id": "81"}, "comment": "x"}),
        json!({"id": "81"}),
    ] {
        let (status, _, _) = jira(&server, reqwest::Method::POST, path, Some(&refused)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    }
    assert_eq!(server.status("OPS-1"), "Pending Assistance");

    // Jira reads a numeric id as its string.
    let (status, _, _) = jira(
        &server,
        reqwest::Method::POST,
        path,
        Some(&json!({"transition": {"id": 81}})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(server.status("OPS-1"), "Resolved");
    let resolved = transition_ids(&server).await;
    assert_eq!(
        resolved,
        [
            ("91".to_owned(), "Reopen".to_owned(), "To Do".to_owned()),
            ("101".to_owned(), "Close".to_owned(), "Closed".to_owned()),
        ]
    );
    jira(
        &server,
        reqwest::Method::POST,
        path,
        Some(&json!({"transition": {"id": "101"}})),
    )
    .await;
    assert_eq!(server.status("OPS-1"), "Closed");
    assert!(transition_ids(&server).await.is_empty());
}

#[tokio::test]
async fn jira_forbidden_issues_and_injected_faults() {
    let server = Jira::start(EMAIL, API_TOKEN);
    server.add_issue("OPS-1", "Onboard example.com", "To Do");
    server.add_issue("OPS-2", "Secret", "To Do");
    server.forbid("OPS-2");
    for (method, path) in [
        (reqwest::Method::GET, "/rest/api/3/issue/OPS-2"),
        (reqwest::Method::GET, "/rest/api/3/issue/OPS-2/transitions"),
        (reqwest::Method::POST, "/rest/api/3/issue/OPS-2/comment"),
    ] {
        let (status, _, body) =
            jira(&server, method, path, Some(&json!({"body": adf(&["x"])}))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert!(body["errorMessages"][0].is_string());
    }
    assert!(server.comments("OPS-2").is_empty());

    server.fail_next(2, 429, Some(3));
    for _ in 0..2 {
        let (status, retry_after, body) = jira(
            &server,
            reqwest::Method::GET,
            "/rest/api/3/issue/OPS-1",
            None,
        )
        .await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after.as_deref(), Some("3"));
        assert!(body["errorMessages"].is_array());
    }
    server.fail_next(1, 503, None);
    let (status, retry_after, _) = jira(
        &server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-1",
        None,
    )
    .await;
    assert_eq!(
        (status, retry_after),
        (StatusCode::SERVICE_UNAVAILABLE, None)
    );
    let (status, _, _) = jira(
        &server,
        reqwest::Method::GET,
        "/rest/api/3/issue/OPS-1",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        server.requests().last().map(String::as_str),
        Some("GET /rest/api/3/issue/OPS-1")
    );
}
