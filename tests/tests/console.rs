//! The operator console: its files as served (content security policy, no credentials in the
//! page), and the operator's scenario in a real browser — Debian's Chromium through
//! chromedriver, driven by Selenium (`tests/clients/console_selenium.py`; `just setup` installs
//! them). Screenshots land in `target/console-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, home_with, key_for, repo};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn the_console_is_served_from_the_binary_under_a_strict_policy() {
    let home = home_with(&["workflows/hello.wasm"], "");
    let key = key_for(home.path(), "ops", &["workflows:hello"]);
    let server = Server::start(home.path());
    let c = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let bare = c
        .get(format!("{}/console", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(bare.headers()["location"], "/console/");
    for (path, kind) in [
        ("/console/", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let r = c
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let h = r.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        let policy = h["content-security-policy"].to_str().unwrap();
        assert!(policy.contains("script-src 'self'"), "{policy}");
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert_eq!(h["x-content-type-options"], "nosniff");
        let body = r.text().await.unwrap();
        assert!(!body.contains(&key), "no key in {path}");
    }
}

#[tokio::test]
async fn an_operator_watches_approves_and_cancels_in_a_real_browser() {
    let home = home_with(
        &[
            "workflows/onboard-domain.wasm",
            "workflows/add-subdomain.wasm",
            "workflows/hello.wasm",
        ],
        "",
    );
    let seed = home.path().join("seed.json");
    std::fs::write(
        &seed,
        json!({
            "zones": ["console.test", "example.com"],
            "domains": [{"name": "console.test", "owned": true}, {"name": "example.com", "owned": true}],
            "mapsKeys": [{"id": "web", "displayName": "Web key", "capacity": 50}],
            "tickets": [{"id": "OPS-1", "title": "Onboard console.test"}],
        })
        .to_string(),
    )
    .unwrap();
    // Issuance and deployment take seconds, as they do for real: long enough to watch.
    std::fs::write(
        home.path().join("capstan.toml"),
        format!(
            "workers = 4\n[simulator]\ncertificate_issue_ms = 2500\ncdn_deploy_ms = 2500\nseed_file = {:?}\n[webhooks]\nallow_loopback = true\nallow_http = true\nretry_schedule_ms = [100, 100]\ntimeout_ms = 1000\n",
            seed.display().to_string()
        ),
    )
    .unwrap();
    let ops = key_for(
        home.path(),
        "ops",
        &[
            "workflows:onboard-domain",
            "workflows:add-subdomain",
            "workflows:hello",
            "audit:read",
            "subscriptions:manage",
        ],
    );
    let limited = key_for(home.path(), "viewer", &["workflows:hello"]);
    let server = Server::start(home.path());
    let shots = repo().join("target/console-screenshots");
    // A receiver that never answers: nothing listens on a port just freed.
    let hook = format!(
        "http://127.0.0.1:{}/hook",
        capstan_e2e::realservers::free_port()
    );
    let out = std::process::Command::new("python3")
        .arg(repo().join("tests/clients/console_selenium.py"))
        .args([&server.base, &ops, &limited])
        .arg(&shots)
        .arg(&hook)
        .output()
        .expect("python3 runs the Selenium scenario");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for name in [
        "onboard-domain",
        "add-subdomain-plan",
        "canceled",
        "forbidden",
    ] {
        assert!(shots.join(format!("{name}.png")).is_file(), "{name}.png");
    }
}
