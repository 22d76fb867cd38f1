//! Subscription and booking routes when their storage is unavailable: another process holds the
//! database's write lock (SQLite) or locks the tables (PostgreSQL) past the server's busy/lock
//! timeout, so writes fail; the API answers 503 in the documented error shape and nothing changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{OLD_SECRET, Server, home_with, key_for};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Another process takes the database's write lock and holds it until a line arrives on its stdin.
/// SQLite: an exclusive transaction (past the server's 5 s busy timeout). PostgreSQL: `psql` locks
/// the tables these tests write in EXCLUSIVE mode (reads go on; writes wait past the server's
/// 5 s `lock_timeout`).
fn hold_write_lock(home: &std::path::Path) -> std::process::Child {
    let url = capstan_e2e::database_url(home);
    let mut locker = if let Some(path) = url.strip_prefix("sqlite://") {
        Command::new("python3")
            .arg("-c")
            .arg("import sqlite3, sys\ncon = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\ncon.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\nsys.stdin.readline()\ncon.execute('ROLLBACK')\n")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3")
    } else {
        let (server, query) = url.split_once('?').unwrap();
        let schema = query.split("options[search_path]=").nth(1).unwrap();
        let mut psql = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", server])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("psql");
        write!(
            psql.stdin.as_mut().unwrap(),
            "SET search_path TO {schema};\nBEGIN;\nLOCK TABLE subscriptions, api_keys, audit_logs, bookings, slot_usage, booking_events IN EXCLUSIVE MODE;\n\\echo locked\n"
        )
        .unwrap();
        psql
    };
    let mut line = String::new();
    BufReader::new(locker.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    locker
}

#[tokio::test]
async fn subscription_writes_answer_503_while_storage_is_unavailable_and_change_nothing() {
    let home = home_with(
        &["guest-fixtures/fixture-steps.wasm"],
        "[grants]\nfixture-steps = [\"dns\", \"convergence\"]\n[webhooks]\nallow_loopback = true\nallow_http = true\n",
    );
    let key = key_for(
        home.path(),
        "ops",
        &["workflows:fixture-steps", "subscriptions:manage"],
    );
    let server = Server::start(home.path());
    let c = Client::new();
    let url = format!("{}/v1/subscriptions", server.base);
    let body = json!({"events": ["ExecutionSucceeded.v1"], "secret": OLD_SECRET, "url": "http://127.0.0.1:9/hook"});
    let first = c
        .post(&url)
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);

    let mut locker = hold_write_lock(home.path());

    let refused = c
        .post(&url)
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = refused.status();
    let e: Value = refused.json().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    assert!(
        e["error"] == "subscriptions_unavailable" || e["error"] == "unavailable",
        "{e}"
    );
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    let ready = c
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    let _ = ready.status(); // reads still work in WAL mode: readiness may stay green

    // The lock goes away: the service recovers on its own and nothing was created meanwhile.
    locker.stdin.take().unwrap().write_all(b"\n").unwrap();
    locker.wait().unwrap();
    let list: Value = c
        .get(&url)
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["subscriptions"].as_array().unwrap().len(), 1, "{list}");
    let again = c
        .post(&url)
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn booking_writes_answer_503_while_storage_is_unavailable() {
    let home = home_with(
        &[],
        &format!(
            "[booking]\ncatalog_file = \"{}\"\n",
            capstan_e2e::repo()
                .join("tests/catalogs/small.json")
                .display()
        ),
    );
    let key = capstan_e2e::cli(
        home.path(),
        &[
            "partners",
            "create",
            "--name",
            "p",
            "--type",
            "booking",
            "--environment",
            "production",
        ],
    )
    .trim()
    .to_owned();
    let server = Server::start(home.path());
    let c = Client::new();
    let inventory: Value = c
        .get(format!(
            "{}/api/public/v2/inventory/list-by/tour?tourId=5003&limit=1",
            server.base
        ))
        .header("Partner-Auth", &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let slot = inventory["items"][0]["id"].as_str().unwrap().to_owned();
    let mut locker = hold_write_lock(home.path());
    let body = json!({"productId": "1002", "variantId": "5003", "inventoryId": slot,
        "customersDetails": {"count": 1, "customers": [{"personType": "ADULT", "isPrimary": true}]},
        "price": {"amount": 30.0, "currencyCode": "EUR"}});
    let r = c
        .post(format!("{}/api/public/v2/bookings/", server.base))
        .header("Partner-Auth", &key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let e: Value = r.json().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    assert_eq!(
        (e["status"].as_u64(), e["error"]["code"].as_str()),
        (Some(503), Some("E_SERVICE_UNAVAILABLE")),
        "{e}"
    );
    locker.stdin.take().unwrap().write_all(b"\n").unwrap();
    locker.wait().unwrap();
    let list: Value = c
        .get(format!("{}/api/public/v2/bookings/", server.base))
        .header("Partner-Auth", &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["total"], 0, "nothing was created: {list}");
    let ok = c
        .post(format!("{}/api/public/v2/bookings/", server.base))
        .header("Partner-Auth", &key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
}
