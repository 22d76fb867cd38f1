use super::*;
use capstan_core::ManualClock;

async fn cloud() -> (SimulatedCloud, ManualClock, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let clock = ManualClock::new(1_000_000);
    let cloud = SimulatedCloud::new(
        &store,
        Arc::new(clock.clone()),
        SimulationSettings::default(),
    )
    .await
    .unwrap();
    (cloud, clock, dir)
}

#[tokio::test]
async fn dns_changes_go_insync_after_the_propagation_delay_and_repeat_tokens_change_nothing() {
    let (cloud, clock, _dir) = cloud().await;
    let zone = cloud
        .call("dns.find-zone", &json!({"domain": "www.Example.com"}), "")
        .await
        .unwrap();
    assert_eq!(zone["name"], "example.com");
    let set = json!({"name": "www.example.com", "type_": "Cname", "ttl": 300, "values": ["d1.cdn"], "alias_target": null});
    let request = json!({"zone_id": zone["id"], "changes": [{"Upsert": set}]});
    let first = cloud
        .call("dns.change-records", &request, "t1")
        .await
        .unwrap();
    assert_eq!(first["prior"], json!([]));
    let again = cloud
        .call("dns.change-records", &request, "t1")
        .await
        .unwrap();
    assert_eq!(first, again, "the same token answers the same");
    assert_eq!(cloud.snapshot().await.unwrap()["effects"], 1);
    let change = json!({"change_id": first["change_id"]});
    assert_eq!(
        cloud.call("dns.get-change", &change, "").await.unwrap(),
        "Pending"
    );
    clock.advance(2_000);
    assert_eq!(
        cloud.call("dns.get-change", &change, "").await.unwrap(),
        "Insync"
    );
    let second = cloud
        .call("dns.change-records", &request, "t2")
        .await
        .unwrap();
    assert_eq!(
        second["prior"][0]["values"],
        json!(["d1.cdn"]),
        "the prior state is in the receipt"
    );
    let missing = cloud
        .call(
            "dns.change-records",
            &json!({"zone_id": "Znope", "changes": []}),
            "t3",
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code, "not-found");
}

/// A change batch names record sets of its own zone only: the apex or a name under it, with or
/// without the final dot.
#[tokio::test]
async fn a_change_names_only_record_sets_of_its_zone() {
    let (cloud, _clock, _dir) = cloud().await;
    let zone = example_zone(&cloud).await;
    let change = |name: &str| {
        let set =
            json!({"name": name, "type_": "Txt", "ttl": 60, "values": ["v"], "alias_target": null});
        json!({"zone_id": zone["id"], "changes": [{"Upsert": set}]})
    };
    for (i, name) in [
        "example.com",
        "example.com.",
        "a.b.example.com",
        "www.example.com.",
    ]
    .into_iter()
    .enumerate()
    {
        ok(
            &cloud,
            "dns.change-records",
            change(name),
            &format!("in-{i}"),
        )
        .await;
    }
    // A name that merely ends with the zone's name, without the dot, is another domain.
    for (i, name) in ["notexample.com", "example.org", "com", "example.com.evil"]
        .into_iter()
        .enumerate()
    {
        let e = err(
            &cloud,
            "dns.change-records",
            change(name),
            &format!("out-{i}"),
        )
        .await;
        assert_eq!(e.code, "invalid-change-batch", "{name}: {e:?}");
    }
}

/// Concurrent changes of one record set each see the state just before them (each DNS change is
/// decided in memory under one lock and written behind its answer), and a batch that names one
/// record set twice is refused.
#[tokio::test]
async fn concurrent_changes_of_one_record_set_each_see_the_state_before_them() {
    let (cloud, _clock, _dir) = cloud().await;
    let zone = example_zone(&cloud).await;
    let calls = (0..20).map(|i| {
        let cloud = cloud.clone();
        let request = json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": "race.example.com", "type_": "Txt", "ttl": 60, "values": [format!("v{i}")], "alias_target": null}}]});
        async move { cloud.call("dns.change-records", &request, &format!("race-{i}")).await }
    });
    let answers: Vec<Value> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|a| a.expect("every change succeeds"))
        .collect();
    assert_one_chain(&cloud, &zone, "race.example.com", &answers).await;

    let set = json!({"name": "twice.example.com", "type_": "Txt", "ttl": 60, "values": ["a"], "alias_target": null});
    let e = err(
        &cloud,
        "dns.change-records",
        json!({"zone_id": zone["id"], "changes": [{"Upsert": set}, {"Delete": set}]}),
        "twice",
    )
    .await;
    assert_eq!(e.code, "invalid-change-batch");
}

/// A DNS change is decided in memory and answered before its writes commit: the next
/// change of the record set sees it, polling it answers at once, the ordinary path and the
/// snapshot see it (they wait for the writes behind answers), and once those are committed a
/// simulation with an empty memory (a restart) gives its token the same answer and sees its
/// record.
#[tokio::test]
async fn a_change_decided_in_memory_is_seen_everywhere_and_survives_a_fresh_memory() {
    let (cloud, _clock, _dir) = cloud().await;
    let zone = ok(
        &cloud,
        "dns.find-zone",
        json!({"domain": "example.com"}),
        "",
    )
    .await;
    let set = |v: &str| json!({"name": "mem.example.com", "type_": "Txt", "ttl": 60, "values": [v], "alias_target": null});
    let change = |v: &str| json!({"zone_id": zone["id"], "changes": [{"Upsert": set(v)}]});
    let first = ok(&cloud, "dns.change-records", change("one"), "mem-1").await;
    let second = ok(&cloud, "dns.change-records", change("two"), "mem-2").await;
    assert_eq!(second["prior"][0]["values"], json!(["one"]));
    let poll = json!({"change_id": second["change_id"]});
    assert_eq!(
        ok(&cloud, "dns.get-change", poll.clone(), "").await,
        "Pending"
    );
    let records = ok(
        &cloud,
        "dns.list-records",
        json!({"zone_id": zone["id"], "name": "mem.example.com"}),
        "",
    )
    .await;
    assert_eq!(
        records[0]["values"],
        json!(["two"]),
        "the ordinary path sees it"
    );
    let snapshot = cloud.snapshot().await.unwrap();
    assert_eq!(snapshot["effects"], 2);

    let fresh = SimulatedCloud::new(
        &cloud.store,
        cloud.clock.clone(),
        SimulationSettings::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        ok(&fresh, "dns.change-records", change("one"), "mem-1").await,
        first,
        "a token answered before answers the same"
    );
    assert_eq!(ok(&fresh, "dns.get-change", poll, "").await, "Pending");
    let third = ok(&fresh, "dns.change-records", change("three"), "mem-3").await;
    assert_eq!(third["prior"][0]["values"], json!(["two"]));
    assert_eq!(fresh.snapshot().await.unwrap()["effects"], 3);
}

/// Changes decided in memory and changes on the ordinary path (here: those whose value fits a
/// latency-only fault rule) of one record set form one chain, one after the other and all at
/// once: the ordinary path waits for the writes behind earlier answers before it reads, and
/// memory is emptied after it, so neither side decides on a stale prior.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_and_ordinary_changes_of_one_record_set_form_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let cloud = SimulatedCloud::new(
        &store,
        Arc::new(ManualClock::new(1_000_000)),
        ordinary_changes(Some("ordinary-*")),
    )
    .await
    .unwrap();
    let zone = ok(
        &cloud,
        "dns.find-zone",
        json!({"domain": "example.com"}),
        "",
    )
    .await;
    let change = |name: &str, value: &str| json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": name, "type_": "Txt", "ttl": 60, "values": [value], "alias_target": null}}]});
    let prior = |answer: &Value| answer["prior"][0]["values"][0].as_str().map(str::to_owned);

    // One after the other: each change's prior is the value just before it.
    let values = [
        "fast-a",
        "fast-b",
        "ordinary-c",
        "fast-d",
        "ordinary-e",
        "ordinary-f",
        "fast-g",
    ];
    let mut before: Option<String> = None;
    for (i, value) in values.iter().enumerate() {
        let answer = ok(
            &cloud,
            "dns.change-records",
            change("seq.example.com", value),
            &format!("seq-{i}"),
        )
        .await;
        assert_eq!(prior(&answer), before, "change {value}");
        before = Some((*value).to_owned());
    }

    // All at once.
    let calls = (0..30).map(|i| {
        let cloud = cloud.clone();
        let value = if i % 3 == 0 {
            format!("ordinary-{i}")
        } else {
            format!("fast-{i}")
        };
        let request = change("mixed.example.com", &value);
        async move {
            cloud
                .call("dns.change-records", &request, &format!("mixed-{i}"))
                .await
        }
    });
    let answers: Vec<Value> = futures_util::future::join_all(calls.map(tokio::spawn))
        .await
        .into_iter()
        .map(|a| a.unwrap().expect("every change succeeds"))
        .collect();
    assert_one_chain(&cloud, &zone, "mixed.example.com", &answers).await;
    assert_eq!(cloud.snapshot().await.unwrap()["effects"], 37);
}

/// A change asked as the first use of its token skips the token's lookup. Were the
/// engine wrong about that, the token's primary key catches it: the second write behind an answer
/// for the token fails, the epoch moves (so no commit recording that answer lands), and the
/// token then answers what it answered the first time.
#[tokio::test]
async fn a_token_asked_first_twice_is_caught_by_its_key() {
    let (cloud, _clock, _dir) = cloud().await;
    let zone = ok(
        &cloud,
        "dns.find-zone",
        json!({"domain": "example.com"}),
        "",
    )
    .await;
    let request = json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": "first.example.com", "type_": "Txt", "ttl": 60, "values": ["one"], "alias_target": null}}]});
    let first = cloud
        .call_first("dns.change-records", &request, "first-1")
        .await
        .unwrap();
    assert_eq!(cloud.snapshot().await.unwrap()["effects"], 1);
    let epoch = cloud.store.behind_epoch();

    // A fresh memory (as after a restart) told, wrongly, that the token is new.
    let fresh = SimulatedCloud::new(
        &cloud.store,
        cloud.clock.clone(),
        SimulationSettings::default(),
    )
    .await
    .unwrap();
    let wrong = fresh
        .call_first("dns.change-records", &request, "first-1")
        .await
        .unwrap();
    cloud.store.settle_behind().await;
    assert_ne!(
        wrong["change_id"], first["change_id"],
        "decided again, unread"
    );
    assert_eq!(
        cloud.store.behind_epoch(),
        epoch.map(|e| e + 1),
        "its write failed on the key"
    );
    assert_eq!(
        ok(&fresh, "dns.change-records", request, "first-1").await,
        first,
        "the token answers what it answered first"
    );
    assert_eq!(fresh.snapshot().await.unwrap()["effects"], 1);
}

/// Two nodes on one PostgreSQL database, each deciding DNS changes in its own memory: a change
/// decided from a record set the other node has changed since fails its write (its guard finds
/// the record set changed), the node's epoch moves so nothing recording that answer commits, and
/// the change asked again under its token (the run's replay) is decided from the record set as
/// the other node left it. Always on PostgreSQL: several nodes are PostgreSQL's.
#[tokio::test]
async fn a_change_decided_from_a_record_set_another_node_changed_is_decided_again() {
    let nodes = two_nodes_on_one_postgres().await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let zone = ok(a, "dns.find-zone", json!({"domain": "example.com"}), "").await;
    let change = |v: &str| json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": "two.example.com", "type_": "Txt", "ttl": 60, "values": [v], "alias_target": null}}]});
    let values = |answer: &Value| answer["prior"][0]["values"].clone();

    ok(a, "dns.change-records", change("a1"), "a-1").await;
    a.store.settle_behind().await;
    let epoch = a
        .store
        .behind_epoch()
        .expect("the group writer writes behind answers");
    let by_b = ok(b, "dns.change-records", change("b1"), "b-1").await;
    assert_eq!(values(&by_b), json!(["a1"]), "b read what a committed");
    b.store.settle_behind().await;

    // a's memory still says a1.
    let stale = ok(a, "dns.change-records", change("a2"), "a-2").await;
    assert_eq!(values(&stale), json!(["a1"]), "decided in a's memory");
    a.store.settle_behind().await;
    assert_eq!(
        a.store.behind_epoch(),
        Some(epoch + 1),
        "its write found the record set changed"
    );
    assert_eq!(b.store.behind_epoch(), Some(epoch), "b's epoch is b's own");
    let records = json!({"zone_id": zone["id"], "name": "two.example.com"});
    assert_eq!(
        ok(a, "dns.list-records", records.clone(), "").await[0]["values"],
        json!(["b1"]),
        "the failed write changed nothing"
    );

    let again = ok(a, "dns.change-records", change("a2"), "a-2").await;
    assert_eq!(
        values(&again),
        json!(["b1"]),
        "decided again from b's value"
    );
    a.store.settle_behind().await;
    assert_eq!(a.store.behind_epoch(), Some(epoch + 1));
    assert_eq!(
        ok(a, "dns.list-records", records.clone(), "").await[0]["values"],
        json!(["a2"])
    );
    assert_eq!(a.snapshot().await.unwrap()["effects"], 3);

    // b's memory still says b1: a delete decided from it deletes nothing, and asked again it
    // is decided from a2.
    let delete = json!({"zone_id": zone["id"], "changes": [{"Delete": {"name": "two.example.com", "type_": "Txt"}}]});
    let stale = ok(b, "dns.change-records", delete.clone(), "b-2").await;
    assert_eq!(values(&stale), json!(["b1"]), "decided in b's memory");
    b.store.settle_behind().await;
    assert_eq!(
        b.store.behind_epoch(),
        Some(epoch + 1),
        "its delete found the record set changed"
    );
    assert_eq!(
        ok(a, "dns.list-records", records.clone(), "").await[0]["values"],
        json!(["a2"]),
        "the failed delete deleted nothing"
    );
    let again = ok(b, "dns.change-records", delete, "b-2").await;
    assert_eq!(
        values(&again),
        json!(["a2"]),
        "decided again from a's value"
    );
    b.store.settle_behind().await;
    assert_eq!(b.store.behind_epoch(), Some(epoch + 1));
    assert_eq!(ok(a, "dns.list-records", records, "").await, json!([]));
}

/// A zone is read whole the first time a change needs it, so a later change of another name
/// decides without reading: a record set already in the database is its prior, one nobody made
/// has none. A name another node adds after the zone was read is missing from memory; the
/// write's guard finds it, and the change asked again is decided from it. Always on PostgreSQL.
#[tokio::test]
async fn a_zone_read_whole_knows_every_name_and_one_added_by_another_node_is_caught() {
    let nodes = two_nodes_on_one_postgres().await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let zone = ok(a, "dns.find-zone", json!({"domain": "example.com"}), "").await;
    let change = |name: &str, v: &str| json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": name, "type_": "Txt", "ttl": 60, "values": [v], "alias_target": null}}]});
    let values = |answer: &Value| answer["prior"][0]["values"].clone();

    // In the database before a's memory holds anything of the zone.
    ok(
        b,
        "dns.change-records",
        change("old.example.com", "b0"),
        "b-0",
    )
    .await;
    b.store.settle_behind().await;
    ok(
        a,
        "dns.change-records",
        change("one.example.com", "a1"),
        "a-1",
    )
    .await;
    let old = ok(
        a,
        "dns.change-records",
        change("old.example.com", "a0"),
        "a-0",
    )
    .await;
    assert_eq!(
        values(&old),
        json!(["b0"]),
        "the zone's other names came with it"
    );
    a.store.settle_behind().await;
    let epoch = a.store.behind_epoch().unwrap();

    ok(
        b,
        "dns.change-records",
        change("new.example.com", "b1"),
        "b-1",
    )
    .await;
    b.store.settle_behind().await;
    let stale = ok(
        a,
        "dns.change-records",
        change("new.example.com", "a2"),
        "a-2",
    )
    .await;
    assert_eq!(
        stale["prior"],
        json!([]),
        "a's memory of the zone predates b's name"
    );
    a.store.settle_behind().await;
    assert_eq!(
        a.store.behind_epoch(),
        Some(epoch + 1),
        "the guard found b's record set"
    );
    let again = ok(
        a,
        "dns.change-records",
        change("new.example.com", "a2"),
        "a-2",
    )
    .await;
    assert_eq!(
        values(&again),
        json!(["b1"]),
        "decided again from b's value"
    );
    a.store.settle_behind().await;
    assert_eq!(a.store.behind_epoch(), Some(epoch + 1));
    let records = json!({"zone_id": zone["id"], "name": "new.example.com"});
    assert_eq!(
        ok(b, "dns.list-records", records, "").await[0]["values"],
        json!(["a2"])
    );
}

/// A change decided in memory creates a record set without its lock (its primary key claims it),
/// so one may be in flight on another node while the ordinary path, under the lock, reads it as
/// absent. The ordinary path's own creation then waits for it, finds it, and the batch is
/// decided again from it: its prior is the other node's record set, and its value replaces it.
/// Always on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_change_meeting_a_record_set_created_meanwhile_is_decided_again() {
    use sqlx::{Connection as _, Executor as _};
    let url = capstan_testdb::fresh_postgres_url().await;
    let store = capstan_store::Store::open(&url).await.unwrap();
    // Every change takes the ordinary path.
    let cloud = SimulatedCloud::new(
        &store,
        Arc::new(ManualClock::new(1_000_000)),
        ordinary_changes(None),
    )
    .await
    .unwrap();
    let zone = ok(
        &cloud,
        "dns.find-zone",
        json!({"domain": "example.com"}),
        "",
    )
    .await;

    // Another node's creation, in flight.
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    other.execute("BEGIN").await.unwrap();
    let theirs = json!({"name": "race.example.com", "type_": "Txt", "ttl": 60, "values": ["theirs"], "alias_target": null});
    sqlx::query(
        "INSERT INTO sim_records (zone_id, dns_key, name, type, body) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(zone["id"].as_str().unwrap())
    .bind("com.example.race")
    .bind("race.example.com")
    .bind("Txt")
    .bind(theirs.to_string())
    .execute(&mut other)
    .await
    .unwrap();
    let other_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut other)
        .await
        .unwrap();

    let mine = json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": "race.example.com", "type_": "Txt", "ttl": 60, "values": ["mine"], "alias_target": null}}]});
    let change = tokio::spawn({
        let cloud = cloud.clone();
        async move { cloud.call("dns.change-records", &mine, "mine-1").await }
    });
    // The ordinary path has read the record set as absent and waits on the other's row.
    let mut watcher = sqlx::PgConnection::connect(&url).await.unwrap();
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(other_pid)
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if blocked > 0 {
            break;
        }
        assert!(
            !change.is_finished(),
            "the change did not wait for the other's row"
        );
        tokio::task::yield_now().await;
    }
    other.execute("COMMIT").await.unwrap();

    let answer = change.await.unwrap().expect("the change succeeds");
    assert_eq!(
        answer["prior"],
        json!([theirs]),
        "decided again from the record set created meanwhile"
    );
    let records = json!({"zone_id": zone["id"], "name": "race.example.com"});
    assert_eq!(
        ok(&cloud, "dns.list-records", records, "").await[0]["values"],
        json!(["mine"])
    );
    assert_eq!(cloud.snapshot().await.unwrap()["effects"], 1);
}

/// Settings under which the DNS changes whose values fit `pattern` (all of them for `None`) take
/// the ordinary path: a latency-only fault rule fits them.
fn ordinary_changes(pattern: Option<&str>) -> SimulationSettings {
    SimulationSettings {
        faults: vec![FaultRule {
            op: "dns.change-records".to_owned(),
            pattern: pattern.map(str::to_owned),
            error: None,
            code: "unused".to_owned(),
            times: None,
            latency_ms: 0,
        }],
        ..SimulationSettings::default()
    }
}

/// Two simulated clouds, as two nodes have, on one fresh PostgreSQL schema.
async fn two_nodes_on_one_postgres() -> Vec<SimulatedCloud> {
    let url = capstan_testdb::fresh_postgres_url().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let store = capstan_store::Store::open(&url).await.unwrap();
        let cloud = SimulatedCloud::new(&store, clock.clone(), SimulationSettings::default())
            .await
            .unwrap();
        nodes.push(cloud);
    }
    nodes
}

/// The answers of concurrent changes of one record set form one chain: exactly one came first,
/// every other replaced a value another wrote, no value was replaced twice, and the value left is
/// one nobody replaced.
async fn assert_one_chain(cloud: &SimulatedCloud, zone: &Value, name: &str, answers: &[Value]) {
    let mut firsts = 0;
    let mut replaced = Vec::new();
    for answer in answers {
        match answer["prior"].as_array().map(Vec::as_slice) {
            Some([]) => firsts += 1,
            Some([one]) => replaced.push(one["values"][0].as_str().unwrap().to_owned()),
            other => panic!("one prior set at most: {other:?}"),
        }
    }
    assert_eq!(firsts, 1, "one change came first: {answers:?}");
    replaced.sort();
    replaced.dedup();
    assert_eq!(
        replaced.len(),
        answers.len() - 1,
        "each value replaced once: {replaced:?}"
    );
    let records = ok(
        cloud,
        "dns.list-records",
        json!({"zone_id": zone["id"], "name": name}),
        "",
    )
    .await;
    let last = records[0]["values"][0].as_str().unwrap().to_owned();
    assert!(
        !replaced.contains(&last),
        "the last value written is the one left"
    );
}

async fn ok(cloud: &SimulatedCloud, op: &str, request: Value, token: &str) -> Value {
    cloud
        .call(op, &request, token)
        .await
        .unwrap_or_else(|e| panic!("{op}: {e:?}"))
}

/// The seeded zone `example.com`.
async fn example_zone(cloud: &SimulatedCloud) -> Value {
    ok(cloud, "dns.find-zone", json!({"domain": "example.com"}), "").await
}

async fn err(cloud: &SimulatedCloud, op: &str, request: Value, token: &str) -> CapabilityError {
    cloud.call(op, &request, token).await.unwrap_err()
}

#[tokio::test]
async fn a_certificate_issues_once_its_validation_record_is_in_dns_and_a_cdn_needs_it_issued() {
    let (cloud, clock, _dir) = cloud().await;
    let cert = ok(
        &cloud,
        "certificates.request-certificate",
        json!({"domain": "shop.example.com", "subject_alternative_names": ["*.shop.example.com"]}),
        "c1",
    )
    .await;
    assert_eq!(cert["status"], "PendingValidation");
    assert_eq!(
        cert["validation_records"].as_array().unwrap().len(),
        1,
        "a wildcard validates on its parent"
    );
    let arn = cert["arn"].as_str().unwrap().to_owned();
    let spec = json!({"origin": "origin.example.net", "aliases": ["shop.example.com"], "certificate_arn": arn, "comment": "shop"});
    let refused = err(
        &cloud,
        "cdn.create-distribution",
        json!({"spec": spec}),
        "d0",
    )
    .await;
    assert_eq!(refused.code, "invalid-certificate");
    clock.advance(10_000);
    let still = ok(
        &cloud,
        "certificates.describe-certificate",
        json!({"arn": arn}),
        "",
    )
    .await;
    assert_eq!(
        still["status"], "PendingValidation",
        "no validation record yet"
    );
    let record = cert["validation_records"][0].clone();
    ok(
        &cloud,
        "dns.change-records",
        json!({"zone_id": "ZEXAMPLE-COM", "changes": [{"Upsert": record}]}),
        "r1",
    )
    .await;
    let issued = ok(
        &cloud,
        "certificates.describe-certificate",
        json!({"arn": arn}),
        "",
    )
    .await;
    assert_eq!(issued["status"], "Issued");
    let found = ok(
        &cloud,
        "certificates.find-certificates",
        json!({"domain": "www.shop.example.com"}),
        "",
    )
    .await;
    assert_eq!(found[0]["arn"], arn.as_str());

    let d = ok(
        &cloud,
        "cdn.create-distribution",
        json!({"spec": spec}),
        "d1",
    )
    .await;
    assert_eq!(d["status"], "InProgress");
    let taken = err(
        &cloud,
        "cdn.create-distribution",
        json!({"spec": spec}),
        "d2",
    )
    .await;
    assert_eq!(taken.code, "alias-in-use");
    clock.advance(3_000);
    let id = d["id"].as_str().unwrap();
    assert_eq!(
        ok(&cloud, "cdn.get-distribution", json!({"id": id}), "").await["status"],
        "Deployed"
    );
    let by_alias = ok(
        &cloud,
        "cdn.find-distribution-by-alias",
        json!({"alias": "SHOP.example.com"}),
        "",
    )
    .await;
    assert_eq!(by_alias["id"], id);
    let in_use = err(
        &cloud,
        "certificates.delete-certificate",
        json!({"arn": arn}),
        "x1",
    )
    .await;
    assert_eq!(in_use.code, "resource-in-use");
    let update = ok(&cloud, "cdn.update-distribution", json!({"id": id, "spec": {"origin": "o2", "aliases": [], "certificate_arn": null, "comment": ""}}), "d3").await;
    assert_eq!(update["before"]["spec"]["origin"], "origin.example.net");
    assert_eq!(update["after"]["status"], "InProgress");
    ok(
        &cloud,
        "certificates.delete-certificate",
        json!({"arn": arn}),
        "x2",
    )
    .await;
}

#[tokio::test]
async fn a_cdn_checks_its_own_certificates_and_takes_another_provider_s_as_given() {
    let (cloud, _clock, _dir) = cloud().await;
    let spec = |arn: &str| json!({"spec": {"origin": "o.example.net", "aliases": ["a.example.com"], "certificate_arn": arn, "comment": ""}});
    let missing = err(
        &cloud,
        "cdn.create-distribution",
        spec("arn:sim:acm::certificate/missing"),
        "t1",
    )
    .await;
    assert_eq!(missing.code, "invalid-certificate");
    let acme = "https://ca.example.net/acme/order/1/2";
    let made = ok(&cloud, "cdn.create-distribution", spec(acme), "t2").await;
    assert_eq!(made["spec"]["certificate_arn"], acme);
}

#[tokio::test]
async fn maps_keys_fill_up_registrar_functions_and_tickets_behave() {
    let (cloud, _clock, _dir) = cloud().await;
    let keys = ok(&cloud, "maps.list-keys", json!({}), "").await;
    let embed = keys
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == "embed")
        .unwrap()
        .clone();
    let room =
        embed["capacity"].as_u64().unwrap() - embed["referrers"].as_array().unwrap().len() as u64;
    for i in 0..room {
        let r = ok(
            &cloud,
            "maps.add-referrer",
            json!({"key_id": "embed", "referrer": format!("*.d{i}.test/*")}),
            &format!("m{i}"),
        )
        .await;
        assert_eq!(r["changed"], true);
    }
    let again = ok(
        &cloud,
        "maps.add-referrer",
        json!({"key_id": "embed", "referrer": "*.d0.test/*"}),
        "m-again",
    )
    .await;
    assert_eq!(
        again["changed"], false,
        "a present referrer changes nothing"
    );
    let full = err(
        &cloud,
        "maps.add-referrer",
        json!({"key_id": "embed", "referrer": "*.more.test/*"}),
        "m-full",
    )
    .await;
    assert_eq!(full.code, "capacity-exhausted");
    assert!(!full.is_transient());

    let mine = ok(
        &cloud,
        "registrar.check-domain",
        json!({"name": "example.com"}),
        "",
    )
    .await;
    assert_eq!(
        (mine["registered"].clone(), mine["owned"].clone()),
        (json!(true), json!(true))
    );
    let free = ok(
        &cloud,
        "registrar.check-domain",
        json!({"name": "new.test"}),
        "",
    )
    .await;
    assert_eq!(free["available"], true);
    let reg = ok(
        &cloud,
        "registrar.register-domain",
        json!({"name": "new.test", "years": 1}),
        "g1",
    )
    .await;
    assert!(reg["registration_id"].as_str().unwrap().starts_with("REG-"));
    assert_eq!(
        ok(
            &cloud,
            "registrar.check-domain",
            json!({"name": "new.test"}),
            ""
        )
        .await["owned"],
        true
    );

    // Delegation of a domain this account holds: read, changed, changed back.
    let held = ok(
        &cloud,
        "registrar.get-domain",
        json!({"name": "new.test"}),
        "",
    )
    .await;
    assert_eq!(
        held["name_servers"],
        json!(["ns1.sim.capstan.dev", "ns2.sim.capstan.dev"])
    );
    let delegated = ok(
        &cloud,
        "registrar.set-name-servers",
        json!({"name": "new.test", "name_servers": ["NS-1.awsdns-01.org.", "ns-2.awsdns-02.com"]}),
        "g2",
    )
    .await;
    assert_eq!(delegated["before"], held["name_servers"]);
    assert_eq!(
        delegated["after"],
        json!(["ns-1.awsdns-01.org", "ns-2.awsdns-02.com"])
    );
    assert_eq!(
        ok(
            &cloud,
            "registrar.get-domain",
            json!({"name": "new.test"}),
            ""
        )
        .await["name_servers"],
        delegated["after"]
    );
    assert_eq!(
        ok(
            &cloud,
            "registrar.get-domain",
            json!({"name": "nobody.test"}),
            ""
        )
        .await,
        Value::Null
    );
    let one = err(
        &cloud,
        "registrar.set-name-servers",
        json!({"name": "new.test", "name_servers": ["ns1.example.net"]}),
        "g3",
    )
    .await;
    assert_eq!(one.code, "invalid-request");

    let v2 = ok(
        &cloud,
        "functions.publish-version",
        json!({"function_name": "edge-router", "code_sha256": "ab".repeat(32)}),
        "f1",
    )
    .await;
    assert_eq!(v2["version"], "2");
    let same = ok(
        &cloud,
        "functions.publish-version",
        json!({"function_name": "edge-router", "code_sha256": "ab".repeat(32)}),
        "f2",
    )
    .await;
    assert_eq!(
        same["version"], "2",
        "publishing unchanged code returns the latest version"
    );
    let shift = ok(
        &cloud,
        "functions.update-alias",
        json!({"function_name": "edge-router", "alias": "live", "version": "2"}),
        "f3",
    )
    .await;
    assert_eq!(
        (
            shift["before"]["version"].clone(),
            shift["after"]["version"].clone()
        ),
        (json!("1"), json!("2"))
    );
    let busy = err(
        &cloud,
        "functions.delete-version",
        json!({"function_name": "edge-router", "version": "2"}),
        "f4",
    )
    .await;
    assert_eq!(busy.code, "resource-in-use");
    // A canary: version 1 takes a share of the traffic while version 2 is the alias's own; a
    // version that takes a share is in use too, and weights beyond the traffic are refused.
    let canary = ok(
        &cloud,
        "functions.route-alias",
        json!({"function_name": "edge-router", "alias": "live", "version": "2",
            "routing": [{"version": "1", "weight": 0.25}]}),
        "f5",
    )
    .await;
    assert_eq!(canary["before"]["routing"], json!([]));
    assert_eq!(
        canary["after"]["routing"],
        json!([{"version": "1", "weight": 0.25}])
    );
    let got = ok(
        &cloud,
        "functions.get-alias",
        json!({"function_name": "edge-router", "alias": "live"}),
        "",
    )
    .await;
    assert_eq!(got, canary["after"]);
    let routed_to = err(
        &cloud,
        "functions.delete-version",
        json!({"function_name": "edge-router", "version": "1"}),
        "f6",
    )
    .await;
    assert_eq!(routed_to.code, "resource-in-use");
    for routing in [
        json!([{"version": "1", "weight": 1.5}]),
        json!([{"version": "2", "weight": 0.1}]),
    ] {
        let refused = err(
            &cloud,
            "functions.route-alias",
            json!({"function_name": "edge-router", "alias": "live", "version": "2", "routing": routing}),
            "f7",
        )
        .await;
        assert_eq!(refused.code, "invalid-request", "{routing}");
    }
    // Promoting ends the canary; the answer keeps it in `before`, for a rollback.
    let promoted = ok(
        &cloud,
        "functions.update-alias",
        json!({"function_name": "edge-router", "alias": "live", "version": "2"}),
        "f8",
    )
    .await;
    assert_eq!(promoted["before"], canary["after"]);
    assert_eq!(promoted["after"]["routing"], json!([]));
    assert_eq!(
        ok(
            &cloud,
            "functions.probe",
            json!({"function_name": "edge-router", "alias": "live"}),
            ""
        )
        .await,
        true
    );

    assert_eq!(
        ok(&cloud, "ticketing.get-ticket", json!({"id": "NOPE-1"}), "").await,
        Value::Null
    );
    let c = ok(
        &cloud,
        "ticketing.add-comment",
        json!({"id": "OPS-1", "body": "done"}),
        "t1",
    )
    .await;
    assert_eq!(c["comment_id"], "OPS-1-C1");
    let t = ok(
        &cloud,
        "ticketing.transition-ticket",
        json!({"id": "OPS-1", "status": "resolved"}),
        "t2",
    )
    .await;
    assert_eq!(
        (t["from"].clone(), t["to"].clone()),
        (json!("open"), json!("resolved"))
    );
    let snapshot = cloud.snapshot().await.unwrap();
    let ticket = snapshot["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "OPS-1")
        .unwrap()
        .clone();
    assert_eq!(ticket["comments"], json!(["done"]));
}

#[tokio::test]
async fn faults_fire_for_their_operation_and_pattern_and_only_n_times() {
    let dir = tempfile::tempdir().unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let settings = SimulationSettings {
        faults: vec![
            FaultRule {
                op: "maps.*".into(),
                pattern: Some("*.flaky.test*".into()),
                error: Some(FaultKind::Transient),
                code: "throttled".into(),
                times: Some(2),
                latency_ms: 0,
            },
            FaultRule {
                op: "ticketing.get-ticket".into(),
                pattern: Some("BROKEN-*".into()),
                error: Some(FaultKind::Permanent),
                code: "ticketing-down".into(),
                times: None,
                latency_ms: 0,
            },
        ],
        ..SimulationSettings::default()
    };
    let cloud = SimulatedCloud::new(&store, Arc::new(ManualClock::new(0)), settings)
        .await
        .unwrap();
    let request = json!({"key_id": "web", "referrer": "*.flaky.test/*"});
    for _ in 0..2 {
        let e = err(&cloud, "maps.add-referrer", request.clone(), "k1").await;
        assert_eq!((e.code.as_str(), e.is_transient()), ("throttled", true));
    }
    assert_eq!(
        ok(&cloud, "maps.add-referrer", request, "k1").await["changed"],
        true,
        "the third call goes through"
    );
    ok(
        &cloud,
        "maps.add-referrer",
        json!({"key_id": "web", "referrer": "*.solid.test/*"}),
        "k2",
    )
    .await;
    for _ in 0..3 {
        assert_eq!(
            err(
                &cloud,
                "ticketing.get-ticket",
                json!({"id": "BROKEN-7"}),
                ""
            )
            .await
            .code,
            "ticketing-down"
        );
    }
    assert_eq!(
        ok(&cloud, "ticketing.get-ticket", json!({"id": "OPS-2"}), "").await["id"],
        "OPS-2"
    );
}

#[tokio::test]
async fn a_seed_file_replaces_the_demo_world_and_bad_seeds_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
        .await
        .unwrap();
    let path = dir.path().join("seed.json");
    std::fs::write(&path, json!({
        "zones": ["corp.test"],
        "records": [{"zone": "corp.test", "name": "www.corp.test", "type": "CNAME", "values": ["x.example.net"]}],
        "domains": [{"name": "taken.test", "owned": false}],
        "certificates": [{"domain": "corp.test", "subjectAlternativeNames": ["*.corp.test"], "arn": "arn:sim:acm::certificate/corp"}],
        "mapsKeys": [{"id": "full", "displayName": "Full key", "capacity": 0}],
        "tickets": [{"id": "INFRA-9", "title": "t"}],
        "distributions": [{"id": "EOLD", "origin": "old.example.net", "aliases": ["www.corp.test"], "certificateArn": "arn:sim:acm::certificate/corp"}]
    }).to_string()).unwrap();
    let settings = SimulationSettings {
        seed_file: Some(path),
        ..SimulationSettings::default()
    };
    let cloud = SimulatedCloud::new(&store, Arc::new(ManualClock::new(0)), settings)
        .await
        .unwrap();
    let snap = cloud.snapshot().await.unwrap();
    assert_eq!(
        snap["dns"]["zones"],
        json!([{"id": "ZCORP-TEST", "name": "corp.test"}])
    );
    assert_eq!(snap["dns"]["records"][0]["recordSet"]["type_"], "Cname");
    assert_eq!(snap["certificates"][0]["status"], "Issued");
    assert_eq!(
        snap["certificates"][0]["in_use_by"],
        json!(["EOLD"]),
        "a seeded distribution uses it"
    );
    assert_eq!(snap["distributions"][0]["status"], "Deployed");
    assert_eq!(
        ok(
            &cloud,
            "registrar.check-domain",
            json!({"name": "taken.test"}),
            ""
        )
        .await["available"],
        false
    );
    assert_eq!(
        err(
            &cloud,
            "registrar.register-domain",
            json!({"name": "taken.test", "years": 1}),
            "r"
        )
        .await
        .code,
        "domain-unavailable"
    );
    assert_eq!(
        err(
            &cloud,
            "maps.add-referrer",
            json!({"key_id": "full", "referrer": "a"}),
            "m"
        )
        .await
        .code,
        "capacity-exhausted"
    );

    let bad = Seed {
        records: vec![SeedRecordLike::bad()],
        ..Seed::default()
    };
    let e = cloud.seed(&bad).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("type must be A, AAAA, CNAME, TXT, MX or CAA"),
        "{e}"
    );
}

struct SeedRecordLike;
impl SeedRecordLike {
    fn bad() -> super::SeedRecord {
        super::SeedRecord {
            zone: "corp.test".into(),
            name: "x.corp.test".into(),
            record_type: "SRV".into(),
            ttl: None,
            values: vec![],
        }
    }
}

#[test]
fn globs_match_runs_of_characters() {
    assert!(glob("*.flaky.test*", "*.flaky.test/*"));
    assert!(glob("BROKEN-*", "broken-7"));
    assert!(!glob("a*b", "ac"));
    assert!(glob("*", ""));
}

#[tokio::test]
async fn a_token_is_bound_to_its_call_in_memory_and_in_the_database() {
    let (cloud, _clock, _dir) = cloud().await;
    let zone = ok(
        &cloud,
        "dns.find-zone",
        json!({"domain": "example.com"}),
        "",
    )
    .await;
    let change = |v: &str| json!({"zone_id": zone["id"], "changes": [{"Upsert": {"name": "bound.example.com", "type_": "Txt", "ttl": 60, "values": [v], "alias_target": null}}]});
    let first = ok(&cloud, "dns.change-records", change("one"), "bound-1").await;
    let refused = |answer: Result<Value, CapabilityError>| {
        let e = answer.expect_err("another call under a used token is refused");
        assert!(e.is_token_reused(), "{e:?}");
    };
    // Decided in memory, written behind: the fast path steps aside and the ordinary one refuses.
    refused(
        cloud
            .call("dns.change-records", &change("two"), "bound-1")
            .await,
    );
    refused(
        cloud
            .call(
                "dns.delete-zone",
                &json!({"zone_id": zone["id"]}),
                "bound-1",
            )
            .await,
    );
    // From the database, with a fresh memory.
    let fresh = SimulatedCloud::new(
        &cloud.store,
        cloud.clock.clone(),
        SimulationSettings::default(),
    )
    .await
    .unwrap();
    refused(
        fresh
            .call("dns.change-records", &change("two"), "bound-1")
            .await,
    );
    assert_eq!(
        ok(&fresh, "dns.change-records", change("one"), "bound-1").await,
        first,
        "the same call under its token is answered again"
    );
    let records = ok(
        &fresh,
        "dns.list-records",
        json!({"zone_id": zone["id"], "name": "bound.example.com"}),
        "",
    )
    .await;
    assert_eq!(
        records[0]["values"],
        json!(["one"]),
        "the refused calls changed nothing"
    );
    assert_eq!(fresh.snapshot().await.unwrap()["effects"], 1);
}

/// Record sets stored before `sim_records` was keyed in DNS order get the key the simulator
/// computes (`dns::dns_key`), on both backends: the migrations reverse the labels in SQL.
#[tokio::test]
async fn the_migrations_key_stored_record_sets_as_the_simulator_does() {
    const NAMES: [&str; 7] = [
        "example.com",
        "www.example.com",
        "www.example.com.",
        "_acme-challenge.www.example.com",
        "a..b",
        "com",
        "",
    ];
    /// The table as it was, its rows, then `migration`; what it left, sorted (the two servers
    /// order names by their own collations).
    async fn migrate(url: &str, migration: &'static str) -> Vec<(String, String)> {
        use sqlx::{Connection as _, Executor as _};
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(url).await.unwrap();
        conn.execute("CREATE TABLE sim_records (zone_id TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (zone_id, name, type))")
            .await
            .unwrap();
        for name in NAMES {
            sqlx::query(
                "INSERT INTO sim_records (zone_id, name, type, body) VALUES ($1, $2, 'Txt', '{}')",
            )
            .bind("z")
            .bind(name)
            .execute(&mut conn)
            .await
            .unwrap();
        }
        conn.execute(migration).await.unwrap();
        let mut rows: Vec<(String, String)> =
            sqlx::query_as("SELECT name, dns_key FROM sim_records")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        rows.sort();
        rows
    }

    let mut expected: Vec<(String, String)> = NAMES
        .iter()
        .map(|name| (name.to_string(), dns::dns_key(name)))
        .collect();
    expected.sort();
    let sqlite = migrate(
        "sqlite::memory:",
        include_str!("../../../store/migrations/sqlite/0020_sim_records_dns_order.sql"),
    )
    .await;
    assert_eq!(sqlite, expected);
    let postgres = migrate(
        &capstan_testdb::fresh_postgres_url().await,
        include_str!("../../../store/migrations/postgres/0016_sim_records_dns_order.sql"),
    )
    .await;
    assert_eq!(postgres, expected);
    assert_eq!(
        dns::dns_key("_acme-challenge.www.example.com"),
        "com.example.www._acme-challenge"
    );
    assert_eq!(dns::dns_key("www.example.com."), ".com.example.www");
}
