//! A SQLite node backed up and restored as docs/operating.md ("Backups") tells operators to:
//! `VACUUM INTO` from another process's connection while the node answers triggers, then the
//! copy put in place of the database of a stopped node. The copy is one consistent snapshot, and
//! the restored node serves what it holds: its executions, its keys, its idempotency keys.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, get_json, home, key_for, until_status};
use reqwest::Client;
use serde_json::{Value, json};

async fn trigger(client: &Client, base: &str, key: &str, idempotency: &str) -> (u16, Value) {
    let r = client
        .post(format!("{base}/v1/workflows/fixture-steps"))
        .bearer_auth(key)
        .header("Idempotency-Key", idempotency)
        .json(&json!({"zone": "ZEXAMPLE-COM", "stages": 10}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_taken_while_the_node_serves_restores_every_execution_it_holds() {
    let home = home(&["guest-fixtures/fixture-steps.wasm"]);
    // The procedure is SQLite's: the home's database is a SQLite file on either test pass.
    let db = home.path().join("capstan.db");
    std::fs::write(
        home.path().join("database-url"),
        format!("sqlite://{}", db.display()),
    )
    .unwrap();
    let key = key_for(home.path(), "ops", &["workflows:fixture-steps"]);
    let client = Client::new();
    let server = Server::start(home.path());

    // Executions finished before the copy: all of them must be in it.
    let mut before = Vec::new();
    for i in 0..10 {
        let (status, body) = trigger(&client, &server.base, &key, &format!("before-{i}")).await;
        assert_eq!(status, 202, "{body}");
        before.push(body["executionId"].as_str().unwrap().to_owned());
    }
    for id in &before {
        until_status(&client, &server.base, &key, id, &["succeeded"]).await;
    }

    // Triggers keep coming while the copy is taken, through another process's connection.
    let during = {
        let (client, base, key) = (client.clone(), server.base.clone(), key.clone());
        tokio::spawn(async move {
            for i in 0..40 {
                let (status, body) = trigger(&client, &base, &key, &format!("during-{i}")).await;
                assert_eq!(status, 202, "{body}");
            }
        })
    };
    let copy = home.path().join("capstan-backup.db");
    let url = format!("sqlite://{}", db.display());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::query("VACUUM INTO $1")
        .bind(copy.display().to_string())
        .execute(&pool)
        .await
        .expect("VACUUM INTO beside a serving node");
    pool.close().await;
    during.await.unwrap();

    let copied = sqlx::AnyPool::connect(&format!("sqlite://{}", copy.display()))
        .await
        .unwrap();
    let (check,): (String,) = sqlx::query_as("PRAGMA integrity_check")
        .fetch_one(&copied)
        .await
        .unwrap();
    assert_eq!(check, "ok");
    // One snapshot: every execution the copy holds has its run, and every finished one its
    // terminal event, whatever the node was committing at that moment.
    let (executions, without_run, finished_without_event): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM executions),
                (SELECT count(*) FROM executions e WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.execution_id = e.id)),
                (SELECT count(*) FROM executions e WHERE e.status = 'succeeded' AND NOT EXISTS
                    (SELECT 1 FROM outbox o WHERE o.execution_id = e.id AND o.event_type = 'ExecutionSucceeded'))",
    )
    .fetch_one(&copied)
    .await
    .unwrap();
    copied.close().await;
    assert!(
        executions >= 10,
        "the copy holds {executions} executions, fewer than the 10 finished before it"
    );
    assert_eq!(without_run, 0, "executions without their run in the copy");
    assert_eq!(
        finished_without_event, 0,
        "finished executions without their terminal event in the copy"
    );

    // The restore: stop the node, drop the WAL and its index, put the copy in place, start.
    assert!(server.terminate().success());
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(home.path().join(format!("capstan.db{suffix}")));
    }
    std::fs::rename(&copy, &db).unwrap();
    let server = Server::start(home.path());
    for id in &before {
        let e = get_json(
            &client,
            &format!("{}/v1/executions/{id}", server.base),
            &key,
        )
        .await;
        assert_eq!(e["status"], "succeeded", "{e}");
        assert_eq!(e["stages"].as_array().map(Vec::len), Some(11), "{e}");
    }
    // The key minted before the copy still works (above), and so do the idempotency keys it
    // holds: the same trigger again answers the execution the copy has.
    let (status, body) = trigger(&client, &server.base, &key, "before-0").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["executionId"], before[0].as_str());
    // The restored node runs new work, and the executions the copy caught mid-run finish: every
    // execution it lists (the new one among them) succeeds.
    let (status, body) = trigger(&client, &server.base, &key, "after").await;
    assert_eq!(status, 202, "{body}");
    let listed = get_json(
        &client,
        &format!("{}/v1/executions?limit=100", server.base),
        &key,
    )
    .await;
    let listed = listed["executions"].as_array().unwrap();
    assert!(
        listed
            .iter()
            .any(|e| e["executionId"] == body["executionId"])
    );
    for e in listed {
        until_status(
            &client,
            &server.base,
            &key,
            e["executionId"].as_str().unwrap(),
            &["succeeded"],
        )
        .await;
    }
}
