//! The booking engine on a real SQLite file with a manual clock: holds, the capture window and
//! its sweeper, no oversell under concurrency, cancellation cut-offs, fulfilment outcomes and the
//! webhook outbox — without sleeping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use capstan_booking::catalog::{Catalog, CatalogError, local};
use capstan_booking::fulfilment::{Pipelines, StepOutcome, StepRunner};
use capstan_booking::partners::{PartnerRecord, PartnerType};
use capstan_booking::{BookingConfig, Bookings, Environment};
use capstan_core::ManualClock;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const HOUR: u64 = 3_600_000;
/// 2026-06-01T00:00:00Z
const START: u64 = 1_780_272_000_000;

fn catalog_text() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/catalogs/small.json"
    ))
    .unwrap()
}

struct World {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    bookings: Bookings,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let store =
        capstan_store::Store::open(&capstan_store::testing::fresh_database_url(dir.path()).await)
            .await
            .unwrap();
    let clock = ManualClock::new(START);
    let bookings = Bookings::new(store, Arc::new(clock.clone()), BookingConfig::default());
    bookings.import_catalog(&catalog_text()).await.unwrap();
    for (id, env) in [
        ("p1", Environment::Production),
        ("p2", Environment::Production),
        ("s1", Environment::Sandbox),
    ] {
        bookings
            .insert_partner(&PartnerRecord {
                id: id.into(),
                name: id.into(),
                partner_type: PartnerType::Booking,
                environment: env,
                key_prefix: format!("x_{id}"),
                key_hash: "h".into(),
                pepper_version: 1,
                created_ms: 0,
                revoked_ms: None,
            })
            .await
            .unwrap();
    }
    World {
        _dir: dir,
        clock,
        bookings,
    }
}

/// Tomorrow's 09:00 slot of variant 5001 (capacity 5).
fn slot(clock: &ManualClock) -> String {
    let day =
        local(capstan_core::Clock::now_millis(clock) as i64).date() + chrono::Duration::days(1);
    format!("5001-{}0900", day.format("%Y%m%d"))
}

fn request(slot: &str, adults: usize) -> Value {
    let customers: Vec<Value> = (0..adults)
        .map(|i| {
            if i == 0 {
                json!({"personType": "ADULT", "isPrimary": true, "inputFields": [{"id": "fullName", "value": "Ada Lovelace"}, {"id": "email", "value": "ada@example.com"}]})
            } else {
                json!({"personType": "ADULT", "isPrimary": false, "inputFields": []})
            }
        })
        .collect();
    json!({
        "productId": "1001", "variantId": "5001", "inventoryId": slot,
        "customersDetails": {"count": adults, "customers": customers},
        "price": {"amount": 40.0 * adults as f64, "currencyCode": "EUR"},
    })
}

#[tokio::test]
async fn the_capture_window_closes_on_the_injected_clock_and_the_seats_come_back() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let a = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 2), None)
        .await
        .unwrap();
    let b = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 1), None)
        .await
        .unwrap();
    assert_eq!(a.status, "UNCAPTURED");
    assert_eq!(
        w.bookings.seats_taken(env, &slot).await.unwrap(),
        3,
        "new bookings hold their seats"
    );

    // One millisecond before the window closes nothing expires and capture works.
    w.clock.advance(HOUR - 1);
    assert_eq!(w.bookings.expire_due(100).await.unwrap(), 0);
    let captured = w
        .bookings
        .update(
            env,
            "p1",
            &b.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "ref-b"}),
            true,
        )
        .await
        .unwrap();
    assert_eq!(captured.status, "PENDING");
    assert_eq!(captured.partner_reference_id.as_deref(), Some("ref-b"));

    // At the deadline the sweeper times `a` out and returns its seats; `b` (captured) keeps its.
    w.clock.advance(1);
    assert_eq!(
        w.bookings.next_deadline().await.unwrap(),
        Some(a.capture_deadline_ms)
    );
    assert_eq!(w.bookings.expire_due(100).await.unwrap(), 1);
    let a2 = w.bookings.get(env, "p1", &a.id.to_string()).await.unwrap();
    assert_eq!(a2.status, "CAPTURE_TIMEOUT");
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 1);
    let late = w
        .bookings
        .update(
            env,
            "p1",
            &a.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "late"}),
            true,
        )
        .await
        .unwrap_err();
    assert_eq!((late.status, late.code), (409, "E_INVALID_STATE"));
    assert_eq!(
        w.bookings.get(env, "p1", &a.id.to_string()).await.unwrap(),
        a2,
        "a refused capture changes nothing"
    );

    // A capture that arrives after the deadline but before the sweeper: refused, and timed out.
    let c = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 1), None)
        .await
        .unwrap();
    w.clock.advance(HOUR + 5);
    let refused = w
        .bookings
        .update(
            env,
            "p1",
            &c.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "x"}),
            true,
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code, "E_INVALID_STATE");
    assert!(
        refused.message.contains("capture window closed"),
        "{}",
        refused.message
    );
    assert_eq!(
        w.bookings
            .get(env, "p1", &c.id.to_string())
            .await
            .unwrap()
            .status,
        "CAPTURE_TIMEOUT"
    );
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 1);
    // Capturing twice is refused too.
    let twice = w
        .bookings
        .update(
            env,
            "p1",
            &b.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "again"}),
            true,
        )
        .await
        .unwrap_err();
    assert_eq!(twice.code, "E_INVALID_STATE");
}

#[tokio::test]
async fn concurrent_creates_never_oversell_and_remaining_stays_exact() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let mut tasks = Vec::new();
    for i in 0..300usize {
        let bookings = w.bookings.clone();
        let body = request(&slot, 1 + i % 3);
        tasks.push(tokio::spawn(async move {
            bookings.create(env, "p1", 2, &body, None).await
        }));
    }
    let mut sold = 0u32;
    let mut ids = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(b) => {
                sold += b.pax;
                ids.push(b.id);
            }
            Err(e) => assert_eq!((e.status, e.code), (409, "E_INVENTORY_UNAVAILABLE"), "{e}"),
        }
    }
    let taken = w.bookings.seats_taken(env, &slot).await.unwrap();
    assert!(sold <= 5, "oversold: {sold} seats of 5");
    assert_eq!(
        taken, sold,
        "usage equals the seats of the bookings that exist"
    );
    // A request for more than is left is refused with exactly what is left (a full slot is
    // refused from a read connection, without the writer).
    let refused = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 4), None)
        .await
        .unwrap_err();
    assert_eq!(
        (refused.status, refused.code),
        (409, "E_INVENTORY_UNAVAILABLE")
    );
    assert_eq!(
        refused.details,
        Some(serde_json::json!({"remaining": 5 - i64::from(sold)})),
        "{refused}"
    );
    // The sandbox has its own inventory.
    assert_eq!(
        w.bookings
            .seats_taken(Environment::Sandbox, &slot)
            .await
            .unwrap(),
        0
    );

    // Cancel one, time out the rest: every seat comes back exactly.
    let first = ids[0];
    w.bookings
        .cancel(env, "p1", &first.to_string(), Some("changed plans".into()))
        .await
        .unwrap();
    w.clock.advance(HOUR);
    w.bookings.expire_due(1000).await.unwrap();
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 0);
    // Seats that came back can be sold again.
    let again = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 4), None)
        .await
        .unwrap();
    assert_eq!(again.pax, 4);
}

#[tokio::test]
async fn bad_requests_are_refused_with_the_documented_codes_and_change_nothing() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (json!({}), 400, "E_MISSING_PARAMETER", "productId"),
        (
            {
                let mut r = request(&slot, 1);
                r["price"]["amount"] = json!(39.0);
                r
            },
            409,
            "E_PRICE_MISMATCH",
            "current price 40",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["count"] = json!(2);
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "count",
        ),
        (request(&slot, 5), 400, "E_INVALID_ARGUMENT", "1–4 people"),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["customers"][0]["inputFields"][1]["value"] =
                    json!("not-an-email");
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "does not match",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["customers"][0]["inputFields"] =
                    json!([{"id": "email", "value": "a@b.co"}]);
                r
            },
            400,
            "E_MISSING_PARAMETER",
            "fullName",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["customers"][0]["inputFields"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"id": "age", "value": "7"}));
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "outside 8–99",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["customers"][0]["inputFields"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"id": "language", "value": "FR"}));
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "not one of EN, IT",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["customers"][0]["inputFields"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"id": "shoeSize", "value": "42"}));
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "shoeSize",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["inventoryId"] = json!("5001-203001010900");
                r
            },
            404,
            "E_NOT_FOUND",
            "not an open slot",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["variantId"] = json!("5003");
                r
            },
            404,
            "E_NOT_FOUND",
            "not a variant of product",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["price"]["currencyCode"] = json!("XXX");
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "not a supported currency",
        ),
        (
            {
                let mut r = request(&slot, 1);
                r["customersDetails"]["customers"][0]["isPrimary"] = json!(false);
                r
            },
            400,
            "E_INVALID_ARGUMENT",
            "isPrimary",
        ),
    ];
    for (body, status, code, needle) in cases {
        let e = w
            .bookings
            .create(env, "p1", 2, &body, None)
            .await
            .unwrap_err();
        assert_eq!((e.status, e.code), (status, code), "{body}: {e}");
        assert!(
            e.message.contains(needle),
            "{needle:?} not in {:?}",
            e.message
        );
    }
    let mismatch = {
        let mut r = request(&slot, 2);
        r["price"] = json!({"amount": 80, "currencyCode": "JPY"});
        w.bookings.create(env, "p1", 2, &r, None).await.unwrap_err()
    };
    assert_eq!(
        mismatch.details,
        Some(json!({"currentPrice": {"amount": 12824.0, "currencyCode": "JPY"}}))
    );
    assert_eq!(
        w.bookings.seats_taken(env, &slot).await.unwrap(),
        0,
        "nothing was held"
    );
    assert_eq!(
        w.bookings.list(env, "p1", 0, 20).await.unwrap().1,
        0,
        "nothing was created"
    );

    // Another partner's booking: 403; a non-numeric id: 400; unknown: 404.
    let b = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 1), None)
        .await
        .unwrap();
    assert_eq!(
        w.bookings
            .get(env, "p2", &b.id.to_string())
            .await
            .unwrap_err()
            .status,
        403
    );
    assert_eq!(
        w.bookings.get(env, "p1", "abc").await.unwrap_err().status,
        400
    );
    assert_eq!(
        w.bookings
            .get(env, "p1", "999999")
            .await
            .unwrap_err()
            .status,
        404
    );
    assert_eq!(
        w.bookings
            .get(Environment::Sandbox, "s1", &b.id.to_string())
            .await
            .unwrap_err()
            .status,
        404,
        "environments do not see each other's bookings"
    );
}

#[tokio::test]
async fn idempotency_keys_replay_the_booking_and_refuse_a_different_request() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let a = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 2), Some("k1"))
        .await
        .unwrap();
    let again = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 2), Some("k1"))
        .await
        .unwrap();
    assert_eq!(a.id, again.id);
    assert_eq!(
        w.bookings.seats_taken(env, &slot).await.unwrap(),
        2,
        "a replay holds nothing more"
    );
    let other = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 1), Some("k1"))
        .await
        .unwrap_err();
    assert_eq!((other.status, other.code), (409, "E_IDEMPOTENCY_CONFLICT"));
}

#[tokio::test]
async fn cancellation_honours_the_policy_cut_off() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock); // tomorrow 09:00; cancellable up to 1440 minutes before
    let b = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 1), None)
        .await
        .unwrap();
    w.bookings
        .update(
            env,
            "p1",
            &b.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "r"}),
            true,
        )
        .await
        .unwrap();
    // Now (00:00) is 33 h before the start: 24 h cut-off is at 09:00 today.
    w.clock.advance(10 * HOUR);
    let late = w
        .bookings
        .cancel(env, "p1", &b.id.to_string(), None)
        .await
        .unwrap_err();
    assert_eq!(late.code, "E_INVALID_STATE");
    assert!(
        late.message.contains("could be cancelled until"),
        "{}",
        late.message
    );
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 1);
    // An UNCAPTURED booking can always be released.
    let c = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 2), None)
        .await
        .unwrap();
    let cancelled = w
        .bookings
        .cancel(env, "p1", &c.id.to_string(), Some("no".into()))
        .await
        .unwrap();
    assert_eq!(cancelled.status, "CANCELLED");
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 1);
    let twice = w
        .bookings
        .cancel(env, "p1", &c.id.to_string(), None)
        .await
        .unwrap_err();
    assert_eq!(twice.code, "E_INVALID_STATE");
}

/// Steps that succeed, fail permanently, or fail transiently a number of times.
#[derive(Debug)]
struct FakeSteps {
    transient_failures: AtomicUsize,
    permanent: bool,
}

#[async_trait]
impl StepRunner for FakeSteps {
    async fn run(
        &self,
        step: &str,
        booking: &Value,
        input: &Value,
        key: &str,
    ) -> anyhow::Result<StepOutcome> {
        assert!(key.starts_with("booking:"), "{key}");
        if self.permanent && step == "confirm-supplier" {
            return Ok(StepOutcome::Permanent("supplier_rejected: no".into()));
        }
        if self.transient_failures.load(Ordering::SeqCst) > 0 {
            self.transient_failures.fetch_sub(1, Ordering::SeqCst);
            return Ok(StepOutcome::Transient("supplier busy".into()));
        }
        let id = booking["booking_id"].as_str().unwrap();
        Ok(StepOutcome::Done(match step {
            "confirm-supplier" => json!({"supplierReference": format!("SUP-{id}")}),
            "issue-tickets" => {
                json!({"supplierReference": input["supplierReference"], "tickets": [{"publicId": format!("T-{id}"), "url": null, "type": "QRCODE"}]})
            }
            _ => {
                json!({"tickets": input["tickets"], "voucherUrl": format!("https://v.example/{id}")})
            }
        }))
    }
}

#[tokio::test]
async fn fulfilment_completes_with_tickets_or_fails_and_returns_the_seats() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let pipelines = Pipelines::default();
    // A webhook registered before the changes gets one delivery per change except UNCAPTURED.
    w.bookings
        .create_webhook(
            env,
            "p1",
            "https://hooks.example/cb",
            true,
            "local:1",
            "sealed",
        )
        .await
        .unwrap();

    let ok = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 2), None)
        .await
        .unwrap();
    w.bookings
        .update(
            env,
            "p1",
            &ok.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "r1"}),
            true,
        )
        .await
        .unwrap();
    let steps = FakeSteps {
        transient_failures: AtomicUsize::new(2),
        permanent: false,
    };
    // Two transient failures: retried after backoff on the injected clock.
    assert_eq!(
        w.bookings
            .run_fulfilment(&steps, &pipelines, 60_000, 10)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        w.bookings
            .run_fulfilment(&steps, &pipelines, 60_000, 10)
            .await
            .unwrap(),
        0,
        "not due before the backoff"
    );
    w.clock.advance(1_000);
    w.bookings
        .run_fulfilment(&steps, &pipelines, 60_000, 10)
        .await
        .unwrap();
    w.clock.advance(2_000);
    for _ in 0..3 {
        w.bookings
            .run_fulfilment(&steps, &pipelines, 60_000, 10)
            .await
            .unwrap();
    }
    let done = w.bookings.get(env, "p1", &ok.id.to_string()).await.unwrap();
    assert_eq!(done.status, "COMPLETED");
    assert_eq!(
        done.tickets,
        json!([{"publicId": format!("T-{}", ok.id), "url": null, "type": "QRCODE"}])
    );
    assert_eq!(done.voucher_url, format!("https://v.example/{}", ok.id));
    assert_eq!(
        w.bookings.seats_taken(env, &slot).await.unwrap(),
        2,
        "a completed booking keeps its seats"
    );

    let bad = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 1), None)
        .await
        .unwrap();
    w.bookings
        .update(
            env,
            "p1",
            &bad.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "r2"}),
            true,
        )
        .await
        .unwrap();
    let failing = FakeSteps {
        transient_failures: AtomicUsize::new(0),
        permanent: true,
    };
    w.bookings
        .run_fulfilment(&failing, &pipelines, 60_000, 10)
        .await
        .unwrap();
    let failed = w
        .bookings
        .get(env, "p1", &bad.id.to_string())
        .await
        .unwrap();
    assert_eq!(failed.status, "FAILED");
    assert_eq!(
        w.bookings.seats_taken(env, &slot).await.unwrap(),
        2,
        "the failed booking's seat came back"
    );
    let state = w.bookings.fulfilment_state(bad.id).await.unwrap().unwrap();
    assert_eq!(state["state"], "failed");

    // The outbox: PENDING and COMPLETED for the first, PENDING and FAILED for the second, in order.
    let due = w.bookings.due_webhook_deliveries(100).await.unwrap();
    let payloads: Vec<Value> = due
        .iter()
        .map(|d| serde_json::from_str(&d.payload).unwrap())
        .collect();
    let firsts: Vec<(i64, String)> = payloads
        .iter()
        .map(|p| {
            (
                p["bookingId"].as_i64().unwrap(),
                p["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        firsts,
        vec![
            (ok.id, "PENDING".to_owned()),
            (bad.id, "PENDING".to_owned())
        ],
        "one head per booking, oldest first"
    );
    assert!(
        payloads[0]["eventTimestamp"]
            .as_str()
            .unwrap()
            .starts_with("2026-06-01T"),
        "{}",
        payloads[0]
    );
    let history = w
        .bookings
        .webhook_deliveries(due[0].webhook_id, 10)
        .await
        .unwrap();
    assert_eq!(history.len(), 4);
}

#[test]
fn an_invalid_catalog_lists_every_problem_with_its_path() {
    let mut doc: Value = serde_json::from_str(&catalog_text()).unwrap();
    doc["products"][0]["variants"][0]["pax"] = json!({"min": 4, "max": 2});
    doc["products"][0]["cityCode"] = json!("BERLIN");
    doc["products"][1]["variants"][0]["id"] = json!("5001");
    doc["products"][2]["variants"][0]["slots"][0]["startDateTime"] = json!("tomorrow");
    let err = Catalog::parse(&doc.to_string()).unwrap_err();
    let CatalogError::Invalid(problems) = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "products[0].cityCode",
            "products[0].variants[0].pax",
            "products[1].variants[0].id",
            "products[2].variants[0].slots[0].startDateTime"
        ],
        "{err}"
    );
    doc["surprise"] = json!(1);
    assert!(
        matches!(Catalog::parse(&doc.to_string()), Err(CatalogError::Parse(m)) if m.contains("surprise"))
    );
}

#[tokio::test]
async fn a_cancelled_booking_cannot_be_captured_and_reschedule_moves_the_seats_atomically() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let b = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 2), None)
        .await
        .unwrap();
    w.bookings
        .cancel(env, "p1", &b.id.to_string(), None)
        .await
        .unwrap();
    let e = w
        .bookings
        .update(
            env,
            "p1",
            &b.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": "r"}),
            true,
        )
        .await
        .unwrap_err();
    assert_eq!((e.status, e.code), (409, "E_INVALID_STATE"));
    assert_eq!(
        w.bookings
            .get(env, "p1", &b.id.to_string())
            .await
            .unwrap()
            .status,
        "CANCELLED"
    );

    // Reschedule 09:00 → 15:00 the same day: the seats move in one transaction.
    let later = slot.replace("0900", "1500");
    let r = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 3), None)
        .await
        .unwrap();
    let moved = w
        .bookings
        .reschedule(env, "p1", &r.id.to_string(), &later)
        .await
        .unwrap();
    assert_eq!(moved.slot_id, later);
    assert!(
        moved.start_local.ends_with("T15:00:00"),
        "{}",
        moved.start_local
    );
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 0);
    assert_eq!(w.bookings.seats_taken(env, &later).await.unwrap(), 3);
    // A full target slot refuses and nothing moves.
    let filler = w
        .bookings
        .create(env, "p1", 2, &request(&slot, 4), None)
        .await
        .unwrap();
    let full = w
        .bookings
        .reschedule(env, "p1", &filler.id.to_string(), &later)
        .await
        .unwrap_err();
    assert_eq!(full.code, "E_INVENTORY_UNAVAILABLE");
    assert_eq!(
        (
            w.bookings.seats_taken(env, &slot).await.unwrap(),
            w.bookings.seats_taken(env, &later).await.unwrap()
        ),
        (4, 3)
    );
    // Past the 60-minute cut-off: refused.
    w.clock.advance(HOUR * 38); // tomorrow 14:00 is one hour before 15:00
    w.clock.advance(1);
    let late = w
        .bookings
        .reschedule(env, "p1", &r.id.to_string(), &slot.replace("0900", "1500"))
        .await
        .unwrap_err();
    assert_eq!(late.code, "E_INVALID_STATE");
}

#[tokio::test]
async fn seatmap_bookings_take_named_seats_once() {
    let w = world().await;
    let mut doc: Value = serde_json::from_str(&catalog_text()).unwrap();
    doc["products"].as_array_mut().unwrap().push(json!({
        "id": "1004", "name": "Concert", "productType": "EVENT", "cityCode": "PARIS", "primaryCategoryId": "3",
        "startLocation": {"latitude": 48.85, "longitude": 2.35}, "inventorySelectionType": "SEATMAP",
        "variants": [{
            "id": "5005", "name": "Stalls", "duration": 120, "pax": {"min": 1, "max": 4},
            "persons": [{"type": "ADULT", "name": "Adult", "price": 50.0, "originalPrice": 50.0, "netPrice": 40.0}],
            "cancellationPolicy": {"cancellable": true, "cancellableUpToInMinutes": null},
            "reschedulePolicy": {"reschedulable": false, "reschedulableUpToInMinutes": null},
            "slots": [{"startDateTime": "2030-03-01T20:00:00", "capacity": 999}],
            "seatmap": {"sections": [{"name": "STALLS", "rows": ["A", "B"], "seatsPerRow": 3}]}
        }]
    }));
    w.bookings.import_catalog(&doc.to_string()).await.unwrap();
    let env = Environment::Production;
    let body = |seats: Value, n: usize| {
        let customers: Vec<Value> = (0..n)
            .map(|i| json!({"personType": "ADULT", "isPrimary": i == 0}))
            .collect();
        json!({"productId": "1004", "variantId": "5005", "inventoryId": "5005-203003012000", "inventorySeatIds": seats,
               "customersDetails": {"count": n, "customers": customers}, "price": {"amount": 50.0 * n as f64, "currencyCode": "EUR"}})
    };
    let a = w
        .bookings
        .create(
            env,
            "p1",
            2,
            &body(json!(["STALLS-A-1", "STALLS-A-2"]), 2),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        a.seat_info.as_ref().unwrap()[1],
        json!({"section": "STALLS", "row": "A", "seatNumber": "2", "seatCode": "STALLS-A-2"})
    );
    let taken = w
        .bookings
        .create(env, "p1", 2, &body(json!(["STALLS-A-2"]), 1), None)
        .await
        .unwrap_err();
    assert_eq!((taken.status, taken.code), (409, "E_INVENTORY_UNAVAILABLE"));
    assert!(taken.message.contains("STALLS-A-2"), "{}", taken.message);
    let missing = w
        .bookings
        .create(env, "p1", 2, &body(Value::Null, 1), None)
        .await
        .unwrap_err();
    assert_eq!(missing.code, "E_MISSING_PARAMETER");
    let unknown = w
        .bookings
        .create(env, "p1", 2, &body(json!(["STALLS-Z-9"]), 1), None)
        .await
        .unwrap_err();
    assert_eq!(unknown.code, "E_INVALID_ARGUMENT");
    let count = w
        .bookings
        .create(env, "p1", 2, &body(json!(["STALLS-B-1"]), 2), None)
        .await
        .unwrap_err();
    assert_eq!(count.code, "E_INVALID_ARGUMENT");
    // The capacity is the seat count (6), not the slot's nominal 999; a refused create held nothing.
    assert_eq!(
        w.bookings
            .seats_taken(env, "5005-203003012000")
            .await
            .unwrap(),
        2
    );
    w.bookings
        .cancel(env, "p1", &a.id.to_string(), None)
        .await
        .unwrap();
    w.bookings
        .create(env, "p1", 2, &body(json!(["STALLS-A-2"]), 1), None)
        .await
        .unwrap();
}
