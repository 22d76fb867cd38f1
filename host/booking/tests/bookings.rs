//! The booking engine on a real SQLite file with a manual clock: holds, the capture window and
//! its sweeper, no oversell under concurrency, cancellation cut-offs, fulfilment outcomes and the
//! webhook outbox — without sleeping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use capstan_booking::catalog::{Catalog, CatalogError, local};
use capstan_booking::fulfilment::{Pipelines, StepOutcome, StepRunner};
use capstan_booking::partners::{PartnerRecord, PartnerType};
use capstan_booking::{BookingConfig, BookingStatus, Bookings, Environment};
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
    world_at(START).await
}

async fn world_at(start: u64) -> World {
    // A refusal a test does not expect then says why: the booking store logs the cause of a 503
    // or 500 at warn (`BookingError::unavailable`, `internal`), and the test writer shows it in
    // a failing test's output only.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let clock = ManualClock::new(start);
    let bookings = Bookings::open(store, Arc::new(clock.clone()), BookingConfig::default())
        .await
        .unwrap();
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

/// Creates a booking of `body` for partner `p1` and captures it with `reference`.
async fn captured(w: &World, body: &Value, reference: &str) -> capstan_booking::BookingRow {
    let env = Environment::Production;
    let b = w.bookings.create(env, "p1", 2, body, None).await.unwrap();
    w.bookings
        .update(
            env,
            "p1",
            &b.id.to_string(),
            &json!({"status": "PENDING", "partnerReferenceId": reference}),
            true,
        )
        .await
        .unwrap();
    b
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
async fn the_booking_tables_are_booking_s_own_migrations_with_a_history_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let url = capstan_testdb::fresh_database_url(dir.path()).await;
    let store = capstan_store::Store::open(&url).await.unwrap();
    let core = store.applied_migrations().await.unwrap();
    let partners = sqlx::query("SELECT 1 FROM partners")
        .fetch_all(store.pool())
        .await;
    assert!(
        partners.is_err(),
        "the store alone creates no booking table"
    );

    let bookings = Bookings::open(
        store.clone(),
        Arc::new(ManualClock::new(START)),
        BookingConfig::default(),
    )
    .await
    .unwrap();
    bookings.import_catalog(&catalog_text()).await.unwrap();
    let applied = capstan_booking::applied_migrations(&store).await.unwrap();
    assert_eq!(applied, vec![1]);
    assert_eq!(
        store.applied_migrations().await.unwrap(),
        core,
        "booking's history is apart from the store's"
    );

    // Opening again (a restart, or `capstan migrate` before the nodes) applies nothing new and
    // keeps what the tables hold.
    let again = capstan_store::Store::open(&url).await.unwrap();
    capstan_booking::migrate(&again).await.unwrap();
    assert_eq!(
        capstan_booking::applied_migrations(&again).await.unwrap(),
        vec![1]
    );
    let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM catalog")
        .fetch_one(again.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1, "the imported catalog is still there");
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
    assert_eq!(a.status, BookingStatus::Uncaptured);
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
    assert_eq!(captured.status, BookingStatus::Pending);
    assert_eq!(captured.partner_reference_id.as_deref(), Some("ref-b"));

    // At the deadline the sweeper times `a` out and returns its seats; `b` (captured) keeps its.
    w.clock.advance(1);
    assert_eq!(
        w.bookings.next_deadline().await.unwrap(),
        Some(a.capture_deadline_ms)
    );
    assert_eq!(w.bookings.expire_due(100).await.unwrap(), 1);
    let a2 = w.bookings.get(env, "p1", &a.id.to_string()).await.unwrap();
    assert_eq!(a2.status, BookingStatus::CaptureTimeout);
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
        BookingStatus::CaptureTimeout
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
    // Ids are twelve random digits, not a counter anyone could read volumes from.
    assert!(
        ids.iter()
            .all(|id| (100_000_000_000..1_000_000_000_000).contains(id)),
        "{ids:?}"
    );
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert!(sorted.windows(2).all(|w| w[1] - w[0] > 1), "{sorted:?}");
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
    assert_eq!(cancelled.status, BookingStatus::Cancelled);
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
    assert_eq!(done.status, BookingStatus::Completed);
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
    assert_eq!(failed.status, BookingStatus::Failed);
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
    doc["cities"][1]["timeZone"] = json!("Europe/Atlantis");
    let err = Catalog::parse(&doc.to_string()).unwrap_err();
    let CatalogError::Invalid(problems) = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "cities[1].timeZone",
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
        BookingStatus::Cancelled
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
    let w = seatmap_world().await;
    let env = Environment::Production;
    let body = seatmap_request;
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
    assert_eq!(w.bookings.seats_taken(env, SEATMAP_SLOT).await.unwrap(), 2);
    w.bookings
        .cancel(env, "p1", &a.id.to_string(), None)
        .await
        .unwrap();
    w.bookings
        .create(env, "p1", 2, &body(json!(["STALLS-A-2"]), 1), None)
        .await
        .unwrap();
}

/// The seatmap concert's one slot.
const SEATMAP_SLOT: &str = "5005-203003012000";

/// A world whose catalog also has a seatmap concert (product 1004, variant 5005, six seats in
/// rows A and B of STALLS).
async fn seatmap_world() -> World {
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
    w
}

/// A booking of `n` adults on the concert's one slot, naming `seats`.
fn seatmap_request(seats: Value, n: usize) -> Value {
    let customers: Vec<Value> = (0..n)
        .map(|i| json!({"personType": "ADULT", "isPrimary": i == 0}))
        .collect();
    json!({"productId": "1004", "variantId": "5005", "inventoryId": SEATMAP_SLOT, "inventorySeatIds": seats,
           "customersDetails": {"count": n, "customers": customers}, "price": {"amount": 50.0 * n as f64, "currencyCode": "EUR"}})
}

/// Creates that race for one Idempotency-Key or one named seat commit one booking between
/// them, whichever commits first; the others answer as a create after it would: the same
/// booking for the same request, 409 for a different one or for a seat it took. A request
/// that names a seat twice is refused (400) and holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_racing_for_a_key_or_a_seat_commit_one_booking() {
    let w = seatmap_world().await;
    let env = Environment::Production;
    let race = |bodies: Vec<Value>, key: Option<&'static str>| {
        let tasks: Vec<_> = bodies
            .into_iter()
            .map(|body| {
                let bookings = w.bookings.clone();
                tokio::spawn(async move { bookings.create(env, "p1", 2, &body, key).await })
            })
            .collect();
        async move {
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(t.await.unwrap());
            }
            answers
        }
    };
    // The same request under one key: one booking, every answer that booking.
    let same = race(
        vec![seatmap_request(json!(["STALLS-A-1"]), 1); 16],
        Some("same"),
    )
    .await;
    let ids: std::collections::BTreeSet<i64> =
        same.iter().map(|a| a.as_ref().unwrap().id).collect();
    assert_eq!(ids.len(), 1, "{same:?}");
    // Different requests under one key: one booking; the others get it back when their
    // request is the winner's, and 409 otherwise.
    let bodies: Vec<Value> = (0..16)
        .map(|i| seatmap_request(json!([format!("STALLS-A-{}", 2 + i % 2)]), 1))
        .collect();
    let mixed = race(bodies, Some("mixed")).await;
    let won: std::collections::BTreeSet<i64> = mixed
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .map(|b| b.id)
        .collect();
    assert_eq!(won.len(), 1, "{mixed:?}");
    for answer in &mixed {
        if let Err(e) = answer {
            assert_eq!((e.status, e.code), (409, "E_IDEMPOTENCY_CONFLICT"), "{e}");
        }
    }
    // One seat, no keys: one booking holds it.
    let seat = race(vec![seatmap_request(json!(["STALLS-B-1"]), 1); 16], None).await;
    assert_eq!(seat.iter().filter(|a| a.is_ok()).count(), 1, "{seat:?}");
    for answer in &seat {
        if let Err(e) = answer {
            assert_eq!((e.status, e.code), (409, "E_INVENTORY_UNAVAILABLE"), "{e}");
            assert!(e.message.contains("STALLS-B-1"), "{e}");
        }
    }
    let twice = w
        .bookings
        .create(
            env,
            "p1",
            2,
            &seatmap_request(json!(["STALLS-B-2", "STALLS-B-2"]), 2),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!((twice.status, twice.code), (400, "E_INVALID_ARGUMENT"));
    // Three bookings of one seat each, and nothing else held.
    assert_eq!(w.bookings.seats_taken(env, SEATMAP_SLOT).await.unwrap(), 3);
    w.bookings
        .create(
            env,
            "p1",
            2,
            &seatmap_request(json!(["STALLS-B-2"]), 1),
            None,
        )
        .await
        .unwrap();
    // A first create larger than a slot nobody has booked yet: 409 with all of it remaining.
    let mut doc: Value = serde_json::from_str(&catalog_text()).unwrap();
    doc["products"][0]["variants"][0]["pax"]["max"] = json!(8);
    w.bookings.import_catalog(&doc.to_string()).await.unwrap();
    let small = slot(&w.clock);
    let larger = w
        .bookings
        .create(env, "p1", 2, &request(&small, 6), None)
        .await
        .unwrap_err();
    assert_eq!(
        (larger.status, larger.code, larger.details.clone()),
        (
            409,
            "E_INVENTORY_UNAVAILABLE",
            Some(json!({"remaining": 5}))
        ),
        "{larger}"
    );
    assert_eq!(w.bookings.seats_taken(env, &small).await.unwrap(), 0);
}

/// Succeeds for most bookings, fails for every third (a permanent supplier refusal), and
/// yields between steps so that other changes interleave with fulfilment.
#[derive(Debug)]
struct StormSteps;

#[async_trait]
impl StepRunner for StormSteps {
    async fn run(
        &self,
        _step: &str,
        booking: &Value,
        _input: &Value,
        _key: &str,
    ) -> anyhow::Result<StepOutcome> {
        tokio::task::yield_now().await;
        let id: i64 = booking["booking_id"].as_str().unwrap().parse().unwrap();
        Ok(if id % 3 == 0 {
            StepOutcome::Permanent("supplier_rejected: storm".into())
        } else {
            StepOutcome::Done(json!({}))
        })
    }
}

/// A small deterministic generator (no dependency for one test): xorshift64.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Concurrent storms of creates, captures, cancels, reschedules, capture timeouts and
/// fulfilment (successes and failures) over four slots keep the ledger exact: for every slot,
/// seats taken = Σ pax of its UNCAPTURED, PENDING and COMPLETED bookings, never above capacity.
/// Every refusal is a documented 4xx; nothing answers 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storms_of_every_change_keep_the_seat_ledger_exact() {
    let w = world().await;
    let env = Environment::Production;
    let day = |n: i64| {
        local(capstan_core::Clock::now_millis(&w.clock) as i64).date() + chrono::Duration::days(n)
    };
    let slots: Vec<String> = [(1, "0900"), (1, "1500"), (2, "0900"), (2, "1500")]
        .iter()
        .map(|(n, at)| format!("5001-{}{at}", day(*n).format("%Y%m%d")))
        .collect();
    let known = Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let pipelines = Arc::new(Pipelines::default());
    let mut tasks = Vec::new();
    for task in 0..8u64 {
        let (bookings, clock, slots, known, pipelines) = (
            w.bookings.clone(),
            w.clock.clone(),
            slots.clone(),
            known.clone(),
            pipelines.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut dice = Dice(0x9E37_79B9_7F4A_7C15 ^ (task + 1));
            for _ in 0..60 {
                let pick = {
                    let known = known.lock().unwrap();
                    (!known.is_empty()).then(|| known[dice.roll(known.len())].to_string())
                };
                let slot = &slots[dice.roll(slots.len())];
                let result = match (dice.roll(8), pick) {
                    (0 | 1, _) | (_, None) => bookings
                        .create(env, "p1", 2, &request(slot, 1 + dice.roll(2)), None)
                        .await
                        .map(|b| known.lock().unwrap().push(b.id)),
                    (2, Some(id)) => bookings
                        .update(
                            env,
                            "p1",
                            &id,
                            &json!({"status": "PENDING", "partnerReferenceId": format!("r{id}")}),
                            true,
                        )
                        .await
                        .map(drop),
                    (3, Some(id)) => bookings.cancel(env, "p1", &id, None).await.map(drop),
                    (4 | 5, Some(id)) => bookings.reschedule(env, "p1", &id, slot).await.map(drop),
                    (6, _) => {
                        if dice.roll(4) == 0 {
                            // Some holds outlive their capture window.
                            clock.advance(20 * 60_000);
                        }
                        bookings.expire_due(100).await.map(drop)
                    }
                    (_, _) => bookings
                        .run_fulfilment(&StormSteps, &pipelines, 60_000, 10)
                        .await
                        .map(drop),
                };
                if let Err(e) = result {
                    assert!(
                        e.status == 409
                            || (e.status == 400 && e.message.contains("already in that slot")),
                        "only documented refusals: {e}"
                    );
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (all, total) = w.bookings.list(env, "p1", 0, 10_000).await.unwrap();
    assert_eq!(all.len() as i64, total);
    assert!(all.len() >= 20, "the storm made bookings: {}", all.len());
    let moved = all
        .iter()
        .filter(|b| b.status != BookingStatus::Uncaptured)
        .count();
    assert!(moved > 10, "the storm changed bookings: {moved}");
    for slot in &slots {
        let held: u32 = all
            .iter()
            .filter(|b| &b.slot_id == slot && b.status.holds_seats())
            .map(|b| b.pax)
            .sum();
        let taken = w.bookings.seats_taken(env, slot).await.unwrap();
        assert_eq!(taken, held, "slot {slot}: the ledger matches its bookings");
        assert!(taken <= 5, "slot {slot} oversold: {taken}");
    }
}

/// Fails transiently while `failures` lasts, then succeeds; records the amounts in minor units
/// it was handed.
#[derive(Debug, Default)]
struct FlakySupplier {
    failures: AtomicUsize,
    amounts: std::sync::Mutex<Vec<(String, i64)>>,
}

#[async_trait]
impl StepRunner for FlakySupplier {
    async fn run(
        &self,
        _step: &str,
        booking: &Value,
        _input: &Value,
        _key: &str,
    ) -> anyhow::Result<StepOutcome> {
        self.amounts.lock().unwrap().push((
            booking["currency_code"].as_str().unwrap().to_owned(),
            booking["amount_minor"].as_i64().unwrap(),
        ));
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Ok(StepOutcome::Transient("supplier down".into()));
        }
        Ok(StepOutcome::Done(json!({})))
    }
}

/// A supplier outage is retried with growing waits for the pipeline's budget, the booking
/// staying PENDING (with the seats) meanwhile; past the budget it fails and the seats return.
/// Steps get amounts in the currency's minor units (cents for EUR, yen for JPY).
#[tokio::test]
async fn fulfilment_outlasts_an_outage_within_its_budget_and_hands_over_minor_units() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let capture =
        async |body: Value, reference: &str| captured(&w, &body, reference).await.id.to_string();
    // Default budget: hours of failures keep the booking PENDING.
    let defaults = Pipelines::default();
    let waits: i64 = (0..1000)
        .take_while(|n| defaults.retries(*n))
        .map(|n| defaults.backoff_ms(n))
        .sum();
    assert!(waits >= 5 * HOUR as i64, "retried for {waits} ms");

    let pipelines = Pipelines {
        default: vec!["confirm-supplier".into()],
        retry_for_ms: 10_000,
        max_backoff_ms: 4_000,
        ..Pipelines::default()
    };
    let supplier = FlakySupplier {
        failures: AtomicUsize::new(100),
        ..FlakySupplier::default()
    };
    let id = capture(request(&slot, 1), "out").await;
    // Waits of 1, 2 and 4 s (7 s of the 10 s budget); the next wait would exceed it.
    for wait in [1_000, 2_000, 4_000] {
        w.bookings
            .run_fulfilment(&supplier, &pipelines, 60_000, 10)
            .await
            .unwrap();
        let b = w.bookings.get(env, "p1", &id).await.unwrap();
        assert_eq!(b.status, BookingStatus::Pending, "still retrying");
        assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 1);
        w.clock.advance(wait);
    }
    w.bookings
        .run_fulfilment(&supplier, &pipelines, 60_000, 10)
        .await
        .unwrap();
    let b = w.bookings.get(env, "p1", &id).await.unwrap();
    assert_eq!(b.status, BookingStatus::Failed, "past the budget");
    assert_eq!(w.bookings.seats_taken(env, &slot).await.unwrap(), 0);

    // Minor units by the currency's precision: 40 EUR is 4000 cents, 40 EUR in JPY (rate
    // 160.3, no decimals) is 6412 yen.
    supplier.failures.store(0, Ordering::SeqCst);
    supplier.amounts.lock().unwrap().clear();
    capture(request(&slot, 1), "eur").await;
    let mut yen = request(&slot, 1);
    yen["price"] = json!({"amount": 6412.0, "currencyCode": "JPY"});
    capture(yen, "jpy").await;
    w.bookings
        .run_fulfilment(&supplier, &pipelines, 60_000, 10)
        .await
        .unwrap();
    let mut amounts = supplier.amounts.lock().unwrap().clone();
    amounts.sort();
    assert_eq!(
        amounts,
        [("EUR".to_owned(), 4000), ("JPY".to_owned(), 6412)]
    );
}

/// Milliseconds of an RFC 3339 instant.
fn at(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .timestamp_millis() as u64
}

/// Rome's clocks go back on 2026-10-25 (03:00 CEST → 02:00 CET). What is past, a policy's
/// cut-off and the webhook's eventTimestamp are all read in the supplier's zone, and a cut-off
/// of 24 hours is 24 real hours across the change.
#[tokio::test]
async fn local_times_are_the_suppliers_across_a_daylight_saving_change() {
    let w = world_at(at("2026-10-24T06:00:00Z")).await; // 08:00 in Rome (CEST)
    let env = Environment::Production;
    let slot = "5001-202610250900"; // 09:00 CET = 08:00Z
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
    let capture = async |reference: &str| captured(&w, &request(slot, 1), reference).await;
    let early = capture("early").await;
    let late = capture("late").await;
    let json = early.to_json(true);
    assert_eq!(json["startDateTime"], "2026-10-25T09:00:00");
    assert_eq!(json["startTime"], "2026-10-25T09:00:00+01:00");
    assert_eq!(json["startTimeLocal"], "2026-10-25 09:00:00");
    assert_eq!(json["dateCreated"], "2026-10-24T08:00:00.000+02:00");

    // Cut-off 1,440 minutes before the start: 2026-10-24T08:00Z, 10:00 in Rome. (Counted on the
    // wall clock it would be 09:00 in Rome, an hour early.)
    w.clock.advance(90 * 60_000); // 07:30Z, 09:30 in Rome
    w.bookings
        .cancel(env, "p1", &early.id.to_string(), None)
        .await
        .unwrap();
    w.clock.advance(60 * 60_000); // 08:30Z, 10:30 in Rome
    let refused = w
        .bookings
        .cancel(env, "p1", &late.id.to_string(), None)
        .await
        .unwrap_err();
    assert_eq!((refused.status, refused.code), (409, "E_INVALID_STATE"));
    assert!(
        refused.message.contains("until 2026-10-24 10:00:00"),
        "{}",
        refused.message
    );
    // The webhook says when, in Rome, without a zone.
    let payloads: Vec<String> =
        sqlx::query_scalar("SELECT payload FROM booking_webhook_deliveries ORDER BY event_seq")
            .fetch_all(w.bookings.store().pool())
            .await
            .unwrap();
    let cancelled = payloads
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap())
        .find(|p| p["status"] == "CANCELLED")
        .unwrap();
    assert_eq!(cancelled["eventTimestamp"], "2026-10-24T09:30:00.000");

    // On the day, after the change: the 09:00 slot is on sale at 08:30 in Rome (07:30Z) and
    // gone at 09:05 (08:05Z), though UTC still reads 08:05.
    w.clock.set(at("2026-10-25T07:30:00Z"));
    w.bookings
        .create(env, "p1", 2, &request(slot, 1), None)
        .await
        .unwrap();
    w.clock.set(at("2026-10-25T08:05:00Z"));
    let gone = w
        .bookings
        .create(env, "p1", 2, &request(slot, 1), None)
        .await
        .unwrap_err();
    assert_eq!((gone.status, gone.code), (404, "E_NOT_FOUND"), "{gone}");
}

/// Records every undo (step, key, handover) and fails the first undo of `issue-tickets`
/// transiently.
#[derive(Debug, Default)]
struct Undoing {
    undone: std::sync::Mutex<Vec<(String, String, Value)>>,
    flaky: AtomicUsize,
}

#[async_trait]
impl StepRunner for Undoing {
    async fn run(
        &self,
        step: &str,
        booking: &Value,
        input: &Value,
        key: &str,
    ) -> anyhow::Result<StepOutcome> {
        FakeSteps {
            transient_failures: AtomicUsize::new(0),
            permanent: false,
        }
        .run(step, booking, input, key)
        .await
    }

    async fn compensate(
        &self,
        step: &str,
        _booking: &Value,
        handover: &Value,
        key: &str,
    ) -> anyhow::Result<StepOutcome> {
        if step == "issue-tickets" && self.flaky.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(StepOutcome::Transient("admission busy".into()));
        }
        self.undone
            .lock()
            .unwrap()
            .push((step.to_owned(), key.to_owned(), handover.clone()));
        Ok(StepOutcome::Done(Value::Null))
    }
}

/// Cancelling a fulfilled booking undoes its steps backward, each once with its own key (a
/// transient failure is retried), then clears its tickets; cancelling one mid-pipeline undoes
/// only the steps that ran or were running.
#[tokio::test]
async fn cancelling_a_fulfilled_booking_undoes_its_steps_backward_exactly_once() {
    let w = world().await;
    let env = Environment::Production;
    let slot = slot(&w.clock);
    let pipelines = Pipelines::default();
    let runner = Undoing::default();
    let capture = async |reference: &str| captured(&w, &request(&slot, 1), reference).await.id;
    let run = async || {
        for _ in 0..10 {
            w.bookings
                .run_fulfilment(&runner, &pipelines, 60_000, 10)
                .await
                .unwrap();
            w.clock.advance(5_000);
        }
    };
    let done = capture("done").await;
    run().await;
    let fulfilled = w.bookings.get(env, "p1", &done.to_string()).await.unwrap();
    assert_eq!(fulfilled.status, BookingStatus::Completed);
    assert_eq!(fulfilled.tickets.as_array().unwrap().len(), 1);
    w.bookings
        .cancel(env, "p1", &done.to_string(), None)
        .await
        .unwrap();
    run().await;
    let undone: Vec<(String, String)> = runner
        .undone
        .lock()
        .unwrap()
        .iter()
        .map(|(step, key, _)| (step.clone(), key.clone()))
        .collect();
    assert_eq!(
        undone,
        [
            (
                "deliver-voucher".to_owned(),
                format!("booking:{done}:undo:2")
            ),
            ("issue-tickets".to_owned(), format!("booking:{done}:undo:1")),
            (
                "confirm-supplier".to_owned(),
                format!("booking:{done}:undo:0")
            ),
        ]
    );
    // Each undo sees what the pipeline had handed on: the last step's output.
    let handover = runner.undone.lock().unwrap()[2].2.clone();
    assert_eq!(handover["voucherUrl"], format!("https://v.example/{done}"));
    let state = w.bookings.fulfilment_state(done).await.unwrap().unwrap();
    assert_eq!(state["state"], "compensated", "{state}");
    let cancelled = w.bookings.get(env, "p1", &done.to_string()).await.unwrap();
    assert_eq!(cancelled.status, BookingStatus::Cancelled);
    assert_eq!(cancelled.tickets, json!([]));

    // Cancelled after its first step: only that step and the one it was at are undone.
    runner.undone.lock().unwrap().clear();
    let midway = capture("midway").await;
    w.bookings
        .run_fulfilment(&runner, &pipelines, 60_000, 10)
        .await
        .unwrap();
    w.bookings
        .cancel(env, "p1", &midway.to_string(), None)
        .await
        .unwrap();
    run().await;
    let steps: Vec<String> = runner
        .undone
        .lock()
        .unwrap()
        .iter()
        .map(|(step, _, _)| step.clone())
        .collect();
    assert_eq!(steps, ["issue-tickets", "confirm-supplier"]);
}

/// A supplier that confirms only when the test lets it, recording the order of what happened.
#[derive(Debug, Default)]
struct SlowSupplier {
    started: tokio::sync::Notify,
    release: tokio::sync::Notify,
    happened: std::sync::Mutex<Vec<(String, Value)>>,
}

#[async_trait]
impl StepRunner for SlowSupplier {
    async fn run(
        &self,
        step: &str,
        _booking: &Value,
        input: &Value,
        _key: &str,
    ) -> anyhow::Result<StepOutcome> {
        self.happened
            .lock()
            .unwrap()
            .push((format!("run {step}"), input.clone()));
        self.started.notify_one();
        self.release.notified().await;
        Ok(StepOutcome::Done(json!({"supplierReference": "SUP-slow"})))
    }

    async fn compensate(
        &self,
        step: &str,
        _booking: &Value,
        handover: &Value,
        _key: &str,
    ) -> anyhow::Result<StepOutcome> {
        self.happened
            .lock()
            .unwrap()
            .push((format!("undo {step}"), handover.clone()));
        Ok(StepOutcome::Done(Value::Null))
    }
}

/// A cancel that lands while the supplier is confirming neither cuts the step off nor starts
/// the undo under it: the step keeps its lease and finishes, and the undo, once it runs, gets
/// the step's output (the reference to cancel), not the input the step started from.
#[tokio::test]
async fn a_cancel_during_a_step_lets_it_finish_and_undoes_what_it_did() {
    let w = world().await;
    let env = Environment::Production;
    let pipelines = Pipelines::default();
    let runner = SlowSupplier::default();
    let id = captured(&w, &request(&slot(&w.clock), 1), "slow").await.id;
    let lease_ms = 300;
    let forward = w.bookings.run_fulfilment(&runner, &pipelines, lease_ms, 10);
    let meanwhile = async {
        runner.started.notified().await;
        w.bookings
            .cancel(env, "p1", &id.to_string(), None)
            .await
            .unwrap();
        // Past the first lease, and long enough for renewals: no other pass takes the job.
        w.clock.advance(2 * lease_ms as u64);
        tokio::time::sleep(std::time::Duration::from_millis(3 * lease_ms as u64)).await;
        let taken = w
            .bookings
            .run_fulfilment(&runner, &pipelines, lease_ms, 10)
            .await
            .unwrap();
        runner.release.notify_one();
        taken
    };
    let (ran, taken) = tokio::join!(forward, meanwhile);
    assert_eq!((ran.unwrap(), taken), (1, 0), "{:?}", runner.happened);
    // The undo is due at once: the finished step released its lease.
    for _ in 0..3 {
        w.bookings
            .run_fulfilment(&runner, &pipelines, lease_ms, 10)
            .await
            .unwrap();
    }
    let happened = runner.happened.lock().unwrap().clone();
    assert_eq!(
        happened,
        [
            ("run confirm-supplier".to_owned(), Value::Null),
            (
                "undo confirm-supplier".to_owned(),
                json!({"supplierReference": "SUP-slow"})
            ),
        ]
    );
    let state = w.bookings.fulfilment_state(id).await.unwrap().unwrap();
    assert_eq!(state["state"], "compensated", "{state}");
}
