//! `just run-real`: the real provider path on localhost. Starts Knot DNS as the primary of
//! `capstan.test` (TSIG key `capstan`) and Pebble validating against it, both on free ports, then
//! `capstan serve` on 127.0.0.1:8080 with `dns` routed to Knot by RFC 2136 and `certificates` to
//! Pebble by ACME (everything else simulated). Prints an API key and the commands to try; Ctrl-C
//! stops all three. The servers are the same the provider tests start (`realservers`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::realservers::{Knot, Pebble};
use capstan_e2e::{capstan, key_for};

const ZONE: &str = "capstan.test";

const WORKFLOWS: [&str; 2] = [
    "workflows/add-certificate.wasm",
    "workflows/onboard-domain.wasm",
];

#[tokio::main]
async fn main() {
    let knot = Knot::start(ZONE);
    let pebble = Pebble::start(knot.addr()).await;
    let secrets = tempfile::Builder::new()
        .prefix("capstan-real-path-")
        .tempdir()
        .expect("a directory for the TSIG secret and the ACME account");
    let secret = knot.write_secret_file(secrets.path());
    let account = secrets.path().join("acme-account.json");
    let config = format!(
        "{}{}",
        knot.provider_table(&secret),
        pebble.provider_table(&knot, &account)
    );
    // The components and the configuration, on a fresh SQLite database in the home.
    let home = capstan_e2e::home_with(&WORKFLOWS, &config);
    let key = key_for(
        home.path(),
        "dev",
        &[
            "workflows:add-certificate",
            "workflows:onboard-domain",
            "admin:read",
        ],
    );
    let dig = format!("kdig @127.0.0.1 -p {}", knot.port());
    // The CLI exactly as this home needs it (database, configuration, development keys).
    let cli = {
        let cmd = capstan(home.path());
        let env = cmd
            .get_envs()
            .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?)));
        let args = cmd.get_args().map(|a| a.to_string_lossy().into_owned());
        env.chain([cmd.get_program().to_string_lossy().into_owned()])
            .chain(args)
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "\nreal-path: Knot serves {ZONE} on {} (TSIG key `{}`), Pebble's directory is {}\n\
         real-path: home {} (config capstan.toml), API key for `dev`: {key}\n\
         real-path: try\n  \
           curl -s -H 'Authorization: Bearer {key}' -H 'Idempotency-Key: demo-1' -H 'Content-Type: application/json' \\\n    \
             -d '{{\"domain\": \"api.{ZONE}\", \"subjectAlternativeNames\": [\"www.{ZONE}\"]}}' localhost:8080/v1/workflows/add-certificate\n  \
           {dig} _acme-challenge.api.{ZONE} TXT +short\n  \
           curl -s -H 'Authorization: Bearer {key}' localhost:8080/v1/executions/<executionId>\n  \
           {cli} certificates export <arn> --out ./cert\n",
        knot.addr(),
        knot.key_name(),
        pebble.directory_url(),
        home.path().display(),
    );
    let status = capstan(home.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:8080",
            "--sandbox-listen",
            "127.0.0.1:8081",
        ])
        .status()
        .expect("run capstan serve");
    eprintln!("real-path: capstan serve exited with {status}; stopping Knot and Pebble");
    drop((knot, pebble, secrets));
}
