//! DNS by RFC 2136 dynamic update, every message signed with TSIG (RFC 8945): BIND, Knot,
//! PowerDNS and any primary that accepts signed updates.
//!
//! - **Zones** are the ones the operator lists (`zones`): the protocol cannot create or delete
//!   them, and a zone's id is its name.
//! - **Reads** query the primary over TCP for each record type the WIT knows, so a read sees
//!   exactly what the server serves.
//! - **A change** is one UPDATE message: for each record set, a prerequisite that it is exactly
//!   as read (RFC 2136 §2.4.2, or §2.4.3 "does not exist"), a delete of the set and the records
//!   of its new value. The server applies all of it or none; a set changed by someone else in
//!   between fails the prerequisite (a transient `conflict`: the retry reads again).
//! - **Tokens**: the prior record sets are written to the token ledger before the update is sent.
//!   A repeated token answers the recorded receipt; a token whose intent is recorded but whose
//!   answer is not (a crash) finds the change applied (answer with the recorded prior) or not
//!   (send it again under the same prerequisites), so the receipt always holds the state before
//!   this change, never the change's own result.
//! - **Convergence**: a change is in sync once the primary answers every record set as the change
//!   left it, and every server of `wait_for` serves the primary's SOA serial taken right after it.
//! - **Alias records** (an A record that follows a CDN distribution) do not exist in the protocol:
//!   a permanent `alias-unsupported` error names Route 53 as the provider that has them.

use crate::ledger::{Entry, Ledger, storage};
use crate::model::{self, Change, ChangeReceipt, ChangeStatus, RecordSet, RecordType, arg};
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use futures_util::StreamExt as _;
use hickory_client::client::Client;
use hickory_client::proto::ProtoError;
use hickory_client::proto::dnssec::rdata::tsig::TsigAlgorithm;
use hickory_client::proto::dnssec::tsig::TSigner;
use hickory_client::proto::op::{
    Message, MessageFinalizer, MessageType, MessageVerifier, OpCode, Query, ResponseCode,
    UpdateMessage,
};
use hickory_client::proto::rr::rdata::TXT;
use hickory_client::proto::rr::{DNSClass, Name, RData, Record, RecordType as WireType};
use hickory_client::proto::runtime::TokioRuntimeProvider;
use hickory_client::proto::serialize::txt::RDataParser as _;
use hickory_client::proto::tcp::TcpClientStream;
use hickory_client::proto::xfer::{DnsHandle, DnsRequest, DnsRequestOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::Row;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// `[providers.dns] kind = "rfc2136"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2136Settings {
    /// The primary that accepts updates: `host:port` (port 53 when left out).
    pub server: String,
    /// The TSIG key's name as the server knows it.
    pub tsig_key_name: String,
    /// `hmac-sha256` (default), `hmac-sha384` or `hmac-sha512`.
    #[serde(default = "default_algorithm")]
    pub tsig_algorithm: String,
    /// A file holding the key's secret, base64 as BIND's and Knot's key files write it.
    #[serde(default)]
    pub tsig_secret_file: Option<PathBuf>,
    /// Or the name of an environment variable holding it.
    #[serde(default)]
    pub tsig_secret_env: Option<String>,
    /// The zones the key may update; `find-zone` answers the longest that covers a name.
    pub zones: Vec<String>,
    /// Secondaries (`host:port`) that must serve the change too before it is in sync, compared
    /// by SOA serial.
    #[serde(default)]
    pub wait_for: Vec<String>,
    /// TTL of record sets that do not give one.
    #[serde(default = "default_ttl")]
    pub default_ttl: u32,
    /// How long one DNS exchange may take.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_algorithm() -> String {
    "hmac-sha256".to_owned()
}
fn default_ttl() -> u32 {
    300
}
fn default_timeout_ms() -> u64 {
    5_000
}

/// The RFC 2136 provider of the `dns` capability.
#[derive(Clone)]
pub struct Rfc2136 {
    server: String,
    key_name: String,
    signer: Arc<AlwaysSign>,
    zones: Vec<Name>,
    wait_for: Vec<String>,
    default_ttl: u32,
    timeout: Duration,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Rfc2136 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rfc2136")
            .field("server", &self.server)
            .field("key", &self.key_name)
            .finish_non_exhaustive()
    }
}

type Answer = Result<Value, CapabilityError>;

fn unavailable(server: &str, e: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::transient("unavailable", format!("DNS server {server}: {e}"))
}

fn name(text: &str) -> Result<Name, CapabilityError> {
    let mut n = Name::from_str(&model::bare(text)).map_err(|e| {
        CapabilityError::permanent(
            "invalid-change-batch",
            format!("`{text}` is not a DNS name: {e}"),
        )
    })?;
    n.set_fqdn(true);
    Ok(n)
}

fn wire_type(t: RecordType) -> WireType {
    match t {
        RecordType::A => WireType::A,
        RecordType::Aaaa => WireType::AAAA,
        RecordType::Cname => WireType::CNAME,
        RecordType::Txt => WireType::TXT,
        RecordType::Mx => WireType::MX,
        RecordType::Caa => WireType::CAA,
    }
}

/// A value in presentation format as record data. A TXT value is one string (split into
/// 255-byte chunks on the wire), not zone-file text.
fn rdata(t: RecordType, value: &str) -> Result<RData, CapabilityError> {
    if t == RecordType::Txt {
        let chunks = value
            .as_bytes()
            .chunks(255)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>();
        return Ok(RData::TXT(TXT::new(if chunks.is_empty() {
            vec![String::new()]
        } else {
            chunks
        })));
    }
    let text = match t {
        // Relative names would be read against the root: make them absolute.
        RecordType::Cname if !value.ends_with('.') => format!("{value}."),
        _ => value.to_owned(),
    };
    RData::try_from_str(wire_type(t), &text).map_err(|e| {
        CapabilityError::permanent(
            "invalid-change-batch",
            format!("`{value}` is not {} data: {e}", t.mnemonic()),
        )
    })
}

/// Record data back in the presentation format [`rdata`] reads.
fn value_of(data: &RData) -> String {
    match data {
        RData::TXT(txt) => txt
            .txt_data()
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect(),
        other => other.to_string(),
    }
}

/// The comparable form of a record set's values: parsed and printed again, sorted.
fn canonical(t: RecordType, values: &[String]) -> Result<Vec<String>, CapabilityError> {
    let mut out = values
        .iter()
        .map(|v| rdata(t, v).map(|d| value_of(&d).to_ascii_lowercase()))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// What an update answered, as a capability error when it is not NOERROR.
fn refusal(code: ResponseCode, key: &str, zone: &Name) -> CapabilityError {
    match code {
        ResponseCode::NotAuth
        | ResponseCode::BADKEY
        | ResponseCode::BADSIG
        | ResponseCode::BADTIME => CapabilityError::permanent(
            "tsig-rejected",
            format!(
                "the DNS server rejected TSIG key `{key}` for zone {zone} ({code}): check providers.dns.tsig_key_name, the secret and the server's key"
            ),
        ),
        ResponseCode::Refused => CapabilityError::permanent(
            "update-refused",
            format!(
                "the DNS server refused updates of zone {zone} under TSIG key `{key}`: check its update ACL"
            ),
        ),
        ResponseCode::NotZone => CapabilityError::permanent(
            "invalid-change-batch",
            format!("a name of the change is not in zone {zone}"),
        ),
        ResponseCode::YXRRSet
        | ResponseCode::NXRRSet
        | ResponseCode::YXDomain
        | ResponseCode::NXDomain => CapabilityError::transient(
            "conflict",
            format!(
                "record sets of zone {zone} changed between the read and the update ({code}); the retry reads them again"
            ),
        ),
        ResponseCode::ServFail => CapabilityError::transient(
            "unavailable",
            format!("the DNS server failed to update zone {zone} (SERVFAIL)"),
        ),
        other => CapabilityError::permanent(
            "update-failed",
            format!("the DNS server answered {other} to the update of zone {zone}"),
        ),
    }
}

/// A DNS exchange that failed before an answer: a response whose TSIG does not verify (a wrong
/// key or secret: the server answers unsigned) is permanent, anything else is the network.
fn exchange_error(server: &str, key: &str, e: impl std::fmt::Display) -> CapabilityError {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if lower.contains("tsig") || lower.contains("signature") || lower.contains("wrong key") {
        CapabilityError::permanent(
            "tsig-rejected",
            format!(
                "the answer of DNS server {server} does not verify under TSIG key `{key}` ({text}): check providers.dns.tsig_key_name, the secret and the server's key"
            ),
        )
    } else {
        unavailable(server, text)
    }
}

/// TSIG on every message, queries included (hickory signs only updates and transfers by
/// default): a wrong key then fails the first read, before anything is recorded or sent.
struct AlwaysSign(TSigner);

impl MessageFinalizer for AlwaysSign {
    fn finalize_message(
        &self,
        message: &Message,
        current_time: u32,
    ) -> Result<(Vec<Record>, Option<MessageVerifier>), ProtoError> {
        self.0.finalize_message(message, current_time)
    }

    fn should_finalize_message(&self, _: &Message) -> bool {
        true
    }
}

/// What the ledger keeps for a change between its intent and its answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Intent {
    change_id: String,
    prior: Vec<RecordSet>,
}

impl Rfc2136 {
    pub fn new(s: &Rfc2136Settings, node: &Node) -> Result<Self, SettingsError> {
        let dns = Capability::Dns;
        let secret = crate::secret::read(
            dns,
            "tsig_secret",
            s.tsig_secret_file.as_ref(),
            s.tsig_secret_env.as_deref(),
        )?;
        let key = base64_decode(&secret).ok_or_else(|| {
            SettingsError::new(dns, "tsig_secret_file", "the TSIG secret is not base64")
        })?;
        let algorithm = match s.tsig_algorithm.to_ascii_lowercase().as_str() {
            "hmac-sha256" => TsigAlgorithm::HmacSha256,
            "hmac-sha384" => TsigAlgorithm::HmacSha384,
            "hmac-sha512" => TsigAlgorithm::HmacSha512,
            other => {
                return Err(SettingsError::new(
                    dns,
                    "tsig_algorithm",
                    format!("`{other}` is not one of hmac-sha256, hmac-sha384, hmac-sha512"),
                ));
            }
        };
        let key_name = Name::from_str(&s.tsig_key_name)
            .map_err(|e| SettingsError::new(dns, "tsig_key_name", e.to_string()))?;
        let signer = TSigner::new(key, algorithm, key_name, 300)
            .map_err(|e| SettingsError::new(dns, "tsig_algorithm", e.to_string()))?;
        if s.server.trim().is_empty() {
            return Err(SettingsError::new(dns, "server", "is required (host:port)"));
        }
        if s.zones.is_empty() {
            return Err(SettingsError::new(
                dns,
                "zones",
                "list the zones the key may update",
            ));
        }
        let zones = s
            .zones
            .iter()
            .map(|z| name(z).map_err(|e| SettingsError::new(dns, "zones", e.message)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            server: with_port(&s.server),
            key_name: s.tsig_key_name.clone(),
            signer: Arc::new(AlwaysSign(signer)),
            zones,
            wait_for: s.wait_for.iter().map(|w| with_port(w)).collect(),
            default_ttl: s.default_ttl,
            timeout: Duration::from_millis(s.timeout_ms.max(1)),
            ledger: Ledger::new(node.store.writer().clone(), "rfc2136"),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    /// A TCP connection to `server`, signing every message with the key when `signed`.
    async fn connect(&self, server: &str, signed: bool) -> Result<Client, CapabilityError> {
        let signer: Option<Arc<dyn MessageFinalizer>> = if signed {
            Some(self.signer.clone())
        } else {
            None
        };
        connect(server, self.timeout, signer).await
    }

    async fn exchange(
        &self,
        client: &Client,
        server: &str,
        message: Message,
    ) -> Result<Message, CapabilityError> {
        let mut responses = client.send(DnsRequest::new(message, DnsRequestOptions::default()));
        match responses.next().await {
            Some(Ok(response)) => Ok(response.into_message()),
            Some(Err(e)) => Err(exchange_error(server, &self.key_name, e)),
            None => Err(unavailable(
                server,
                "the connection closed without an answer",
            )),
        }
    }

    /// The records of `name`/`t` as `server` answers them.
    async fn query(
        &self,
        client: &Client,
        server: &str,
        owner: &Name,
        t: WireType,
    ) -> Result<Vec<Record>, CapabilityError> {
        let answer = self
            .exchange(client, server, query_message(owner, t))
            .await?;
        match answer.response_code() {
            ResponseCode::NoError | ResponseCode::NXDomain => Ok(answer
                .answers()
                .iter()
                .filter(|r| r.record_type() == t && r.name() == owner)
                .cloned()
                .collect()),
            ResponseCode::NotAuth | ResponseCode::Refused => {
                Err(refusal(answer.response_code(), &self.key_name, owner))
            }
            other => Err(unavailable(
                server,
                format!("answered {other} to a query of {owner}"),
            )),
        }
    }

    /// The record set `name`/`t` as the primary serves it, if any.
    async fn read_set(
        &self,
        client: &Client,
        owner: &str,
        t: RecordType,
    ) -> Result<Option<RecordSet>, CapabilityError> {
        let records = self
            .query(client, &self.server, &name(owner)?, wire_type(t))
            .await?;
        if records.is_empty() {
            return Ok(None);
        }
        Ok(Some(RecordSet {
            name: model::bare(owner),
            type_: t,
            ttl: records.first().map(Record::ttl),
            values: records.iter().map(|r| value_of(r.data())).collect(),
            alias_target: None,
        }))
    }

    async fn soa_serial(
        &self,
        client: &Client,
        server: &str,
        zone: &Name,
    ) -> Result<u32, CapabilityError> {
        let records = self.query(client, server, zone, WireType::SOA).await?;
        records
            .iter()
            .find_map(|r| match r.data() {
                RData::SOA(soa) => Some(soa.serial()),
                _ => None,
            })
            .ok_or_else(|| unavailable(server, format!("no SOA record for {zone}")))
    }

    /// The configured zone that serves `domain` (the longest suffix).
    fn zone_of(&self, domain: &str) -> Option<&Name> {
        let n = name(domain).ok()?;
        self.zones
            .iter()
            .filter(|z| z.zone_of(&n))
            .max_by_key(|z| z.num_labels())
    }

    fn zone(&self, zone_id: &str) -> Result<Name, CapabilityError> {
        let n = name(zone_id)?;
        if self.zones.contains(&n) {
            Ok(n)
        } else {
            Err(CapabilityError::permanent(
                "not-found",
                format!("zone {zone_id} is not in providers.dns.zones"),
            ))
        }
    }

    async fn list_records(&self, request: &Value) -> Answer {
        let zone = self.zone(&arg::<String>(request, "zone_id")?)?;
        let owner: String = arg(request, "name")?;
        if !zone.zone_of(&name(&owner)?) {
            return Ok(json!([]));
        }
        let client = self.connect(&self.server, true).await?;
        let mut sets = Vec::new();
        for t in RecordType::ALL {
            if let Some(set) = self.read_set(&client, &owner, t).await? {
                sets.push(set);
            }
        }
        serde_json::to_value(sets).map_err(storage)
    }

    /// Checks a batch as RFC 2136 can carry it: names in the zone, no alias, each set once.
    fn check(&self, zone: &Name, changes: &[Change]) -> Result<(), CapabilityError> {
        for (i, change) in changes.iter().enumerate() {
            let set = change.set();
            if set.alias_target.is_some() {
                return Err(CapabilityError::permanent(
                    "alias-unsupported",
                    format!(
                        "RFC 2136 has no alias records ({} {} → a CDN distribution): use a CNAME below the apex, or route dns to Route 53 (providers.dns.kind = \"route53\"), which has them",
                        set.type_.mnemonic(),
                        set.name
                    ),
                ));
            }
            if !zone.zone_of(&name(&set.name)?) {
                return Err(CapabilityError::permanent(
                    "invalid-change-batch",
                    format!("{} is not in zone {zone}", set.name),
                ));
            }
            if matches!(change, Change::Upsert(_)) {
                if set.values.is_empty() {
                    return Err(CapabilityError::permanent(
                        "invalid-change-batch",
                        format!(
                            "the upsert of {} {} has no values",
                            set.type_.mnemonic(),
                            set.name
                        ),
                    ));
                }
                canonical(set.type_, &set.values)?;
            }
            if changes[..i].iter().any(|c| {
                model::bare(&c.set().name) == model::bare(&set.name) && c.set().type_ == set.type_
            }) {
                return Err(CapabilityError::permanent(
                    "invalid-change-batch",
                    format!(
                        "the batch changes {} {} more than once",
                        set.type_.mnemonic(),
                        set.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether the primary serves every set as the batch leaves it.
    async fn applied(&self, client: &Client, changes: &[Change]) -> Result<bool, CapabilityError> {
        for change in changes {
            let set = change.set();
            let now = self.read_set(client, &set.name, set.type_).await?;
            let same = match (change, now) {
                (Change::Upsert(want), Some(have)) => {
                    canonical(want.type_, &want.values)? == canonical(have.type_, &have.values)?
                }
                (Change::Delete(_), None) => true,
                _ => false,
            };
            if !same {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One UPDATE: for each set, the prerequisite that it is as `prior` says, then its new value.
    fn update_message(
        &self,
        zone: &Name,
        changes: &[Change],
        prior: &[RecordSet],
    ) -> Result<Message, CapabilityError> {
        let mut message = Message::new();
        message
            .set_id(rand_id())
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Update)
            .set_recursion_desired(false);
        let mut soa = Query::new();
        soa.set_name(zone.clone())
            .set_query_class(DNSClass::IN)
            .set_query_type(WireType::SOA);
        message.add_zone(soa);
        for change in changes {
            let set = change.set();
            let owner = name(&set.name)?;
            let t = wire_type(set.type_);
            match prior
                .iter()
                .find(|p| model::bare(&p.name) == model::bare(&set.name) && p.type_ == set.type_)
            {
                // §2.4.2: the set exists with exactly these records.
                Some(before) => {
                    for value in &before.values {
                        let mut r =
                            Record::from_rdata(owner.clone(), 0, rdata(before.type_, value)?);
                        r.set_dns_class(DNSClass::IN);
                        message.add_pre_requisite(r);
                    }
                }
                // §2.4.3: the set does not exist.
                None => {
                    let mut r = Record::update0(owner.clone(), 0, t).into_record_of_rdata();
                    r.set_dns_class(DNSClass::NONE);
                    message.add_pre_requisite(r);
                }
            }
            // §2.5.2: delete the set (ignored when there is none) ...
            let mut delete = Record::update0(owner.clone(), 0, t).into_record_of_rdata();
            delete.set_dns_class(DNSClass::ANY);
            message.add_update(delete);
            // ... §2.5.1: and add the new records.
            if let Change::Upsert(set) = change {
                let ttl = set.ttl.unwrap_or(self.default_ttl);
                for value in &set.values {
                    let mut r = Record::from_rdata(owner.clone(), ttl, rdata(set.type_, value)?);
                    r.set_dns_class(DNSClass::IN);
                    message.add_update(r);
                }
            }
        }
        Ok(message)
    }

    async fn change_records(&self, request: &Value, token: &str) -> Answer {
        let zone_id: String = arg(request, "zone_id")?;
        let zone = self.zone(&zone_id)?;
        let changes: Vec<Change> = arg(request, "changes")?;
        self.check(&zone, &changes)?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger
                .get(token, "dns.change-records", request)
                .await?
        };
        let client = self.connect(&self.server, true).await?;
        let intent = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(body)) => {
                let intent: Intent = serde_json::from_value(body).map_err(storage)?;
                // The update may have reached the server before a crash: if the server already
                // serves the batch, the recorded prior is the receipt's.
                if self.applied(&client, &changes).await? {
                    return self.finish(&client, &zone, token, &changes, intent).await;
                }
                intent
            }
            None => {
                let mut prior = Vec::new();
                for change in &changes {
                    let set = change.set();
                    match self.read_set(&client, &set.name, set.type_).await? {
                        Some(before) => prior.push(before),
                        None if matches!(change, Change::Delete(_)) => {
                            return Err(CapabilityError::permanent(
                                "invalid-change-batch",
                                format!(
                                    "no {} record {} to delete",
                                    set.type_.mnemonic(),
                                    set.name
                                ),
                            ));
                        }
                        None => {}
                    }
                }
                let intent = Intent {
                    change_id: format!(
                        "C{}",
                        capstan_core::ids::new_id()
                            .replace('-', "")
                            .to_ascii_uppercase()
                    ),
                    prior,
                };
                if !token.is_empty() {
                    self.ledger
                        .intend(
                            token,
                            "dns.change-records",
                            request,
                            &serde_json::to_value(&intent).map_err(storage)?,
                            self.now(),
                        )
                        .await?;
                }
                intent
            }
        };
        let message = self.update_message(&zone, &changes, &intent.prior)?;
        let answer = self.exchange(&client, &self.server, message).await?;
        match answer.response_code() {
            ResponseCode::NoError => self.finish(&client, &zone, token, &changes, intent).await,
            code => {
                let error = refusal(code, &self.key_name, &zone);
                if !token.is_empty() && error.code == "conflict" {
                    // The prior read is stale: the retry reads it again.
                    self.ledger.forget(token).await?;
                }
                Err(error)
            }
        }
    }

    /// Records the applied change (for `get-change`) and its answer under the token.
    async fn finish(
        &self,
        client: &Client,
        zone: &Name,
        token: &str,
        changes: &[Change],
        intent: Intent,
    ) -> Answer {
        let serial = self.soa_serial(client, &self.server, zone).await?;
        let expected: Vec<&Change> = changes.iter().collect();
        sqlx::query(
            "INSERT INTO dns_changes (id, zone, expected, serial, at_ms) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&intent.change_id)
        .bind(zone.to_string())
        .bind(serde_json::to_string(&expected).map_err(storage)?)
        .bind(i64::from(serial))
        .bind(self.now())
        .execute(self.ledger.pool())
        .await
        .map_err(storage)?;
        let receipt = ChangeReceipt {
            change_id: intent.change_id,
            zone_id: model::bare(&zone.to_string()),
            status: ChangeStatus::Pending,
            prior: intent.prior,
        };
        let answer = serde_json::to_value(&receipt).map_err(storage)?;
        if !token.is_empty() {
            self.ledger
                .done(token, "dns.change-records", &answer, self.now())
                .await?;
        }
        Ok(answer)
    }

    async fn get_change(&self, request: &Value) -> Answer {
        let id: String = arg(request, "change_id")?;
        let row = sqlx::query("SELECT zone, expected, serial FROM dns_changes WHERE id = $1")
            .bind(&id)
            .fetch_optional(self.ledger.pool())
            .await
            .map_err(storage)?
            .ok_or_else(|| CapabilityError::permanent("not-found", format!("no change {id}")))?;
        let zone: String = row.try_get(0).map_err(storage)?;
        let expected: String = row.try_get(1).map_err(storage)?;
        let serial: Option<i64> = row.try_get(2).map_err(storage)?;
        let changes: Vec<Change> = serde_json::from_str(&expected).map_err(storage)?;
        let client = self.connect(&self.server, true).await?;
        if !self.applied(&client, &changes).await? {
            return Ok(json!(ChangeStatus::Pending));
        }
        let zone = name(&zone)?;
        for secondary in &self.wait_for {
            let client = self.connect(secondary, false).await?;
            let theirs = self.soa_serial(&client, secondary, &zone).await?;
            // RFC 1982 serial arithmetic: at or past the primary's serial after the change.
            let ours = serial.unwrap_or(0) as u32;
            if (theirs.wrapping_sub(ours) as i32) < 0 {
                return Ok(json!(ChangeStatus::Pending));
            }
        }
        Ok(json!(ChangeStatus::Insync))
    }
}

/// The TXT values of `owner` as `server` answers them, unsigned (for ACME's check that a
/// challenge record resolves).
pub async fn txt_values(server: &str, owner: &str) -> Result<Vec<String>, CapabilityError> {
    let server = with_port(server);
    let client = connect(&server, Duration::from_secs(5), None).await?;
    let owner = name(owner)?;
    let mut responses = client.send(DnsRequest::new(
        query_message(&owner, WireType::TXT),
        DnsRequestOptions::default(),
    ));
    let answer = match responses.next().await {
        Some(Ok(r)) => r.into_message(),
        Some(Err(e)) => return Err(unavailable(&server, e)),
        None => return Err(unavailable(&server, "no answer")),
    };
    Ok(answer
        .answers()
        .iter()
        .filter(|r| r.name() == &owner)
        .map(|r| value_of(r.data()))
        .collect())
}

/// A TCP connection to `server` (`host:port`), its messages finalized by `signer` if any.
async fn connect(
    server: &str,
    timeout: Duration,
    signer: Option<Arc<dyn MessageFinalizer>>,
) -> Result<Client, CapabilityError> {
    let addr: SocketAddr = tokio::net::lookup_host(server)
        .await
        .map_err(|e| unavailable(server, e))?
        .next()
        .ok_or_else(|| unavailable(server, "the name has no address"))?;
    let (stream, handle) =
        TcpClientStream::new(addr, None, Some(timeout), TokioRuntimeProvider::new());
    let (client, background) = Client::with_timeout(stream, handle, timeout, signer)
        .await
        .map_err(|e| unavailable(server, e))?;
    tokio::spawn(background);
    Ok(client)
}

/// A non-recursive query of `owner`/`t`.
fn query_message(owner: &Name, t: WireType) -> Message {
    let mut message = Message::new();
    message
        .set_id(rand_id())
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(false)
        .add_query(Query::query(owner.clone(), t));
    message
}

/// `host:port` as given, `:53` added where no port is (`ns1.example.net`, `192.0.2.1`, `::1`).
fn with_port(server: &str) -> String {
    let s = server.trim();
    if s.parse::<SocketAddr>().is_ok() {
        return s.to_owned();
    }
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return SocketAddr::new(ip, 53).to_string();
    }
    match s.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok() => s.to_owned(),
        _ => format!("{s}:53"),
    }
}

/// A message id nobody can predict (RFC 5452).
fn rand_id() -> u16 {
    u16::from_ne_bytes(capstan_core::secrets::random_bytes::<2>())
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

#[async_trait]
impl Providers for Rfc2136 {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "dns.find-zone" => {
                let domain: String = arg(request, "domain")?;
                Ok(match self.zone_of(&domain) {
                    Some(zone) => {
                        let id = model::bare(&zone.to_string());
                        json!({"id": id, "name": id})
                    }
                    None => Value::Null,
                })
            }
            "dns.create-zone" | "dns.delete-zone" => Err(CapabilityError::permanent(
                "unsupported",
                format!(
                    "RFC 2136 cannot {} zones: add the zone on the DNS server and to providers.dns.zones",
                    if op == "dns.create-zone" {
                        "create"
                    } else {
                        "delete"
                    }
                ),
            )),
            "dns.list-records" => self.list_records(request).await,
            "dns.change-records" => self.change_records(request, token).await,
            "dns.get-change" => self.get_change(request).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the rfc2136 provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "rfc2136"
    }

    async fn reachable(&self) -> Result<(), String> {
        let client = self
            .connect(&self.server, true)
            .await
            .map_err(|e| e.message)?;
        for zone in &self.zones {
            self.soa_serial(&client, &self.server, zone)
                .await
                .map_err(|e| e.message)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value read back as the server would print it, then read again, stays the same.
    #[test]
    fn values_round_trip_through_record_data() {
        let long = "v".repeat(600);
        for (t, value, printed) in [
            (RecordType::A, "192.0.2.1", "192.0.2.1"),
            (RecordType::Aaaa, "2001:db8::1", "2001:db8::1"),
            (
                RecordType::Cname,
                "d1.cdn.example.net",
                "d1.cdn.example.net.",
            ),
            (
                RecordType::Cname,
                "d1.cdn.example.net.",
                "d1.cdn.example.net.",
            ),
            (
                RecordType::Txt,
                "v=spf1 -all \"quoted\"",
                "v=spf1 -all \"quoted\"",
            ),
            (RecordType::Txt, "", ""),
            (RecordType::Txt, long.as_str(), long.as_str()),
            (
                RecordType::Mx,
                "10 mail.example.net.",
                "10 mail.example.net.",
            ),
            (
                RecordType::Caa,
                "0 issue \"letsencrypt.org\"",
                "0 issue \"letsencrypt.org\"",
            ),
        ] {
            let data = rdata(t, value).unwrap_or_else(|e| panic!("{value}: {e:?}"));
            let back = value_of(&data);
            assert_eq!(back, printed, "{t:?} {value}");
            assert_eq!(value_of(&rdata(t, &back).unwrap()), printed, "{t:?} again");
        }
        // A long TXT value goes on the wire as 255-byte strings.
        let RData::TXT(txt) = rdata(RecordType::Txt, &long).unwrap() else {
            panic!("TXT")
        };
        let sizes: Vec<usize> = txt.txt_data().iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [255, 255, 90]);
    }

    #[test]
    fn a_value_that_is_not_of_its_type_is_refused_naming_it() {
        for (t, value) in [
            (RecordType::A, "2001:db8::1"),
            (RecordType::Aaaa, "192.0.2.1"),
            (RecordType::Mx, "mail.example.net."),
            (RecordType::A, "not an address"),
        ] {
            let e = rdata(t, value).unwrap_err();
            assert_eq!(e.code, "invalid-change-batch");
            assert!(!e.is_transient());
            assert!(e.message.contains(value), "{e:?}");
        }
    }

    #[test]
    fn sets_compare_without_order_case_or_repeats() {
        let a = canonical(RecordType::Cname, &["D1.CDN.example.net".to_owned()]).unwrap();
        assert_eq!(
            a,
            canonical(RecordType::Cname, &["d1.cdn.example.net.".to_owned()]).unwrap()
        );
        let ips = |v: &[&str]| {
            canonical(
                RecordType::A,
                &v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .unwrap()
        };
        assert_eq!(
            ips(&["192.0.2.2", "192.0.2.1", "192.0.2.2"]),
            ips(&["192.0.2.1", "192.0.2.2"])
        );
        assert_ne!(ips(&["192.0.2.1"]), ips(&["192.0.2.1", "192.0.2.2"]));
    }

    #[test]
    fn answers_are_classified_so_a_retry_only_follows_what_a_retry_can_mend() {
        let zone = Name::from_str("example.net.").unwrap();
        for (code, transient, expected) in [
            (ResponseCode::BADKEY, false, "tsig-rejected"),
            (ResponseCode::BADSIG, false, "tsig-rejected"),
            (ResponseCode::NotAuth, false, "tsig-rejected"),
            (ResponseCode::Refused, false, "update-refused"),
            (ResponseCode::NotZone, false, "invalid-change-batch"),
            (ResponseCode::YXRRSet, true, "conflict"),
            (ResponseCode::NXRRSet, true, "conflict"),
            (ResponseCode::ServFail, true, "unavailable"),
            (ResponseCode::FormErr, false, "update-failed"),
        ] {
            let e = refusal(code, "capstan", &zone);
            assert_eq!(e.is_transient(), transient, "{code}");
            assert_eq!(e.code, expected, "{code}");
            assert!(e.message.contains("example.net"), "{e:?}");
        }
        let key = refusal(ResponseCode::BADKEY, "capstan", &zone);
        assert!(key.message.contains("`capstan`"), "names the key: {key:?}");

        let unsigned = exchange_error("ns1:53", "capstan", "tsig verification failed");
        assert_eq!(unsigned.code, "tsig-rejected");
        assert!(!unsigned.is_transient());
        let down = exchange_error("ns1:53", "capstan", "connection refused");
        assert_eq!(down.code, "unavailable");
        assert!(down.is_transient());
    }

    #[test]
    fn a_server_without_a_port_gets_53() {
        for (given, expected) in [
            ("ns1.example.net", "ns1.example.net:53"),
            ("ns1.example.net:5353", "ns1.example.net:5353"),
            ("192.0.2.53", "192.0.2.53:53"),
            ("192.0.2.53:5300", "192.0.2.53:5300"),
            ("2001:db8::53", "[2001:db8::53]:53"),
            ("[2001:db8::53]:5300", "[2001:db8::53]:5300"),
        ] {
            assert_eq!(with_port(given), expected);
        }
    }
}
