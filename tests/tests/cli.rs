//! The `capstan` command line as a client of a running server: `trigger --wait`, `executions
//! list|show|watch|events|cancel|resume|rollback|approve` over `/v1` with an API key from
//! `CAPSTAN_TOKEN` or a file, tables by default and the API's JSON with `--json`, the exit
//! status telling how an execution ended; completions and the man page from the clap
//! definitions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, capstan_bin, home_with, key_for};
use serde_json::Value;
use std::process::{Command, Output};

/// `capstan ARGS` against `server` with `token` in `CAPSTAN_TOKEN`.
fn run(server: &Server, token: &str, args: &[&str]) -> Output {
    Command::new(capstan_bin())
        .args(args)
        .env("CAPSTAN_SERVER", &server.base)
        .env("CAPSTAN_TOKEN", token)
        .env_remove("RUST_LOG")
        .output()
        .expect("run capstan")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_cli_drives_executions_through_the_api() {
    // DNS changes answer after 300 ms: a run is seen moving stage by stage.
    let home = home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        "workers = 4\nlease_ms = 3000\n[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[simulator]\ndns_propagation_ms = 0\n[[simulator.faults]]\nop = \"dns.change-records\"\nlatency_ms = 300\n",
    );
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let server = Server::start(home.path());
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.json");
    std::fs::write(&input, r#"{"zone": "ZEXAMPLE-COM", "stages": 2}"#).unwrap();
    let input = input.to_str().unwrap();

    // Trigger and follow to the end: every stage shown, exit 0 for succeeded.
    let out = run(
        &server,
        &key,
        &["trigger", "fixture-steps", "--input", input, "--wait"],
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let printed = stdout(&out);
    for line in ["step-1", "step-2", ": succeeded"] {
        assert!(printed.contains(line), "{line} in:\n{printed}");
    }
    let id = printed.split(':').next().unwrap().trim().to_owned();

    // The same idempotency key twice: the same execution.
    let again = |args: &[&str]| {
        let out = run(&server, &key, args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()
    };
    let keyed = [
        "trigger",
        "fixture-steps",
        "--input",
        input,
        "--idempotency-key",
        "cli-1",
        "--json",
    ];
    assert_eq!(again(&keyed)["executionId"], again(&keyed)["executionId"]);

    // List and show: tables by default, the API's JSON with --json.
    let out = run(
        &server,
        &key,
        &["executions", "list", "--status", "succeeded"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.starts_with("ID "), "{table}");
    assert!(table.contains(&id), "{table}");
    let page = again(&["executions", "list", "--json", "--limit", "5"]);
    assert!(
        page["executions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["executionId"] == id.as_str()),
        "{page}"
    );
    let out = run(&server, &key, &["executions", "show", &id]);
    let shown = stdout(&out);
    assert!(
        shown.contains("status     succeeded") && shown.contains("STAGE"),
        "{shown}"
    );
    let events = again(&["executions", "events", &id, "--json"]);
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["eventType"] == "ExecutionSucceeded"),
        "{events}"
    );

    // A run waiting on its timer: watch exits 5 (someone has to act), cancel ends it, and a
    // watch of the canceled execution exits 4.
    std::fs::write(
        dir.path().join("sleepy.json"),
        r#"{"zone": "ZEXAMPLE-COM", "stages": 1, "sleepSeconds": 600}"#,
    )
    .unwrap();
    let sleepy = dir.path().join("sleepy.json");
    let out = run(
        &server,
        &key,
        &[
            "trigger",
            "fixture-steps",
            "--input",
            sleepy.to_str().unwrap(),
            "--wait",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let waiting = stdout(&out).split(':').next().unwrap().trim().to_owned();
    let out = run(&server, &key, &["executions", "cancel", &waiting]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("{waiting}: canceled"));
    let out = run(&server, &key, &["executions", "watch", &waiting]);
    assert_eq!(out.status.code(), Some(4), "{}", stdout(&out));

    // The API's refusals come through as they were given, with exit 1.
    let out = run(&server, &key, &["executions", "resume", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("409 state_invalid (not_resumable)"),
        "{}",
        stderr(&out)
    );
    let out = run(&server, &key, &["executions", "show", "no-such-execution"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("404 not_found"), "{}", stderr(&out));
    let out = run(&server, "cap_wrong", &["executions", "list"]);
    assert!(
        stderr(&out).contains("401 unauthorized"),
        "{}",
        stderr(&out)
    );

    // The key from a file; none at all is a clear error before any request.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{key}\n")).unwrap();
    let out = run(
        &server,
        "",
        &[
            "executions",
            "list",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&server, "", &["executions", "list"]);
    assert!(stderr(&out).contains("no API key"), "{}", stderr(&out));
}

#[test]
fn completions_and_the_manual_come_from_the_command_definitions() {
    let out = Command::new(capstan_bin())
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = stdout(&out);
    assert!(
        out.status.success() && script.contains("_capstan()"),
        "{script}"
    );
    assert!(
        script.contains("executions"),
        "every subcommand is completed"
    );
    let out = Command::new(capstan_bin()).arg("man").output().unwrap();
    let page = stdout(&out);
    assert!(
        out.status.success() && page.contains(".TH capstan"),
        "{page}"
    );
    assert!(page.contains("trigger"), "{page}");
}
