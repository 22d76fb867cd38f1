//! The Jira Cloud platform REST API v3 (`https://<site>.atlassian.net/rest/api/3`): one
//! Atlassian account authenticating with HTTP Basic and an API token, issues with a summary, a
//! status and comments, and one fixed workflow.
//!
//! - **Workflow**: `To Do`, `In Progress`, `Pending Assistance`, `Resolved`, `Closed`, joined by
//!   an explicit graph of transitions with stable ids (see [`TRANSITIONS`]); only the
//!   transitions out of an issue's current status are available, as in Jira.
//! - **Comments** are Atlassian Document Format (the v3 API's shape; a plain string is the v2
//!   API's and is refused), checked strictly: a `doc` of version 1 whose blocks are paragraphs
//!   of `text` (non-empty, optionally marked) and `hardBreak` nodes. Entity properties given
//!   on creation are kept and shown with `expand=properties`.
//! - **Errors** are Jira's body, `{"errorMessages": [..], "errors": {..}}`, with its messages
//!   where the reference or the product gives them.
//! - **Permissions** are one switch per issue ([`Jira::forbid`]): every request on it is 403.
//!   Jira answers an issue the account may not browse with the 404 of a missing one, and 403
//!   when it may browse but not comment or transition; the switch is the 403 case.

use super::{
    Faults, ServerThread, bind, is_json, json_answer, lock, now, query_pairs, request_line,
};
use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Map, Value, json};
use std::sync::{Arc, Mutex};

/// A status: id, name, and its category (id, key, colour, name).
type StatusDef = (
    &'static str,
    &'static str,
    (u64, &'static str, &'static str, &'static str),
);

const NEW: (u64, &str, &str, &str) = (2, "new", "blue-gray", "To Do");
const INDETERMINATE: (u64, &str, &str, &str) = (4, "indeterminate", "yellow", "In Progress");
const DONE: (u64, &str, &str, &str) = (3, "done", "green", "Done");

/// The workflow's statuses.
pub const STATUSES: [StatusDef; 5] = [
    ("1", "To Do", NEW),
    ("3", "In Progress", INDETERMINATE),
    ("10002", "Pending Assistance", INDETERMINATE),
    ("5", "Resolved", DONE),
    ("6", "Closed", DONE),
];

/// The workflow's transitions: (id, name, from, to). Closed has none out.
pub const TRANSITIONS: [(&str, &str, &str, &str); 10] = [
    ("11", "Start progress", "To Do", "In Progress"),
    ("21", "Wait for assistance", "To Do", "Pending Assistance"),
    ("31", "Resolve", "To Do", "Resolved"),
    ("41", "Stop progress", "In Progress", "To Do"),
    (
        "51",
        "Wait for assistance",
        "In Progress",
        "Pending Assistance",
    ),
    ("61", "Resolve", "In Progress", "Resolved"),
    ("71", "Resume progress", "Pending Assistance", "In Progress"),
    ("81", "Resolve", "Pending Assistance", "Resolved"),
    ("91", "Reopen", "Resolved", "To Do"),
    ("101", "Close", "Resolved", "Closed"),
];

/// What Jira answers a request without valid credentials.
const NOT_AUTHENTICATED: &str =
    "You are not authenticated. Authentication required to perform this operation.";
const NO_ISSUE: &str = "Issue does not exist or you do not have permission to see it.";
/// Jira's own limit on an entity property's value.
const PROPERTY_VALUE_MAX_BYTES: usize = 32_768;

type Shared = Arc<Mutex<State>>;

/// Jira Cloud's REST API v3 for one account; see the module docs.
pub struct Jira {
    state: Shared,
    port: u16,
    _server: ServerThread,
}

struct State {
    base: String,
    email: String,
    api_token: String,
    account_id: String,
    issues: Vec<Issue>,
    next_issue_id: u64,
    next_comment_id: u64,
    comment_page: usize,
    faults: Faults,
    requests: Vec<String>,
}

struct Issue {
    id: String,
    key: String,
    summary: String,
    status: &'static str,
    comments: Vec<Comment>,
    forbidden: bool,
}

struct Comment {
    id: String,
    body: Value,
    properties: Vec<(String, Value)>,
    visibility: Option<Value>,
    created: String,
}

impl Jira {
    /// A site with no issues, where `email` with `api_token` is the only account.
    pub fn start(email: &str, api_token: &str) -> Self {
        let (listener, port) = bind();
        let state = Arc::new(Mutex::new(State {
            base: format!("http://127.0.0.1:{port}"),
            email: email.to_owned(),
            api_token: api_token.to_owned(),
            account_id: format!("712020:{}", super::random_uuid()),
            issues: Vec::new(),
            next_issue_id: 10001,
            next_comment_id: 10000,
            comment_page: 50,
            faults: Faults::default(),
            requests: Vec::new(),
        }));
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let server = ServerThread::spawn("jira", listener, router);
        Self {
            state,
            port,
            _server: server,
        }
    }

    /// The site (`https://<site>.atlassian.net` in production); the API is under
    /// `/rest/api/3`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The account's id, as comments' `author.accountId` carries it.
    pub fn account_id(&self) -> String {
        lock(&self.state).account_id.clone()
    }

    /// The next `count` requests answer `code` with Jira's error body, and `Retry-After` when
    /// given (Jira's rate limiting answers 429 with it).
    pub fn fail_next(&self, count: usize, code: u16, retry_after_s: Option<u64>) {
        lock(&self.state).faults.set(count, code, retry_after_s);
    }

    /// The most comments one page holds, whatever `maxResults` asks (default 50).
    pub fn set_comment_page(&self, n: usize) {
        assert!(n > 0, "a page holds at least one comment");
        lock(&self.state).comment_page = n;
    }

    /// An issue `key` (`OPS-1`) with this summary, in `status` (one of [`STATUSES`]).
    pub fn add_issue(&self, key: &str, summary: &str, status: &str) {
        let status = STATUSES
            .iter()
            .find(|s| s.1 == status)
            .unwrap_or_else(|| panic!("{status} is not a status of the workflow"))
            .1;
        let mut s = lock(&self.state);
        assert!(
            s.issues.iter().all(|i| i.key != key),
            "issue {key} is already there"
        );
        let id = s.next_issue_id.to_string();
        s.next_issue_id += 1;
        s.issues.push(Issue {
            id,
            key: key.to_owned(),
            summary: summary.to_owned(),
            status,
            comments: Vec::new(),
            forbidden: false,
        });
    }

    /// The issue's numeric id (its key works as well in every path).
    pub fn issue_id(&self, key: &str) -> String {
        lock(&self.state).issue(key).id.clone()
    }

    /// A comment already on the issue (an ADF document, checked as a POST would check it);
    /// its id.
    pub fn add_comment(&self, key: &str, body: Value) -> String {
        assert!(
            valid_doc(&body),
            "not a document this server accepts: {body}"
        );
        let mut s = lock(&self.state);
        s.create_comment(key, body, Vec::new(), None)
    }

    /// The account may no longer see or change the issue: every request on it is 403.
    pub fn forbid(&self, key: &str) {
        lock(&self.state).issue_mut(key).forbidden = true;
    }

    /// The issue's status name now.
    pub fn status(&self, key: &str) -> String {
        lock(&self.state).issue(key).status.to_owned()
    }

    /// The issue's comments, oldest first, as the API shows them with `expand=properties`.
    pub fn comments(&self, key: &str) -> Vec<Value> {
        let s = lock(&self.state);
        let issue = s.issue(key);
        issue
            .comments
            .iter()
            .map(|c| s.render_comment(issue, c, true, false))
            .collect()
    }

    /// Every request received, `METHOD path?query`, oldest first.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }
}

/// Jira's error body.
fn jira_error(code: StatusCode, messages: &[&str], errors: Value) -> Response {
    json_answer(
        code,
        json!({"errorMessages": messages, "errors": errors}),
        None,
    )
}

fn bad_request(message: &str) -> Response {
    jira_error(StatusCode::BAD_REQUEST, &[message], json!({}))
}

fn comment_error(message: &str) -> Response {
    jira_error(StatusCode::BAD_REQUEST, &[], json!({ "comment": message }))
}

/// A time as Jira writes them: `2024-05-30T10:28:29.680+0000`.
fn jira_time() -> String {
    now().1.format("%Y-%m-%dT%H:%M:%S%.3f%z").to_string()
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

impl State {
    fn issue(&self, key: &str) -> &Issue {
        self.issues
            .iter()
            .find(|i| i.key == key)
            .unwrap_or_else(|| panic!("no issue {key}"))
    }

    fn issue_mut(&mut self, key: &str) -> &mut Issue {
        self.issues
            .iter_mut()
            .find(|i| i.key == key)
            .unwrap_or_else(|| panic!("no issue {key}"))
    }

    fn answer(&mut self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
        self.requests.push(request_line(method, uri));
        if let Some((code, retry_after_s)) = self.faults.take() {
            let message = if code == StatusCode::TOO_MANY_REQUESTS {
                "Rate limit exceeded."
            } else {
                "Injected by the contract server."
            };
            let mut answer = jira_error(code, &[message], json!({}));
            if let Some(seconds) = retry_after_s {
                answer
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            return answer;
        }
        if let Err(answer) = self.authenticate(headers) {
            return answer;
        }
        let path = uri.path();
        let query = query_pairs(uri.query());
        let Some(rest) = path.strip_prefix("/rest/api/3/") else {
            return jira_error(
                StatusCode::NOT_FOUND,
                &[&format!("null for uri: {}{path}", self.base)],
                json!({}),
            );
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let get = *method == Method::GET;
        let post = *method == Method::POST;
        let not_allowed = || {
            jira_error(
                StatusCode::METHOD_NOT_ALLOWED,
                &[&format!("Method {method} is not allowed on {path}.")],
                json!({}),
            )
        };
        match segments.as_slice() {
            ["myself"] if get => json_answer(StatusCode::OK, self.myself(), None),
            ["myself"] => not_allowed(),
            ["issue", key] if get => match self.find(key, "see") {
                Ok(i) => self.get_issue(i, &query),
                Err(answer) => answer,
            },
            ["issue", _] => not_allowed(),
            ["issue", key, "comment"] if get || post => {
                let action = if get { "see" } else { "comment on" };
                match self.find(key, action) {
                    Ok(i) if get => self.get_comments(i, &query),
                    Ok(i) => self.post_comment(i, &query, headers, body),
                    Err(answer) => answer,
                }
            }
            ["issue", key, "transitions"] if get || post => {
                let action = if get { "see" } else { "transition" };
                match self.find(key, action) {
                    Ok(i) if get => self.get_transitions(i, &query),
                    Ok(i) => self.post_transition(i, headers, body),
                    Err(answer) => answer,
                }
            }
            ["issue", _, "comment" | "transitions"] => not_allowed(),
            _ => jira_error(
                StatusCode::NOT_FOUND,
                &[&format!("null for uri: {}{path}", self.base)],
                json!({}),
            ),
        }
    }

    fn authenticate(&self, headers: &HeaderMap) -> Result<(), Response> {
        let refused = |failed: bool| {
            let mut answer = jira_error(StatusCode::UNAUTHORIZED, &[NOT_AUTHENTICATED], json!({}));
            if failed {
                answer.headers_mut().insert(
                    "x-seraph-loginreason",
                    HeaderValue::from_static("AUTHENTICATED_FAILED"),
                );
            }
            answer
        };
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(refused(false));
        };
        let credentials = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .and_then(|(_, encoded)| {
                base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .ok()
            })
            .and_then(|raw| String::from_utf8(raw).ok());
        let fine = credentials.as_deref().and_then(|c| c.split_once(':'))
            == Some((self.email.as_str(), self.api_token.as_str()));
        if fine { Ok(()) } else { Err(refused(true)) }
    }

    /// The issue's index by key or id: 404 when there is none, 403 when the account may not
    /// `action` it.
    fn find(&self, key_or_id: &str, action: &str) -> Result<usize, Response> {
        let Some(i) = self
            .issues
            .iter()
            .position(|i| i.key == key_or_id || i.id == key_or_id)
        else {
            return Err(jira_error(StatusCode::NOT_FOUND, &[NO_ISSUE], json!({})));
        };
        if self.issues[i].forbidden {
            return Err(jira_error(
                StatusCode::FORBIDDEN,
                &[&format!(
                    "You do not have the permission to {action} this issue."
                )],
                json!({}),
            ));
        }
        Ok(i)
    }

    fn user(&self) -> Value {
        json!({
            "self": format!("{}/rest/api/3/user?accountId={}", self.base, self.account_id),
            "accountId": self.account_id,
            "emailAddress": self.email,
            "displayName": "Capstan",
            "active": true,
            "timeZone": "Etc/UTC",
            "accountType": "atlassian",
        })
    }

    fn myself(&self) -> Value {
        let mut user = self.user();
        user["locale"] = json!("en_US");
        user
    }

    fn status_json(&self, name: &str) -> Value {
        let (id, name, (category, key, colour, category_name)) = STATUSES
            .iter()
            .find(|s| s.1 == name)
            .copied()
            .unwrap_or(STATUSES[0]);
        json!({
            "self": format!("{}/rest/api/3/status/{id}", self.base),
            "description": "",
            "iconUrl": format!("{}/images/icons/statuses/generic.png", self.base),
            "name": name,
            "id": id,
            "statusCategory": {
                "self": format!("{}/rest/api/3/statuscategory/{category}", self.base),
                "id": category,
                "key": key,
                "colorName": colour,
                "name": category_name,
            },
        })
    }

    fn render_comment(
        &self,
        issue: &Issue,
        c: &Comment,
        properties: bool,
        rendered: bool,
    ) -> Value {
        let mut v = json!({
            "self": format!("{}/rest/api/3/issue/{}/comment/{}", self.base, issue.id, c.id),
            "id": c.id,
            "author": self.user(),
            "body": c.body,
            "updateAuthor": self.user(),
            "created": c.created,
            "updated": c.created,
            "jsdPublic": true,
        });
        if let Some(visibility) = &c.visibility {
            v["visibility"] = visibility.clone();
        }
        if properties {
            v["properties"] = c
                .properties
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
        }
        if rendered {
            v["renderedBody"] = json!(render_html(&c.body));
        }
        v
    }

    fn get_issue(&self, i: usize, query: &[(String, String)]) -> Response {
        let issue = &self.issues[i];
        let specs: Vec<&str> = query
            .iter()
            .filter(|(k, _)| k == "fields")
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let all = specs.is_empty() || specs.iter().any(|s| *s == "*all" || *s == "*navigable");
        let wanted = |field: &str| {
            (all || specs.contains(&field))
                && !specs.iter().any(|s| s.strip_prefix('-') == Some(field))
        };
        let mut fields = Map::new();
        if wanted("summary") {
            fields.insert("summary".into(), json!(issue.summary));
        }
        if wanted("status") {
            fields.insert("status".into(), self.status_json(issue.status));
        }
        if wanted("comment") {
            let comments: Vec<Value> = issue
                .comments
                .iter()
                .map(|c| self.render_comment(issue, c, false, false))
                .collect();
            fields.insert(
                "comment".into(),
                json!({
                    "comments": comments,
                    "self": format!("{}/rest/api/3/issue/{}/comment", self.base, issue.id),
                    "maxResults": comments.len(),
                    "total": comments.len(),
                    "startAt": 0,
                }),
            );
        }
        json_answer(
            StatusCode::OK,
            json!({
                "expand": "renderedFields,names,schema,operations,editmeta,changelog,versionedRepresentations",
                "id": issue.id,
                "self": format!("{}/rest/api/3/issue/{}", self.base, issue.id),
                "key": issue.key,
                "fields": fields,
            }),
            None,
        )
    }

    fn get_comments(&self, i: usize, query: &[(String, String)]) -> Response {
        let issue = &self.issues[i];
        let number = |name: &str| -> Result<Option<usize>, Response> {
            match query.iter().rev().find(|(k, _)| k == name) {
                None => Ok(None),
                Some((_, v)) => v
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| bad_request(&format!("The value '{v}' is not valid for {name}."))),
            }
        };
        let start = match number("startAt") {
            Ok(n) => n.unwrap_or(0),
            Err(answer) => return answer,
        };
        let max = match number("maxResults") {
            Ok(n) => n.unwrap_or(self.comment_page).min(self.comment_page),
            Err(answer) => return answer,
        };
        let newest_first = match query.iter().rev().find(|(k, _)| k == "orderBy") {
            None => false,
            Some((_, v)) => match v.as_str() {
                "created" | "+created" => false,
                "-created" => true,
                other => return bad_request(&format!("Invalid orderBy value '{other}'.")),
            },
        };
        let expand: Vec<&str> = query
            .iter()
            .filter(|(k, _)| k == "expand")
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .collect();
        let mut ordered: Vec<&Comment> = issue.comments.iter().collect();
        if newest_first {
            ordered.reverse();
        }
        let comments: Vec<Value> = ordered
            .iter()
            .skip(start)
            .take(max)
            .map(|c| {
                self.render_comment(
                    issue,
                    c,
                    expand.contains(&"properties"),
                    expand.contains(&"renderedBody"),
                )
            })
            .collect();
        json_answer(
            StatusCode::OK,
            json!({
                "comments": comments,
                "maxResults": max,
                "total": issue.comments.len(),
                "startAt": start,
            }),
            None,
        )
    }

    fn create_comment(
        &mut self,
        key: &str,
        body: Value,
        properties: Vec<(String, Value)>,
        visibility: Option<Value>,
    ) -> String {
        let id = self.next_comment_id.to_string();
        self.next_comment_id += 1;
        let created = jira_time();
        self.issue_mut(key).comments.push(Comment {
            id: id.clone(),
            body,
            properties,
            visibility,
            created,
        });
        id
    }

    fn post_comment(
        &mut self,
        i: usize,
        query: &[(String, String)],
        headers: &HeaderMap,
        body: &[u8],
    ) -> Response {
        let request = match json_body(headers, body) {
            Ok(v) => v,
            Err(answer) => return answer,
        };
        const WRITABLE: [&str; 3] = ["body", "visibility", "properties"];
        // Read-only fields of the comment bean: Jira accepts them on input and ignores them.
        const IGNORED: [&str; 10] = [
            "id",
            "self",
            "author",
            "updateAuthor",
            "created",
            "updated",
            "renderedBody",
            "jsdPublic",
            "jsdAuthorCanSeeRequest",
            "parentId",
        ];
        if let Some(unknown) = request
            .keys()
            .find(|k| !WRITABLE.contains(&k.as_str()) && !IGNORED.contains(&k.as_str()))
        {
            return bad_request(&format!(
                "Unrecognized field \"{unknown}\" (not marked as ignorable)."
            ));
        }
        let doc = match request.get("body") {
            None | Some(Value::Null) => return comment_error("Comment body can not be empty!"),
            Some(doc) => doc,
        };
        if !valid_doc(doc) {
            return comment_error("Comment body is not valid!");
        }
        if plain_text(doc).trim().is_empty() {
            return comment_error("Comment body can not be empty!");
        }
        let properties = match request.get("properties") {
            None | Some(Value::Null) => Vec::new(),
            Some(value) => match entity_properties(value) {
                Ok(p) => p,
                Err(message) => return bad_request(&message),
            },
        };
        let visibility = match request.get("visibility") {
            None | Some(Value::Null) => None,
            Some(value) => match check_visibility(value) {
                Ok(()) => Some(value.clone()),
                Err(message) => return bad_request(&message),
            },
        };
        let key = self.issues[i].key.clone();
        let id = self.create_comment(&key, doc.clone(), properties, visibility);
        let expand: Vec<&str> = query
            .iter()
            .filter(|(k, _)| k == "expand")
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .collect();
        let issue = &self.issues[i];
        let comment = issue
            .comments
            .iter()
            .find(|c| c.id == id)
            .expect("the comment just created");
        json_answer(
            StatusCode::CREATED,
            self.render_comment(
                issue,
                comment,
                expand.contains(&"properties"),
                expand.contains(&"renderedBody"),
            ),
            None,
        )
    }

    fn available(
        &self,
        i: usize,
    ) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str, &'static str)>
    {
        let status = self.issues[i].status;
        TRANSITIONS.iter().filter(move |t| t.2 == status)
    }

    fn get_transitions(&self, i: usize, query: &[(String, String)]) -> Response {
        let only = query
            .iter()
            .rev()
            .find(|(k, _)| k == "transitionId")
            .map(|(_, v)| v.as_str());
        let transitions: Vec<Value> = self
            .available(i)
            .filter(|t| only.is_none_or(|id| id == t.0))
            .map(|(id, name, _, to)| {
                json!({
                    "id": id,
                    "name": name,
                    "to": self.status_json(to),
                    "hasScreen": false,
                    "isGlobal": false,
                    "isInitial": false,
                    "isAvailable": true,
                    "isConditional": false,
                    "isLooped": false,
                })
            })
            .collect();
        json_answer(
            StatusCode::OK,
            json!({"expand": "transitions", "transitions": transitions}),
            None,
        )
    }

    fn post_transition(&mut self, i: usize, headers: &HeaderMap, body: &[u8]) -> Response {
        let request = match json_body(headers, body) {
            Ok(v) => v,
            Err(answer) => return answer,
        };
        const KNOWN: [&str; 5] = [
            "transition",
            "fields",
            "update",
            "historyMetadata",
            "properties",
        ];
        if let Some(unknown) = request.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return bad_request(&format!(
                "Unrecognized field \"{unknown}\" (not marked as ignorable)."
            ));
        }
        // No transition here has a screen, so no field can be set on one.
        let mut errors = Map::new();
        for part in ["fields", "update"] {
            match request.get(part) {
                None | Some(Value::Null) => {}
                Some(Value::Object(fields)) => {
                    for name in fields.keys() {
                        errors.insert(
                            name.clone(),
                            json!(format!(
                                "Field '{name}' cannot be set. It is not on the appropriate screen, or unknown."
                            )),
                        );
                    }
                }
                Some(_) => return bad_request(&format!("'{part}' must be an object.")),
            }
        }
        if !errors.is_empty() {
            return jira_error(StatusCode::BAD_REQUEST, &[], Value::Object(errors));
        }
        if let Some(properties) = request.get("properties").filter(|p| !p.is_null())
            && let Err(message) = entity_properties(properties)
        {
            return bad_request(&message);
        }
        let Some(transition) = request.get("transition").and_then(Value::as_object) else {
            return bad_request("Missing 'transition' identifier.");
        };
        if let Some(unknown) = transition
            .keys()
            .find(|k| !matches!(k.as_str(), "id" | "looped"))
        {
            return bad_request(&format!(
                "Unrecognized field \"{unknown}\" (not marked as ignorable)."
            ));
        }
        // Jira's JSON binding reads a number where the id's string is expected.
        let id = match transition.get("id") {
            Some(Value::String(id)) => id.clone(),
            Some(Value::Number(id)) => id.to_string(),
            _ => return bad_request("Missing 'transition' identifier."),
        };
        let Some(&(_, _, _, to)) = self.available(i).find(|t| t.0 == id) else {
            return bad_request(&format!(
                "Transition id '{id}' is not valid for this issue."
            ));
        };
        self.issues[i].status = to;
        StatusCode::NO_CONTENT.into_response()
    }
}

/// A POST's JSON object, or Jira's refusal (415 for another media type, 400 for bad JSON).
fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Map<String, Value>, Response> {
    if !is_json(headers) {
        return Err(jira_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &["Unsupported Media Type: the body must be application/json."],
            json!({}),
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad_request("The request body must be a JSON object.")),
        Err(e) => Err(bad_request(&format!("Unexpected JSON: {e}"))),
    }
}

/// Entity properties as Jira takes them: `[{"key": "...", "value": <JSON>}]`.
fn entity_properties(value: &Value) -> Result<Vec<(String, Value)>, String> {
    let Some(all) = value.as_array() else {
        return Err("'properties' must be a list of {\"key\", \"value\"}.".to_owned());
    };
    let mut out: Vec<(String, Value)> = Vec::new();
    for p in all {
        let Some(p) = p.as_object() else {
            return Err("A property must be an object with a key and a value.".to_owned());
        };
        if let Some(unknown) = p.keys().find(|k| !matches!(k.as_str(), "key" | "value")) {
            return Err(format!(
                "Unrecognized field \"{unknown}\" (not marked as ignorable)."
            ));
        }
        let key = match p.get("key").and_then(Value::as_str) {
            Some(k) if !k.is_empty() && k.chars().count() <= 255 => k,
            _ => {
                return Err("The property key must be a string of 1 to 255 characters.".to_owned());
            }
        };
        let value = match p.get("value") {
            Some(v) if !v.is_null() => v,
            _ => return Err(format!("The property '{key}' has no value.")),
        };
        if value.to_string().len() > PROPERTY_VALUE_MAX_BYTES {
            return Err(format!(
                "The property '{key}' is too large: a value holds at most {PROPERTY_VALUE_MAX_BYTES} bytes."
            ));
        }
        out.retain(|(k, _)| k != key);
        out.push((key.to_owned(), value.clone()));
    }
    Ok(out)
}

fn check_visibility(value: &Value) -> Result<(), String> {
    let Some(v) = value.as_object() else {
        return Err("'visibility' must be an object.".to_owned());
    };
    if let Some(unknown) = v
        .keys()
        .find(|k| !matches!(k.as_str(), "type" | "value" | "identifier"))
    {
        return Err(format!(
            "Unrecognized field \"{unknown}\" (not marked as ignorable)."
        ));
    }
    let typed = matches!(
        v.get("type").and_then(Value::as_str),
        Some("group" | "role")
    );
    let named = ["value", "identifier"].iter().any(|k| {
        v.get(*k)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    });
    if typed && named {
        Ok(())
    } else {
        Err("Visibility needs a type (group or role) and a value or identifier.".to_owned())
    }
}

/// Whether `object`'s keys are all among `allowed`.
fn only(object: &Map<String, Value>, allowed: &[&str]) -> bool {
    object.keys().all(|k| allowed.contains(&k.as_str()))
}

/// An ADF document of the subset this server accepts: `{"type": "doc", "version": 1,
/// "content": [paragraph...]}`.
fn valid_doc(doc: &Value) -> bool {
    let Some(d) = doc.as_object() else {
        return false;
    };
    only(d, &["type", "version", "content"])
        && d.get("type") == Some(&json!("doc"))
        && d.get("version").and_then(Value::as_u64) == Some(1)
        && d.get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| blocks.iter().all(valid_paragraph))
}

fn valid_paragraph(node: &Value) -> bool {
    let Some(p) = node.as_object() else {
        return false;
    };
    let attrs_fine = match p.get("attrs") {
        None => true,
        Some(Value::Object(a)) => only(a, &["localId"]) && a.values().all(Value::is_string),
        Some(_) => false,
    };
    let content_fine = match p.get("content") {
        None => true,
        Some(Value::Array(inline)) => inline.iter().all(valid_inline),
        Some(_) => false,
    };
    only(p, &["type", "content", "attrs"])
        && p.get("type") == Some(&json!("paragraph"))
        && attrs_fine
        && content_fine
}

fn valid_inline(node: &Value) -> bool {
    let Some(n) = node.as_object() else {
        return false;
    };
    match n.get("type").and_then(Value::as_str) {
        Some("text") => {
            let marks_fine = match n.get("marks") {
                None => true,
                Some(Value::Array(marks)) => {
                    let mut seen: Vec<&str> = Vec::new();
                    marks.iter().all(|m| match valid_mark(m) {
                        Some(kind) if !seen.contains(&kind) => {
                            seen.push(kind);
                            true
                        }
                        _ => false,
                    })
                }
                Some(_) => false,
            };
            only(n, &["type", "text", "marks"])
                && n.get("text")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty())
                && marks_fine
        }
        Some("hardBreak") => {
            let attrs_fine = match n.get("attrs") {
                None => true,
                Some(Value::Object(a)) => only(a, &["text"]) && a.get("text") == Some(&json!("\n")),
                Some(_) => false,
            };
            only(n, &["type", "attrs"]) && attrs_fine
        }
        _ => false,
    }
}

/// A mark's type when the mark is valid ADF.
fn valid_mark(mark: &Value) -> Option<&str> {
    let m = mark.as_object()?;
    if !only(m, &["type", "attrs"]) {
        return None;
    }
    let kind = m.get("type")?.as_str()?;
    let attrs = m.get("attrs");
    let attr = |name: &str| attrs.and_then(|a| a.get(name)).and_then(Value::as_str);
    let attrs_only = |allowed: &[&str]| match attrs {
        None => true,
        Some(Value::Object(a)) => only(a, allowed),
        Some(_) => false,
    };
    let fine = match kind {
        "strong" | "em" | "code" | "strike" | "underline" => attrs.is_none(),
        "link" => {
            attrs_only(&["href", "title", "id", "collection", "occurrenceKey"])
                && attr("href").is_some_and(|h| !h.is_empty())
        }
        "subsup" => attrs_only(&["type"]) && matches!(attr("type"), Some("sub" | "sup")),
        "textColor" | "backgroundColor" => {
            attrs_only(&["color"])
                && attr("color").is_some_and(|c| {
                    c.len() == 7
                        && c.starts_with('#')
                        && c[1..].bytes().all(|b| b.is_ascii_hexdigit())
                })
        }
        _ => false,
    };
    fine.then_some(kind)
}

/// The text of a valid document, paragraphs and hard breaks as line breaks.
fn plain_text(doc: &Value) -> String {
    let mut lines = Vec::new();
    for block in doc["content"].as_array().into_iter().flatten() {
        let mut line = String::new();
        for node in block["content"].as_array().into_iter().flatten() {
            match node["type"].as_str() {
                Some("text") => line.push_str(node["text"].as_str().unwrap_or_default()),
                _ => line.push('\n'),
            }
        }
        lines.push(line);
    }
    lines.join("\n")
}

/// `renderedBody`: each paragraph a `<p>`, hard breaks `<br/>`, text escaped.
fn render_html(doc: &Value) -> String {
    let escape = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let mut html = String::new();
    for block in doc["content"].as_array().into_iter().flatten() {
        html.push_str("<p>");
        for node in block["content"].as_array().into_iter().flatten() {
            match node["type"].as_str() {
                Some("text") => html.push_str(&escape(node["text"].as_str().unwrap_or_default())),
                _ => html.push_str("<br/>"),
            }
        }
        html.push_str("</p>");
    }
    html
}
