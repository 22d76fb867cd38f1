//! `capstan serve` and friends as an operator meets them: a real process, real ports, a real file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, capstan, component};
use serde_json::Value;

fn home_with_workflows() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let workflows = home.path().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::copy(
        component("workflows/hello.wasm"),
        workflows.join("hello.wasm"),
    )
    .unwrap();
    std::fs::copy(
        component("guest-fixtures/fixture-wrong-world.wasm"),
        workflows.join("other.wasm"),
    )
    .unwrap();
    std::fs::write(workflows.join("corrupt.wasm"), b"definitely not wasm").unwrap();
    home
}

#[tokio::test]
async fn serve_answers_health_and_readiness_and_says_which_files_failed() {
    let home = home_with_workflows();
    let server = Server::start(home.path());
    let client = reqwest::Client::new();

    let health = client
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().await.unwrap()["status"], "ok");

    let ready = client
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["database"], "ok");
    assert_eq!(ready["workflows"][0]["name"], "hello");
    assert_eq!(
        ready["workflows"][0]["stages"],
        serde_json::json!(["greet", "farewell"])
    );
    let failed = ready["failedWorkflows"].as_array().unwrap();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(
        failed[0]["file"]
            .as_str()
            .unwrap()
            .ends_with("corrupt.wasm")
    );
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("not a valid component")
    );
    assert!(
        failed[1]["error"]
            .as_str()
            .unwrap()
            .contains("not a workflow component")
    );

    let sandbox = client
        .get(format!("{}/healthz", server.sandbox))
        .send()
        .await
        .unwrap();
    assert_eq!(sandbox.status(), 200);

    let missing = client
        .get(format!("{}/no/such/route", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"], "not_found");
    let wrong_method = client
        .delete(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);

    assert!(
        home.path().join("capstan.db").is_file(),
        "the SQLite file exists"
    );
    let status = server.terminate();
    assert!(
        status.success(),
        "graceful shutdown exits 0, got {status:?}"
    );
}

#[test]
fn a_restart_loads_components_from_the_cache_instead_of_compiling() {
    let home = home_with_workflows();
    std::fs::create_dir_all(home.path().join("data")).unwrap();
    let list = |home: &std::path::Path| {
        let out = capstan(home)
            .args(["workflows", "list", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let first = list(home.path());
    assert_eq!(first["workflows"][0]["cached"], false);
    let second = list(home.path());
    assert_eq!(second["workflows"][0]["cached"], true);
    assert_eq!(
        first["workflows"][0]["digest"],
        second["workflows"][0]["digest"]
    );
}

#[test]
fn workflows_list_names_each_component_and_each_failure() {
    let home = home_with_workflows();
    let out = capstan(home.path())
        .args(["workflows", "list"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "a failed file makes the listing exit 3"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("hello ") && l.contains("greet → farewell")),
        "{text}"
    );
    assert!(
        text.contains("FAILED") && text.contains("corrupt.wasm"),
        "{text}"
    );
}

#[test]
fn a_bad_config_value_exits_non_zero_naming_key_value_and_expectation() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("bad.toml");
    std::fs::write(&config, "[runtime]\nmemory_limit_mib = \"lots\"\n").unwrap();
    let out = capstan(home.path())
        .arg("--config")
        .arg(&config)
        .arg("migrate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("memory_limit_mib") && err.contains("lots") && err.contains("u32"),
        "{err}"
    );
}

#[test]
fn migrate_creates_the_database_and_is_idempotent() {
    let home = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = capstan(home.path()).arg("migrate").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            stdout.contains("is at migration") && stdout.contains("(booking 1)"),
            "{stdout}"
        );
    }
}

/// A node whose log reader went away (the process that started it died, closing its stderr)
/// still stops on SIGTERM and exits 0: a log line that cannot be written is dropped, and
/// nothing a log line does can keep the node from stopping.
#[test]
fn sigterm_stops_a_node_whose_stderr_is_closed() {
    use std::io::BufRead;
    let home = home_with_workflows();
    let mut child = capstan(home.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sandbox-listen",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("\"listening\""));
    assert!(listening, "capstan serve reported listening");
    drop(lines);
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Stopping takes well under a second; a node that cannot stop never exits, so give up
    // after a generous minute rather than hang the suite.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("capstan serve did not stop within a minute of SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "graceful shutdown exits 0, got {status:?}"
    );
}

/// Secrets from files (systemd credentials, container secrets): `CAPSTAN_PEPPERS_FILE` and
/// `CAPSTAN_DATABASE_FILE` serve as the variables would; a variable and its file both set, or a
/// file that cannot be read, is refused naming them.
#[test]
fn secrets_come_from_files_named_by_their_file_variables() {
    let home = tempfile::tempdir().unwrap();
    let database = home.path().join("from-file.db");
    let url_file = home.path().join("database_url");
    std::fs::write(&url_file, format!("sqlite://{}\n", database.display())).unwrap();
    let pepper_file = home.path().join("peppers");
    std::fs::write(&pepper_file, "1:a-pepper-from-a-file-0123456789\n").unwrap();
    let bare = || {
        let mut cmd = std::process::Command::new(capstan_e2e::capstan_bin());
        cmd.current_dir(home.path())
            .env_remove("RUST_LOG")
            .env_remove("CAPSTAN_DATABASE")
            .env_remove("CAPSTAN_PEPPERS")
            .env("CAPSTAN_DATABASE_FILE", &url_file);
        cmd
    };
    let out = bare().arg("migrate").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(database.is_file(), "the database the file names was made");

    // A key minted under the pepper from the file.
    let out = bare()
        .env("CAPSTAN_PEPPERS_FILE", &pepper_file)
        .args(["api-keys", "mint", "--principal", "ops"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("cap_"));

    for (extra, expected) in [
        (
            ("CAPSTAN_PEPPERS", "1:a-pepper-from-the-env-0123456"),
            "not both",
        ),
        (
            ("CAPSTAN_PEPPERS_FILE", "/nonexistent/peppers"),
            "cannot read",
        ),
    ] {
        let mut cmd = bare();
        cmd.env("CAPSTAN_PEPPERS_FILE", &pepper_file)
            .env(extra.0, extra.1);
        let out = cmd
            .args(["api-keys", "mint", "--principal", "ops"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("CAPSTAN_PEPPERS") && err.contains(expected),
            "{expected}: {err}"
        );
    }
}

/// `capstan --version` names the commit the binary was built from.
#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let out = std::process::Command::new(capstan_e2e::capstan_bin())
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let commit = text
        .trim()
        .strip_prefix(concat!("capstan ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{text}"));
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(capstan_e2e::repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match head {
        // Built from this checkout (a commit made since would rebuild it first).
        Some(head) => assert_eq!(commit, head),
        None => assert_eq!(commit, "unknown"),
    }
}
