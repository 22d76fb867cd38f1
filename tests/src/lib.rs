//! Helpers for black-box tests: spawn the real `capstan` binary on port 0 with a fresh database
//! (a SQLite file, or a PostgreSQL schema when `CAPSTAN_TEST_DATABASE=postgres`: see
//! `capstan_testdb`) and a workflows directory of the test's choosing, find its address
//! in its JSON log, stop it.
//!
//! The binary is the `capstan` the test build put in the target directory, next to the test
//! executable's `deps/` (`just build-tests`, which `just test` runs first).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `capstan` binary of this build profile: beside a binary of this crate
/// (`target/<profile>/`), one directory up from a test (`target/<profile>/deps/`).
pub fn capstan_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("the executable's directory");
    let candidates = [Some(dir), dir.parent()];
    let found = candidates
        .iter()
        .flatten()
        .map(|d| d.join("capstan"))
        .find(|bin| bin.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "no capstan binary beside {}: run `just build-tests` (just test does)",
            exe.display()
        )
    })
}

/// A built guest component under `target/`.
pub fn component(relative: &str) -> PathBuf {
    let path = repo().join("target").join(relative);
    assert!(
        path.is_file(),
        "{} is missing: run `just build-guests` first",
        path.display()
    );
    path
}

/// A `capstan` command with the test's database, workflows and data directories.
pub fn capstan(home: &Path) -> Command {
    let mut cmd = Command::new(capstan_bin());
    cmd.arg("--database")
        .arg(database_url(home))
        .arg("--workflows")
        .arg(home.join("workflows"))
        // Compiled components are content-addressed: test servers share one cache, unless the
        // home has a `data` directory of its own (tests of the cache itself).
        .arg("--data-dir")
        .arg(if home.join("data").is_dir() {
            home.join("data")
        } else {
            repo().join("target").join("e2e-data")
        })
        .arg("--log-format")
        .arg("json")
        .env_remove("RUST_LOG")
        .env("CAPSTAN_PEPPERS", "1:test-pepper-0123456789abcdef")
        .env(
            "CAPSTAN_SECRET_KEYS",
            "1:dGVzdC1zZWNyZXQta2V5LTAxMjM0NTY3ODlhYmNkZWY=",
        );
    let config = home.join("capstan.toml");
    if config.is_file() {
        cmd.arg("--config").arg(config);
    }
    cmd
}

/// The database of a test home: chosen when the home was made (`home_with`), so every server
/// and CLI call of the test shares it; a plain SQLite file in homes made otherwise.
pub fn database_url(home: &Path) -> String {
    std::fs::read_to_string(home.join("database-url"))
        .map(|url| url.trim().to_owned())
        .unwrap_or_else(|_| format!("sqlite://{}/capstan.db", home.display()))
}

/// Opens a test home's database directly (to check what the server stored).
pub async fn database(home: &Path) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(&database_url(home))
        .await
        .expect("open the test database")
}

/// What the simulated supplier, admission and voucher services did for a booking, oldest
/// first: `(operation, answer, calls)`, one row per effect (an effect is made once per
/// idempotency key; `calls` counts the asks, repeats after a crash included).
pub async fn step_effects(home: &Path, booking_id: &str) -> Vec<(String, serde_json::Value, i64)> {
    use sqlx::Row;
    let db = database(home).await;
    let rows = sqlx::query(
        "SELECT op, answer, calls FROM sim_step_effects WHERE booking_id = $1 ORDER BY created_ms, op",
    )
    .bind(booking_id)
    .fetch_all(&db)
    .await
    .expect("read sim_step_effects");
    db.close().await;
    rows.iter()
        .map(|r| {
            let answer: String = r.get(1);
            (
                r.get::<String, _>(0),
                serde_json::from_str(&answer).expect("a JSON answer"),
                r.get::<i64, _>(2),
            )
        })
        .collect()
}

/// Whether a booking's fulfilment is between a step's effect and its answer: the simulated
/// services hold an effect made under the key of the step the job still stands at
/// (`booking:<id>:step:<index>`), so that step's answer is not committed yet. A node killed
/// now re-runs the step, which asks again under the same key.
pub async fn step_in_flight(home: &Path, booking_id: &str) -> bool {
    let db = database(home).await;
    let (mid_step,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM sim_step_effects AS e
         JOIN fulfilment_jobs AS j ON e.idempotency_key = 'booking:' || j.booking_id || ':step:' || j.step_index
         WHERE e.booking_id = $1 AND j.state = 'running'",
    )
    .bind(booking_id)
    .fetch_one(&db)
    .await
    .expect("read sim_step_effects and fulfilment_jobs");
    db.close().await;
    mid_step > 0
}

/// What the simulated supplier recorded a booking's confirmation was worth: `(amount in the
/// currency's minor units, currency)`.
pub async fn supplier_charge(home: &Path, booking_id: &str) -> Option<(i64, String)> {
    let db = database(home).await;
    let charge = sqlx::query_as::<_, (i64, String)>(
        "SELECT amount_minor, currency FROM sim_step_effects WHERE booking_id = $1 AND op = 'supplier.confirm'",
    )
    .bind(booking_id)
    .fetch_optional(&db)
    .await
    .expect("read sim_step_effects");
    db.close().await;
    charge
}

/// A home for a server: the given components in `workflows/`, and a config granting the test
/// workflows their capabilities, with DNS that converges at once.
pub fn home(components: &[&str]) -> tempfile::TempDir {
    home_with(
        components,
        "workers = 4\nlease_ms = 3000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\npoint-record = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n",
    )
}

/// A home with these components and this `capstan.toml`, on the run's backend.
pub fn home_with(components: &[&str], config: &str) -> tempfile::TempDir {
    home_in(components, config, capstan_testdb::postgres())
}

/// A home on the test PostgreSQL whatever the run's backend (tests of several nodes).
pub fn home_on_postgres(components: &[&str], config: &str) -> tempfile::TempDir {
    home_in(components, config, true)
}

fn home_in(components: &[&str], config: &str, postgres: bool) -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("tempdir");
    let workflows = home.path().join("workflows");
    std::fs::create_dir_all(&workflows).expect("mkdir");
    for c in components {
        let src = component(c);
        std::fs::copy(&src, workflows.join(src.file_name().expect("file name"))).expect("copy");
    }
    std::fs::write(home.path().join("capstan.toml"), config).expect("config");
    // A fresh database for the home, made on a thread of its own: callers may be inside a runtime.
    let dir = home.path().to_owned();
    let url = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                if postgres {
                    capstan_testdb::fresh_postgres_url().await
                } else {
                    capstan_testdb::fresh_database_url(&dir).await
                }
            })
    })
    .join()
    .expect("create the test database");
    std::fs::write(home.path().join("database-url"), url).expect("database-url");
    home
}

pub fn cli(home: &Path, args: &[&str]) -> String {
    let out = capstan(home).args(args).output().expect("run capstan");
    assert!(
        out.status.success(),
        "capstan {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// An OpenAPI path template with each `{parameter}` replaced by `with`: `{}` to compare
/// templates whatever their parameter names, a placeholder to request the path.
pub fn fill_path_params(template: &str, with: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in template.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str(with);
            }
            '}' => in_param = false,
            _ if !in_param => out.push(c),
            _ => {}
        }
    }
    out
}

/// `capstan.toml` of a node serving the partner API: the test catalog
/// `tests/catalogs/small.json`, the fulfilment steps of `target/steps`, quick webhook retries,
/// supplier rejections for variant 5002, loopback HTTP receivers allowed; `extra` goes inside
/// `[booking]`.
pub fn partner_config(extra: &str) -> String {
    format!(
        "[booking]\ncatalog_file = \"{}\"\nsteps = \"{}\"\nwebhook_retry_waits_ms = [50, 50, 50, 50]\nsupplier_rejects = [\"5002\"]\n{extra}\n[webhooks]\nallow_loopback = true\nallow_http = true\n",
        repo().join("tests/catalogs/small.json").display(),
        repo().join("target/steps").display(),
    )
}

/// Creates a partner (`kind` booking or affiliate, `env` production or sandbox) with the CLI
/// and returns its key.
pub fn partner_key(home: &Path, kind: &str, env: &str) -> String {
    let out = cli(
        home,
        &[
            "partners",
            "create",
            "--name",
            &format!("{kind}-{env}"),
            "--type",
            kind,
            "--environment",
            env,
        ],
    );
    assert_eq!(out.lines().count(), 1, "only the key on stdout: {out:?}");
    out.trim().to_owned()
}

/// Grants `permissions` to `principal` and mints a key for it.
pub fn key_for(home: &Path, principal: &str, permissions: &[&str]) -> String {
    for p in permissions {
        cli(home, &["principals", "grant", principal, p]);
    }
    let out = cli(home, &["api-keys", "mint", "--principal", principal]);
    assert_eq!(out.lines().count(), 1, "mint prints only the key: {out:?}");
    out.trim().to_owned()
}

/// A running `capstan serve`.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub sandbox: String,
    /// The plain-HTTP redirect listener (`--http-redirect-listen`), when one was asked for.
    pub redirect: Option<String>,
    pub logs: mpsc::Receiver<String>,
    /// What the server logged before it listened.
    pub startup_log: Vec<String>,
}

impl Server {
    /// Starts `capstan serve` in `home` on ports chosen by the OS and waits until it listens.
    pub fn start(home: &Path) -> Self {
        Self::start_with(home, &[])
    }

    /// Starts `capstan serve` with extra flags (e.g. `--tls-cert`).
    pub fn start_with(home: &Path, extra: &[&str]) -> Self {
        Self::start_env(home, extra, &[])
    }

    /// Starts `capstan serve` with extra flags and environment variables.
    pub fn start_env(home: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = capstan(home)
            .envs(env.iter().copied())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--sandbox-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn capstan serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            let line = match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => line,
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "capstan serve did not report listening; log so far:\n{}",
                        seen.join("\n")
                    );
                }
            };
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line)
                && event["message"] == "listening"
            {
                let addr = event["addr"].as_str().expect("addr").to_owned();
                let sandbox = event["sandbox"].as_str().expect("sandbox").to_owned();
                let scheme = event["scheme"].as_str().unwrap_or("http").to_owned();
                return Self {
                    child,
                    base: format!("{scheme}://{addr}"),
                    sandbox: format!("{scheme}://{sandbox}"),
                    redirect: event["redirect"]
                        .as_str()
                        .filter(|r| *r != "None")
                        .map(|r| {
                            format!(
                                "http://{}",
                                r.trim_start_matches("Some(\"").trim_end_matches("\")")
                            )
                        }),
                    logs: rx,
                    startup_log: seen,
                };
            }
            seen.push(line);
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.child.wait().expect("wait")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Webhook secrets the test receiver verifies with (Standard Webhooks `whsec_` form).
pub const OLD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const NEW_SECRET: &str = "whsec_c2Vjb25kLXNlY3JldC1mb3ItY2Fwc3Rhbi10ZXN0cw==";

/// `tests/clients/webhook_receiver.py`: verifies each delivery with PyPI `standardwebhooks` and
/// logs it; see that file for the answer script.
pub struct WebhookReceiver {
    child: std::process::Child,
    pub port: u16,
    log: std::path::PathBuf,
}

impl WebhookReceiver {
    /// A plain-HTTP receiver.
    pub fn start(dir: &std::path::Path, script: &str) -> Self {
        Self::spawn(dir, script, false)
    }

    /// An HTTPS receiver whose test CA is at [`WebhookReceiver::ca`].
    pub fn start_tls(dir: &std::path::Path, script: &str) -> Self {
        Self::spawn(dir, script, true)
    }

    /// The test CA of an HTTPS receiver.
    pub fn ca(&self) -> PathBuf {
        self.log.with_file_name("ca.pem")
    }

    fn spawn(dir: &std::path::Path, script: &str, tls: bool) -> Self {
        let log = dir.join("received.jsonl");
        let mut child = std::process::Command::new("python3")
            .arg(repo().join("tests/clients/webhook_receiver.py"))
            .arg(&log)
            .arg(script)
            .args([OLD_SECRET, NEW_SECRET])
            .envs(tls.then(|| ("RECEIVER_TLS_DIR", dir.as_os_str().to_owned())))
            .env("RECEIVER_SECRETS_FILE", dir.join("secrets.txt"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 with standardwebhooks (just setup installs it)");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Self {
            child,
            port: line.trim().parse().unwrap(),
            log,
        }
    }

    pub fn received(&self) -> Vec<serde_json::Value> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        // The receiver may be halfway through writing its last line (a large body takes more
        // than one write): only lines it has finished are read.
        let finished = log.rfind('\n').map_or("", |end| &log[..end]);
        finished
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub async fn until(
        &self,
        what: &str,
        ok: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        // 30 s: only a failing test waits that long.
        for _ in 0..1200 {
            let got = self.received();
            if ok(&got) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("receiver never saw {what}: {:#?}", self.received());
    }
}

/// Every delivery in `got` verified with the current secret, and per execution the first accepted
/// delivery of each event in `expected` (execution id → event ids in outbox order) in that order.
pub fn assert_verified_in_order(
    got: &[serde_json::Value],
    expected: &std::collections::HashMap<String, Vec<String>>,
) {
    assert!(
        got.iter()
            .all(|e| e["verifiedWith"] == serde_json::json!([0])),
        "every delivery verifies"
    );
    for (execution, events) in expected {
        let mut firsts: Vec<&str> = Vec::new();
        for e in got
            .iter()
            .filter(|e| e["answered"] == 200 && e["executionId"] == execution.as_str())
        {
            let id = e["eventId"].as_str().unwrap();
            if !firsts.contains(&id) {
                firsts.push(id);
            }
        }
        assert_eq!(
            firsts,
            events.iter().map(String::as_str).collect::<Vec<_>>(),
            "every event of {execution}, in order"
        );
    }
}

/// Whether every event id in `expected` was accepted (answered 200) at least once.
pub fn all_accepted(
    got: &[serde_json::Value],
    expected: &std::collections::HashMap<String, Vec<String>>,
) -> bool {
    let accepted: std::collections::HashSet<&str> = got
        .iter()
        .filter(|e| e["answered"] == 200)
        .filter_map(|e| e["eventId"].as_str())
        .collect();
    expected
        .values()
        .flatten()
        .all(|id| accepted.contains(id.as_str()))
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET url` with a bearer key, as JSON (`Null` when the body is not JSON).
pub async fn get_json(client: &reqwest::Client, url: &str, key: &str) -> serde_json::Value {
    client
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .unwrap_or(serde_json::Value::Null)
}

/// Polls `GET /v1/executions/{id}` until its status is one of `statuses` (30 s at most).
pub async fn until_status(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    id: &str,
    statuses: &[&str],
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..1200 {
        last = get_json(client, &format!("{base}/v1/executions/{id}"), key).await;
        if statuses.iter().any(|s| last["status"] == *s) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("execution {id} never reached {statuses:?}; last: {last:#}");
}
pub mod contract;
pub mod realservers;

/// The real provider `settings` describe for `capability` (a `[providers.<capability>]` table as
/// JSON), its ledger in a fresh database under `dir`.
pub async fn adapter(
    capability: capstan_core::Capability,
    settings: serde_json::Value,
    dir: &Path,
) -> std::sync::Arc<dyn capstan_core::Providers> {
    let settings: capstan_adapters::ProviderSettings =
        serde_json::from_value(settings).expect("provider settings");
    std::fs::create_dir_all(dir).expect("the ledger's directory");
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir).await)
        .await
        .expect("the ledger's database");
    let node = capstan_adapters::Node {
        store,
        clock: std::sync::Arc::new(capstan_core::SystemClock),
        keyring: capstan_core::secrets::Keyring::development(),
    };
    capstan_adapters::build(capability, &settings, &node)
        .await
        .expect("the adapter starts")
        .expect("a real provider")
}

/// A validator for one of the document's schemas in `tests/schemas/`.
pub fn schema(name: &str) -> jsonschema::Validator {
    let path = repo().join("tests/schemas").join(name);
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read the schema"))
            .expect("the schema is JSON");
    jsonschema::validator_for(&schema).expect("the schema compiles")
}

/// Asserts `value` is valid under `validator`, listing every error with where it is.
pub fn assert_valid(validator: &jsonschema::Validator, value: &serde_json::Value) {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:?}\nin {value:#}");
}

/// A self-signed certificate for `localhost` and 127.0.0.1 made with openssl in `dir`:
/// `(cert.pem, key.pem)`.
pub fn self_signed_localhost(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl made no certificate");
    (cert, key)
}
