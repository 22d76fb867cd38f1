//! Ticketing on the Jira Cloud REST API v3 (`[providers.ticketing] kind = "jira"`), with an
//! Atlassian account's API token (HTTP Basic, as Atlassian documents for scripts).
//!
//! - **Tickets** are issues by key (`OPS-12`): title = summary, comments as plain text (their
//!   Atlassian Document Format flattened, one line per paragraph).
//! - **Statuses** speak the workflows' words (`resolved`, `pending-assistance`): a Jira status
//!   is named by `statuses` when the settings map it, else matched ignoring case, spaces,
//!   hyphens and underscores (`Pending Assistance` is `pending-assistance`). A ticket's status is
//!   answered in the same words, so what a workflow compares and what a rollback restores are
//!   one vocabulary.
//! - **Comments** are posted in Atlassian Document Format, one paragraph per line. Jira has no
//!   idempotency key, so each comment carries an entity property `capstan` with the engine's
//!   token, and the ledger records the intent first: a repeat after a crash finds its comment
//!   instead of posting it twice.
//! - **Transitions** go through the issue's workflow: the transition available now whose
//!   target status is the one asked for (`invalid-transition` when there is none; the message
//!   names those there are). The ledger keeps the status the ticket had, for the receipt and
//!   the rollback.

use crate::http::{self, segment};
use crate::ledger::{Entry, Ledger};
use crate::model::arg;
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

type Answer = Result<Value, CapabilityError>;

const SERVICE: &str = "Jira";
/// The entity property that carries a comment's idempotency token.
const TOKEN_PROPERTY: &str = "capstan";

/// `[providers.ticketing] kind = "jira"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JiraSettings {
    /// The site, `https://<your-site>.atlassian.net`.
    pub base_url: String,
    /// The Atlassian account the API token belongs to.
    pub email: String,
    /// The API token, from a file or a named environment variable.
    #[serde(default)]
    pub api_token_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub api_token_env: Option<String>,
    /// Workflow status → Jira status name, where matching by name is not enough
    /// (`resolved = "Done"`).
    #[serde(default)]
    pub statuses: BTreeMap<String, String>,
    /// Deadline of one request.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    30_000
}

/// A status name reduced to what matching by name compares.
fn folded(name: &str) -> String {
    name.split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

/// A workflow's text as an Atlassian Document Format document: one paragraph per line.
fn to_adf(text: &str) -> Value {
    let paragraphs: Vec<Value> = text
        .lines()
        .map(|line| {
            if line.is_empty() {
                json!({"type": "paragraph"})
            } else {
                json!({"type": "paragraph", "content": [{"type": "text", "text": line}]})
            }
        })
        .collect();
    json!({"type": "doc", "version": 1, "content": paragraphs})
}

/// An ADF document's text: text nodes in order, hard breaks and blocks as line breaks.
fn from_adf(node: &Value) -> String {
    fn walk(node: &Value, out: &mut String) {
        match node["type"].as_str() {
            Some("text") => out.push_str(node["text"].as_str().unwrap_or_default()),
            Some("hardBreak") => out.push('\n'),
            _ => {
                let blocks = node["content"].as_array().map(Vec::as_slice).unwrap_or(&[]);
                let inline = node["type"] == "paragraph" || node["type"] == "heading";
                for (i, child) in blocks.iter().enumerate() {
                    if i > 0 && !inline {
                        out.push('\n');
                    }
                    walk(child, out);
                }
            }
        }
    }
    let mut out = String::new();
    walk(node, &mut out);
    out
}

#[derive(Debug, Deserialize)]
struct Issue {
    key: String,
    fields: IssueFields,
}

#[derive(Debug, Deserialize)]
struct IssueFields {
    #[serde(default)]
    summary: String,
    status: Named,
}

#[derive(Debug, Deserialize)]
struct Named {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Transitions {
    transitions: Vec<Transition>,
}

#[derive(Debug, Deserialize)]
struct Transition {
    id: String,
    to: Named,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CommentPage {
    #[serde(default)]
    start_at: u64,
    #[serde(default)]
    total: u64,
    #[serde(default)]
    comments: Vec<Value>,
}

pub struct Jira {
    http: reqwest::Client,
    base: String,
    email: String,
    api_token: String,
    statuses: BTreeMap<String, String>,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Jira {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jira")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Jira {
    pub fn new(s: &JiraSettings, node: &Node) -> Result<Self, SettingsError> {
        let c = Capability::Ticketing;
        if s.email.trim().is_empty() {
            return Err(SettingsError::new(c, "email", "is empty"));
        }
        Ok(Self {
            http: http::client(c, s.timeout_ms)?,
            base: http::base_url(c, "base_url", &s.base_url)?,
            email: s.email.trim().to_owned(),
            api_token: crate::secret::read(
                c,
                "api_token",
                s.api_token_file.as_ref(),
                s.api_token_env.as_deref(),
            )?,
            statuses: s.statuses.clone(),
            ledger: Ledger::new(node.store.writer().clone(), "jira"),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/rest/api/3/{path}", self.base)
    }

    /// One request; the answer's JSON (null for an empty body), or the capability error.
    async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let request = request
            .basic_auth(&self.email, Some(&self.api_token))
            .header(reqwest::header::ACCEPT, "application/json");
        let (status, headers, json) = http::exchange(SERVICE, request).await?;
        if status.is_success() {
            return Ok(json);
        }
        // Jira's error body: {"errorMessages": [...], "errors": {"field": "message"}}.
        let mut detail: Vec<String> = json["errorMessages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect();
        if let Some(fields) = json["errors"].as_object() {
            detail.extend(
                fields
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default())),
            );
        }
        Err(http::status_error(
            SERVICE,
            status,
            &headers,
            &detail.join("; "),
        ))
    }

    /// A Jira status name in the workflows' words.
    fn ours(&self, jira: &str) -> String {
        self.statuses
            .iter()
            .find(|(_, name)| folded(name) == folded(jira))
            .map(|(ours, _)| ours.clone())
            .unwrap_or_else(|| folded(jira))
    }

    /// Whether the Jira status `jira` is the workflows' `ours`.
    fn is(&self, jira: &str, ours: &str) -> bool {
        let wanted = self.statuses.get(ours).map_or(ours, String::as_str);
        folded(jira) == folded(wanted)
    }

    async fn issue(&self, id: &str) -> Result<Issue, CapabilityError> {
        let answer = self
            .send(
                self.http
                    .get(self.url(&format!("issue/{id}")))
                    .query(&[("fields", "summary,status")]),
            )
            .await?;
        parse(answer)
    }

    /// Every comment of an issue, oldest first (`properties` expanded when asked).
    async fn comments(&self, id: &str, properties: bool) -> Result<Vec<Value>, CapabilityError> {
        let mut all = Vec::new();
        loop {
            let start = all.len().to_string();
            let mut query = vec![("startAt", start.as_str()), ("maxResults", "100")];
            if properties {
                query.push(("expand", "properties"));
            }
            let page: CommentPage = parse(
                self.send(
                    self.http
                        .get(self.url(&format!("issue/{id}/comment")))
                        .query(&query),
                )
                .await?,
            )?;
            let got = page.comments.len() as u64;
            all.extend(page.comments);
            if got == 0 || page.start_at + got >= page.total {
                return Ok(all);
            }
        }
    }

    async fn get_ticket(&self, request: &Value) -> Answer {
        let id: String = arg(request, "id")?;
        segment("ticket id", &id)?;
        let issue = match self.issue(&id).await {
            Ok(issue) => issue,
            Err(e) if e.code == "not-found" => return Ok(Value::Null),
            Err(e) => return Err(e),
        };
        let comments: Vec<String> = self
            .comments(&id, false)
            .await?
            .iter()
            .map(|c| from_adf(&c["body"]))
            .collect();
        Ok(json!({
            "id": issue.key,
            "title": issue.fields.summary,
            "status": self.ours(&issue.fields.status.name),
            "comments": comments,
        }))
    }

    async fn add_comment(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "ticketing.add-comment";
        let id: String = arg(request, "id")?;
        segment("ticket id", &id)?;
        let body: String = arg(request, "body")?;
        if body.trim().is_empty() {
            return Err(CapabilityError::permanent(
                "invalid-request",
                "a comment needs a body",
            ));
        }
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            // Posted before a crash? The comment carries the token.
            Some(Entry::Intent(_)) => {
                let posted = self.comments(&id, true).await?.into_iter().find(|c| {
                    c["properties"].as_array().is_some_and(|props| {
                        props
                            .iter()
                            .any(|p| p["key"] == TOKEN_PROPERTY && p["value"]["token"] == token)
                    })
                });
                if let Some(comment) = posted {
                    let answer = json!({"ticket_id": id, "comment_id": comment["id"]});
                    self.ledger.done(token, OP, &answer, self.now()).await?;
                    return Ok(answer);
                }
            }
            None if !token.is_empty() => {
                self.ledger
                    .intend(token, OP, request, &json!({}), self.now())
                    .await?;
            }
            None => {}
        }
        let mut comment = json!({"body": to_adf(&body)});
        if !token.is_empty() {
            comment["properties"] = json!([{"key": TOKEN_PROPERTY, "value": {"token": token}}]);
        }
        let created = self
            .send(
                self.http
                    .post(self.url(&format!("issue/{id}/comment")))
                    .json(&comment),
            )
            .await?;
        let Some(comment_id) = created["id"].as_str() else {
            return Err(CapabilityError::permanent(
                "invalid-response",
                format!("{SERVICE} answered a comment without an id"),
            ));
        };
        let answer = json!({"ticket_id": id, "comment_id": comment_id});
        if !token.is_empty() {
            self.ledger.done(token, OP, &answer, self.now()).await?;
        }
        Ok(answer)
    }

    async fn transition(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "ticketing.transition-ticket";
        let id: String = arg(request, "id")?;
        segment("ticket id", &id)?;
        let to: String = arg(request, "status")?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        let recorded = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(was)) => was["from"].as_str().map(str::to_owned),
            None => None,
        };
        let issue = self.issue(&id).await?;
        let from = match recorded {
            Some(from) => from,
            None => {
                let from = self.ours(&issue.fields.status.name);
                if !token.is_empty() {
                    self.ledger
                        .intend(token, OP, request, &json!({"from": from}), self.now())
                        .await?;
                }
                from
            }
        };
        let answer = json!({"ticket_id": issue.key, "from": from, "to": to});
        if !self.is(&issue.fields.status.name, &to) {
            let available: Transitions = parse(
                self.send(self.http.get(self.url(&format!("issue/{id}/transitions"))))
                    .await?,
            )?;
            let Some(step) = available
                .transitions
                .iter()
                .find(|t| self.is(&t.to.name, &to))
            else {
                if !token.is_empty() {
                    self.ledger.forget(token).await?;
                }
                let there: Vec<String> = available
                    .transitions
                    .iter()
                    .map(|t| self.ours(&t.to.name))
                    .collect();
                return Err(CapabilityError::permanent(
                    "invalid-transition",
                    format!(
                        "{id} cannot move from {} to {to} in its workflow; it can move to: {}",
                        self.ours(&issue.fields.status.name),
                        if there.is_empty() {
                            "nothing".to_owned()
                        } else {
                            there.join(", ")
                        }
                    ),
                ));
            };
            self.send(
                self.http
                    .post(self.url(&format!("issue/{id}/transitions")))
                    .json(&json!({"transition": {"id": step.id}})),
            )
            .await?;
        }
        if !token.is_empty() {
            self.ledger.done(token, OP, &answer, self.now()).await?;
        }
        Ok(answer)
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, CapabilityError> {
    http::parse(SERVICE, value)
}

#[async_trait]
impl Providers for Jira {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "ticketing.get-ticket" => self.get_ticket(request).await,
            "ticketing.add-comment" => self.add_comment(request, token).await,
            "ticketing.transition-ticket" => self.transition(request, token).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the jira provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "jira"
    }

    async fn reachable(&self) -> Result<(), String> {
        self.send(self.http.get(self.url("myself")))
            .await
            .map(|_| ())
            .map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_match_by_name_whatever_the_spelling() {
        assert_eq!(folded("Pending Assistance"), "pending-assistance");
        assert_eq!(folded("pending_assistance"), "pending-assistance");
        assert_eq!(folded("  To  Do "), "to-do");
        assert_eq!(folded("resolved"), folded("RESOLVED"));
    }

    #[test]
    fn text_goes_to_adf_and_comes_back_the_same() {
        let text = "Onboarding of example.com: done.\n- route-manually: add an ALIAS\n\nend";
        let doc = to_adf(text);
        assert_eq!(doc["type"], "doc");
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["content"].as_array().map(Vec::len), Some(4));
        assert_eq!(doc["content"][2], json!({"type": "paragraph"}));
        assert_eq!(from_adf(&doc), text);
        let with_break = json!({"type": "doc", "version": 1, "content": [
            {"type": "paragraph", "content": [
                {"type": "text", "text": "a"}, {"type": "hardBreak"},
                {"type": "text", "text": "b", "marks": [{"type": "strong"}]}
            ]}
        ]});
        assert_eq!(from_adf(&with_break), "a\nb");
    }
}
