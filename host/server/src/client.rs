//! `capstan executions …` and `capstan trigger`: a client of a running server's `/v1` API, for
//! operators at a terminal and for scripts. It never opens the database, so it works against a
//! remote node with nothing but an API key, and answers exactly what the API answers.
//!
//! The server is `--server` or `CAPSTAN_SERVER` (default `http://127.0.0.1:8080`); the key is
//! `CAPSTAN_TOKEN`, or the first line of `--token-file` (never a flag: a flag's value is visible
//! to every user of the machine in the process list).

use anyhow::Context as _;
use serde_json::Value;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// How long one await request asks the server to hold it (`GET /v1/executions/{id}?wait=`):
/// short, so a watch shows each stage as it moves, not only the end.
const WATCH_STEP: &str = "500ms";

/// Where the API is and who is asking.
#[derive(Debug, Clone, clap::Args)]
pub struct RemoteArgs {
    /// Base URL of the server's main listener.
    #[arg(
        long,
        global = true,
        env = "CAPSTAN_SERVER",
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    pub server: String,
    /// A file whose first line is the API key (else the CAPSTAN_TOKEN environment variable).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A connection to the API.
#[derive(Debug)]
pub struct Remote {
    base: String,
    token: String,
    http: reqwest::Client,
    pub json: bool,
}

impl Remote {
    pub fn new(args: &RemoteArgs) -> anyhow::Result<Self> {
        let token = match &args.token_file {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the token file {}", file.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned(),
            None => std::env::var("CAPSTAN_TOKEN").unwrap_or_default(),
        };
        anyhow::ensure!(
            !token.is_empty(),
            "no API key: set CAPSTAN_TOKEN or pass --token-file (mint one with `capstan api-keys mint`)"
        );
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(40))
            .build()?;
        Ok(Self {
            base: args.server.trim_end_matches('/').to_owned(),
            token,
            http,
            json: args.json,
        })
    }

    /// `method path` with an optional JSON body: the answer's JSON, or the API's error as the
    /// error (status, code, reason and message, as the server gave them).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.token);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let json: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok(json);
        }
        let code = json["error"].as_str().unwrap_or("error");
        let reason = json["reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        let message = json["message"].as_str().unwrap_or_default();
        anyhow::bail!("{} {code}{reason}: {message}", status.as_u16())
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None, &[]).await
    }

    pub async fn post(&self, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, body, &[]).await
    }

    /// Prints `value` as JSON (`--json`) or through `human`.
    pub fn print(&self, value: &Value, human: impl FnOnce(&Value) -> String) {
        let text = if self.json {
            serde_json::to_string_pretty(value).unwrap_or_default()
        } else {
            human(value)
        };
        println!("{text}");
    }
}

/// The exit status that tells how an execution stands: 0 succeeded; 3 failed; 4 canceled or
/// rolled back; 5 paused or waiting (someone has to act: resume, approve, or wait out a timer).
pub fn exit_for(status: &str) -> ExitCode {
    match status {
        "succeeded" => ExitCode::SUCCESS,
        "failed" => ExitCode::from(3),
        "canceled" | "rolled_back" => ExitCode::from(4),
        _ => ExitCode::from(5),
    }
}

/// Whether an execution is still on its way (the CLI keeps watching).
fn moving(execution: &Value) -> bool {
    matches!(execution["status"].as_str(), Some("queued" | "running"))
}

/// Follows an execution until it is neither queued nor running, printing each stage as it
/// moves (or, with `--json`, each new state of the execution as one line). Returns its last
/// state.
pub async fn watch(remote: &Remote, id: &str) -> anyhow::Result<Value> {
    let mut shown: Vec<(String, String)> = Vec::new();
    let mut last_status = String::new();
    loop {
        let execution = remote
            .get(&format!("/v1/executions/{id}?wait={WATCH_STEP}"))
            .await?;
        let stages: Vec<(String, String)> = execution["stages"]
            .as_array()
            .map(|stages| {
                stages
                    .iter()
                    .map(|s| {
                        (
                            s["stageName"].as_str().unwrap_or_default().to_owned(),
                            s["status"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let status = execution["status"].as_str().unwrap_or_default().to_owned();
        if stages != shown || status != last_status {
            if remote.json {
                println!("{}", serde_json::to_string(&execution).unwrap_or_default());
            } else {
                for (name, stage_status) in &stages {
                    if !shown.contains(&(name.clone(), stage_status.clone())) {
                        println!("  {:<24} {stage_status}", name);
                    }
                }
                if status != last_status {
                    println!("{id}: {status}");
                }
            }
            let _ = std::io::stdout().flush();
            shown = stages;
            last_status = status;
        }
        if !moving(&execution) {
            return Ok(execution);
        }
    }
}

/// The execution as a human reads it: what it is, then its stages.
pub fn show(execution: &Value) -> String {
    let field = |name: &str| execution[name].as_str().unwrap_or("-").to_owned();
    let mut out = format!(
        "execution  {}\nworkflow   {}\nstatus     {}\nprincipal  {}\ncreated    {}\nfinished   {}\n",
        field("executionId"),
        field("workflow"),
        field("status"),
        field("principalId"),
        field("createdAt"),
        field("finishedAt"),
    );
    if let Some(at) = execution["cancellationRequestedAt"].as_str() {
        out.push_str(&format!("cancel requested at {at}\n"));
    }
    let rows: Vec<Vec<String>> = execution["stages"]
        .as_array()
        .map(|stages| {
            stages
                .iter()
                .map(|s| {
                    let text = |name: &str| s[name].as_str().unwrap_or("-").to_owned();
                    let error = match &s["errorJson"] {
                        Value::Null => String::new(),
                        e => e["message"]
                            .as_str()
                            .map_or_else(|| e.to_string(), str::to_owned),
                    };
                    vec![
                        text("stageName"),
                        text("status"),
                        text("startedAt"),
                        text("finishedAt"),
                        error,
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["STAGE", "STATUS", "STARTED", "FINISHED", "ERROR"],
            &rows,
        ));
    }
    if let Some(outcome) = execution.get("outcome").filter(|o| !o.is_null()) {
        out.push_str("\noutcome\n");
        out.push_str(&serde_json::to_string_pretty(outcome).unwrap_or_default());
        out.push('\n');
    }
    out.trim_end().to_owned()
}

/// `GET /v1/executions` as a table.
pub fn list(page: &Value) -> String {
    let rows: Vec<Vec<String>> = page["executions"]
        .as_array()
        .map(|executions| {
            executions
                .iter()
                .map(|e| {
                    [
                        "executionId",
                        "workflow",
                        "status",
                        "principalId",
                        "createdAt",
                    ]
                    .iter()
                    .map(|f| e[*f].as_str().unwrap_or("-").to_owned())
                    .collect()
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        return "no executions".to_owned();
    }
    table(&["ID", "WORKFLOW", "STATUS", "PRINCIPAL", "CREATED"], &rows)
}

/// `GET /v1/executions/{id}/events` as one line an event.
pub fn events(page: &Value) -> String {
    let rows: Vec<Vec<String>> = page["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| {
                    ["occurredAt", "eventType", "eventVersion", "eventId"]
                        .iter()
                        .map(|f| match &e[*f] {
                            Value::String(s) => s.clone(),
                            Value::Null => "-".to_owned(),
                            other => other.to_string(),
                        })
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default();
    table(&["AT", "EVENT", "VERSION", "ID"], &rows)
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(
        rows.iter()
            .map(|r| line(r.iter().map(String::as_str).collect())),
    );
    out.join("\n")
}

/// A trigger body from a file, or standard input for `-`.
pub fn read_input(path: &Path) -> anyhow::Result<Value> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("cannot read the input from stdin")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the input file {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_exit_status_tells_how_the_execution_ended() {
        let codes: Vec<String> = [
            "succeeded",
            "failed",
            "canceled",
            "rolled_back",
            "paused",
            "waiting",
        ]
        .iter()
        .map(|s| format!("{:?}", exit_for(s)))
        .collect();
        let expected: Vec<String> = [0u8, 3, 4, 4, 5, 5]
            .iter()
            .map(|c| format!("{:?}", ExitCode::from(*c)))
            .collect();
        assert_eq!(codes, expected);
    }

    #[test]
    fn tables_pad_columns_to_their_widest_cell() {
        let page = json!({"executions": [
            {"executionId": "e1", "workflow": "hello", "status": "succeeded", "principalId": "ops", "createdAt": "2026-01-01T00:00:00Z"},
            {"executionId": "e22", "workflow": "add-certificate", "status": "paused", "principalId": "o", "createdAt": "2026-01-02T00:00:00Z"},
        ]});
        assert_eq!(
            list(&page),
            "ID   WORKFLOW         STATUS     PRINCIPAL  CREATED\n\
             e1   hello            succeeded  ops        2026-01-01T00:00:00Z\n\
             e22  add-certificate  paused     o          2026-01-02T00:00:00Z"
        );
        assert_eq!(list(&json!({"executions": []})), "no executions");
    }
}
