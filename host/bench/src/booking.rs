//! `capstan bench` — booking: creates on contended slots at concurrency 64 against the booking
//! engine on a fresh SQLite file (the path every create takes below HTTP: validation, pricing,
//! the guarded seat update and the booking row in one transaction), and the oversell count,
//! which must be 0.

use capstan_booking::catalog::local;
use capstan_booking::partners::{PartnerRecord, PartnerType};
use capstan_booking::{BookingConfig, Bookings, Environment};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A catalog of one product whose variant has `slots` daily start times of `capacity` seats.
fn catalog(slots: usize, capacity: u32) -> String {
    let times: Vec<String> = (0..slots)
        .map(|i| format!("{:02}:{:02}", 6 + i / 4, (i % 4) * 15))
        .collect();
    json!({
        "baseCurrency": "EUR",
        "currencies": [{"code": "EUR", "currencyName": "Euro", "symbol": "€", "localSymbol": "€", "precision": 2, "rate": 1.0}],
        "cities": [{"code": "BENCH", "name": "Bench", "timeZone": "UTC"}],
        "categories": [{"id": "1", "name": "Tours", "cityCode": "BENCH"}],
        "products": [{
            "id": "1", "name": "Contended tour", "productType": "TOUR", "cityCode": "BENCH", "primaryCategoryId": "1",
            "startLocation": {"latitude": 0.0, "longitude": 0.0},
            "variants": [{
                "id": "10", "name": "Standard", "duration": 60, "pax": {"min": 1, "max": 4},
                "inputFields": [{"oldId": 1, "id": "fullName", "name": "Full name", "validation": {"required": true, "minLength": 2}}],
                "persons": [{"type": "ADULT", "name": "Adult", "price": 10.0, "originalPrice": 10.0, "netPrice": 8.0}],
                "cancellationPolicy": {"cancellable": true, "cancellableUpToInMinutes": 0},
                "reschedulePolicy": {"reschedulable": false, "reschedulableUpToInMinutes": null},
                "schedule": {"startTimes": times, "daysAhead": 30, "capacity": capacity},
            }],
        }],
    })
    .to_string()
}

fn body(slot: &str, pax: usize) -> Value {
    let customers: Vec<Value> = (0..pax)
        .map(|i| json!({"personType": "ADULT", "isPrimary": i == 0, "inputFields": if i == 0 { json!([{"id": "fullName", "value": "Bench"}]) } else { json!([]) }}))
        .collect();
    json!({
        "productId": "1", "variantId": "10", "inventoryId": slot,
        "customersDetails": {"count": pax, "customers": customers},
        "price": {"amount": 10.0 * pax as f64, "currencyCode": "EUR"},
    })
}

/// Runs the booking bench and returns its figures as JSON.
pub async fn run(quick: bool) -> anyhow::Result<Value> {
    let (attempts, slots, capacity, concurrency) = if quick {
        (400usize, 4usize, 50u32, 64usize)
    } else {
        (20_000, 16, 500, 64)
    };
    let dir = tempfile::tempdir()?;
    let store =
        capstan_store::Store::open(&format!("sqlite://{}/bench.db", dir.path().display())).await?;
    let clock = Arc::new(capstan_core::SystemClock);
    let bookings = Bookings::open(store, clock.clone(), BookingConfig::default()).await?;
    bookings
        .import_catalog(&catalog(slots, capacity))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    bookings
        .insert_partner(&PartnerRecord {
            id: "bench".into(),
            name: "bench".into(),
            partner_type: PartnerType::Booking,
            environment: Environment::Production,
            key_prefix: "bench".into(),
            key_hash: String::new(),
            pepper_version: 1,
            created_ms: 0,
            revoked_ms: None,
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let tomorrow = local(capstan_core::Clock::now_millis(clock.as_ref()) as i64).date()
        + chrono::Duration::days(1);
    let slot_ids: Vec<String> = (0..slots)
        .map(|i| {
            format!(
                "10-{}{:02}{:02}",
                tomorrow.format("%Y%m%d"),
                6 + i / 4,
                (i % 4) * 15
            )
        })
        .collect();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (bookings, next, slot_ids) = (bookings.clone(), next.clone(), slot_ids.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let (mut sold_pax, mut refused, mut errors) = (0u64, 0u64, 0u64);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= attempts {
                    break;
                }
                let pax = 1 + i % 4;
                let t = Instant::now();
                match bookings
                    .create(
                        Environment::Production,
                        "bench",
                        2,
                        &body(&slot_ids[i % slot_ids.len()], pax),
                        None,
                    )
                    .await
                {
                    Ok(b) => sold_pax += u64::from(b.pax),
                    Err(e) if e.code == "E_INVENTORY_UNAVAILABLE" => refused += 1,
                    Err(_) => errors += 1,
                }
                lat.push(t.elapsed());
            }
            (lat, sold_pax, refused, errors)
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    let (mut sold, mut refused, mut errors) = (0u64, 0u64, 0u64);
    for t in tasks {
        let (lat, s, r, e) = t.await?;
        latencies.extend(lat);
        sold += s;
        refused += r;
        errors += e;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    // Oversells: seats taken beyond capacity, and usage that disagrees with the bookings sold.
    let mut oversells = 0u64;
    let mut taken_total = 0u64;
    for slot in &slot_ids {
        let taken = u64::from(
            bookings
                .seats_taken(Environment::Production, slot)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        taken_total += taken;
        oversells += taken.saturating_sub(u64::from(capacity));
    }
    if taken_total != sold {
        oversells += taken_total.abs_diff(sold);
    }
    let result = json!({
        "attempts": attempts,
        "concurrency": concurrency,
        "slots": slots,
        "capacityPerSlot": capacity,
        "seatsSold": sold,
        "refused": refused,
        "errors": errors,
        "createsPerSecond": (attempts as f64 / elapsed.as_secs_f64()).round(),
        "p50Ms": pct(0.50).as_secs_f64() * 1e3,
        "p99Ms": pct(0.99).as_secs_f64() * 1e3,
        "oversells": oversells,
    });
    println!(
        "booking   {attempts} creates on {slots} slots × {capacity} seats, concurrency {concurrency}: {:.0} creates/s, p50 {:.2} ms, p99 {:.2} ms, sold {sold} seats, refused {refused}, errors {errors}, oversells {oversells}",
        attempts as f64 / elapsed.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
    anyhow::ensure!(oversells == 0, "OVERSOLD: {oversells} seats");
    Ok(result)
}
