//! OpenTelemetry traces of one onboard-domain execution, exported by a real `capstan serve` over
//! OTLP/HTTP to a receiver this test runs (it decodes the protobuf bodies with the generated
//! types of `opentelemetry-proto`, as a collector does), checked for their parent/child tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Bytes;
use capstan_e2e::{Server, home_with, key_for};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the receiver has been sent: each span with its resource's `service.name`.
#[derive(Default, Clone)]
struct Received(Arc<Mutex<Vec<(String, Span)>>>);

async fn receiver() -> (String, Received) {
    let received = Received::default();
    let store = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let store = store.clone();
            async move {
                let request =
                    ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                let mut spans = store.0.lock().unwrap();
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                            Any::StringValue(s) => Some(s.clone()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    for scope in resource.scope_spans {
                        spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
                    }
                }
                // An empty ExportTraceServiceResponse.
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), received)
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            Any::StringValue(s) => Some(s.clone()),
            Any::IntValue(i) => Some(i.to_string()),
            Any::BoolValue(b) => Some(b.to_string()),
            _ => None,
        }
    })
}

#[tokio::test]
async fn one_onboard_domain_execution_is_one_trace_tree() {
    let (endpoint, received) = receiver().await;
    let home = home_with(&["workflows/onboard-domain.wasm"], "");
    let seed = home.path().join("seed.json");
    std::fs::write(
        &seed,
        json!({
            "zones": ["traced.test"],
            "mapsKeys": [{"id": "web", "displayName": "Web key", "capacity": 50}],
            "tickets": [{"id": "OPS-7", "title": "Onboard traced.test"}],
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        home.path().join("capstan.toml"),
        format!(
            "[simulator]\ncertificate_issue_ms = 0\ncdn_deploy_ms = 0\ndns_propagation_ms = 0\nseed_file = {:?}\n",
            seed.display().to_string()
        ),
    )
    .unwrap();
    let key = key_for(home.path(), "ops", &["workflows:onboard-domain"]);
    let server = Server::start_env(
        home.path(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let client = reqwest::Client::new();

    // The caller's own trace, which the execution continues.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let r: Value = client
        .post(format!("{}/v1/workflows/onboard-domain", server.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "traced-1")
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({"domain": "traced.test", "ticketId": "ops-7"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["executionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_owned();
    // The await answers when the execution stops moving: it ends, or waits (for convergence).
    let mut execution = Value::Null;
    for _ in 0..600 {
        execution = client
            .get(format!("{}/v1/executions/{id}?wait=20s", server.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if execution["finishedAt"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(execution["status"], "succeeded", "{execution:#}");
    let stages: Vec<String> = execution["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stageName"].as_str().unwrap().to_owned())
        .collect();
    assert!(stages.len() >= 3, "{execution:#}");

    // The execution's events carry its trace.
    let events: Value = client
        .get(format!("{}/v1/executions/{id}/events", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for event in events["events"].as_array().unwrap() {
        let traceparent = event["traceparent"].as_str().unwrap_or_default();
        assert!(
            traceparent.starts_with(&format!("00-{trace_id}-")),
            "{event:#}"
        );
    }

    // Every span of the tree, once the batch exporter has sent them.
    let spans = {
        let mut waited = Duration::ZERO;
        loop {
            let spans: Vec<(String, Span)> = received.0.lock().unwrap().clone();
            // A parent ends (and is exported) after its children: the tree is whole once every
            // stage has a span and every span's parent has arrived too.
            let stage_spans = spans.iter().filter(|(_, s)| s.name == "stage").count();
            let orphans = spans.iter().any(|(_, s)| {
                hex(&s.trace_id) == trace_id
                    && hex(&s.parent_span_id) != caller_span
                    && !spans.iter().any(|(_, p)| p.span_id == s.parent_span_id)
            });
            if (stage_spans >= stages.len() && !orphans) || waited > Duration::from_secs(20) {
                break spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
        }
    };
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|(_, s)| hex(&s.trace_id) == trace_id)
        .map(|(_, s)| s)
        .collect();
    assert!(
        spans.iter().all(|(service, _)| service == "capstan"),
        "service.name defaults to the binary's"
    );
    let one = |what: &str, pick: &dyn Fn(&&Span) -> bool| -> Span {
        let found: Vec<&&Span> = ours.iter().filter(|s| pick(s)).collect();
        assert_eq!(found.len(), 1, "one {what} span: {:#?}", names(&ours));
        (*found[0]).clone()
    };
    let request = one("trigger request", &|s| {
        s.name == "POST /v1/workflows/{name}"
    });
    assert_eq!(hex(&request.parent_span_id), caller_span);
    assert_eq!(
        request.kind,
        opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server as i32,
        "a request is a server span"
    );
    assert_eq!(
        attr(&request, "http.route").as_deref(),
        Some("/v1/workflows/{name}")
    );
    assert_eq!(
        attr(&request, "http.response.status_code").as_deref(),
        Some("202")
    );
    assert_eq!(attr(&request, "principal").as_deref(), Some("ops"));
    let exec = one("execution", &|s| s.name == "execution");
    assert_eq!(exec.parent_span_id, request.span_id);
    assert_eq!(attr(&exec, "execution").as_deref(), Some(id.as_str()));
    let activations: Vec<&&Span> = ours.iter().filter(|s| s.name == "activation").collect();
    assert!(
        !activations.is_empty(),
        "{:#?}",
        spans
            .iter()
            .map(|(_, s)| format!(
                "{} {} {} <- {}",
                hex(&s.trace_id),
                s.name,
                hex(&s.span_id),
                hex(&s.parent_span_id)
            ))
            .collect::<Vec<_>>()
    );
    for a in &activations {
        assert_eq!(
            a.parent_span_id, exec.span_id,
            "an activation hangs under its execution"
        );
        assert_eq!(attr(a, "execution").as_deref(), Some(id.as_str()));
    }
    // Each stage of the execution, under an activation; each provider call under a stage.
    let stage_spans: Vec<&&Span> = ours.iter().filter(|s| s.name == "stage").collect();
    for name in &stages {
        assert!(
            stage_spans
                .iter()
                .any(|s| attr(s, "stage").as_deref() == Some(name.as_str())),
            "no span for stage {name}: {:#?}",
            names(&ours)
        );
    }
    for s in &stage_spans {
        assert!(
            activations.iter().any(|a| a.span_id == s.parent_span_id),
            "stage {:?} is not under an activation",
            attr(s, "stage")
        );
        // A stage that waited has a span per activation it spanned; the last one succeeded.
        let outcome = attr(s, "outcome");
        assert!(
            matches!(outcome.as_deref(), Some("succeeded" | "waiting")),
            "{s:#?}"
        );
    }
    for name in &stages {
        assert!(
            stage_spans
                .iter()
                .any(|s| attr(s, "stage").as_deref() == Some(name.as_str())
                    && attr(s, "outcome").as_deref() == Some("succeeded"))
        );
    }
    let calls: Vec<&&Span> = ours
        .iter()
        .filter(|s| attr(s, "capability").is_some())
        .collect();
    assert!(
        calls
            .iter()
            .any(|c| attr(c, "capability").as_deref() == Some("dns")),
        "{:#?}",
        names(&ours)
    );
    for c in &calls {
        assert!(
            stage_spans.iter().any(|s| s.span_id == c.parent_span_id),
            "provider call {} is not under a stage",
            c.name
        );
        assert_eq!(
            c.name,
            format!(
                "{}.{}",
                attr(c, "capability").unwrap(),
                attr(c, "operation").unwrap()
            )
        );
        assert!(attr(c, "attempt").is_some());
        assert_eq!(attr(c, "outcome").as_deref(), Some("ok"), "{c:#?}");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn names(spans: &[&Span]) -> Vec<String> {
    spans
        .iter()
        .map(|s| {
            format!(
                "{} {} <- {}",
                s.name,
                hex(&s.span_id),
                hex(&s.parent_span_id)
            )
        })
        .collect()
}
