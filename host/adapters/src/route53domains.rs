//! The registrar on Amazon Route 53 Domains (`[providers.registrar] kind = "route53domains"`),
//! through the AWS SDK for Rust (`capstan-aws`).
//!
//! - **Checking.** A domain this account holds (`GetDomainDetail`) is `owned`; any other name
//!   is asked of `CheckDomainAvailability`: `AVAILABLE` is available, the `UNAVAILABLE*` answers
//!   are registered to someone else, reserved and pre-order names are neither, and `DONT_KNOW`
//!   or `PENDING` is the transient `availability-unknown` (asked again by the engine's retry).
//! - **Registering.** `RegisterDomain` takes no idempotency token, so the ledger records the
//!   intent before the request and the operation id as soon as Route 53 Domains answers. A
//!   repeat after a crash answers from the ledger, or finds the registration among the account's
//!   `REGISTER_DOMAIN` operations, or sees the domain already held — never a second
//!   registration. A registration runs at the registry for minutes or longer: until its
//!   operation has succeeded the call answers the transient `registration-in-progress`, and the
//!   engine's retry asks again under the same token (an execution whose retries run out pauses,
//!   and `resume` picks it up). A failed operation is the permanent `registration-failed` with
//!   the registry's message, and the intent is forgotten so a later execution may try again.
//!   The contact of the settings is registrant, administrative and technical contact.
//! - **Delegation.** `get-domain` reads `GetDomainDetail`; `set-name-servers` sends
//!   `UpdateDomainNameservers` once per token (the ledger keeps the servers it replaces and the
//!   operation) and answers the transient `delegation-in-progress` until the operation has
//!   succeeded. A rollback delegates back to the servers replaced.
//! - **A registration is not undone.** No registrar refunds a registration, and deleting a
//!   domain gives the name away.
//! - **Region.** Route 53 Domains answers in `us-east-1` only: the default.

use crate::ledger::{Entry, Ledger, storage};
use crate::model::arg;
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_aws::route53domains::{self, Contact, Domain, Operation, Terms};
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

type Answer = Result<Value, CapabilityError>;

/// `[providers.registrar] kind = "route53domains"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route53DomainsSettings {
    /// Route 53 Domains' region (default: `us-east-1`, the only one it answers in).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint than AWS's (a VPC endpoint; moto in the tests).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Deadline of one call to Route 53 Domains.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// An access key of this adapter's own, instead of the standard AWS credential chain; its
    /// secret comes from `secret_access_key_file` or `secret_access_key_env`.
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub secret_access_key_env: Option<String>,
    /// The registrant, administrative and technical contact of every registration (boxed:
    /// the settings of every kind share one enum).
    pub contact: Box<ContactSettings>,
    /// Hide the contact from WHOIS where the registry allows it (default: yes).
    #[serde(default = "yes")]
    pub privacy_protection: bool,
    /// Renew registrations automatically before they expire (default: yes).
    #[serde(default = "yes")]
    pub auto_renew: bool,
}

/// `[providers.registrar.contact]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContactSettings {
    pub first_name: String,
    pub last_name: String,
    /// `PERSON` (default), `COMPANY`, `ASSOCIATION`, `PUBLIC_BODY` or `RESELLER`; any but a
    /// person needs `organization_name`.
    #[serde(default = "person")]
    pub contact_type: String,
    #[serde(default)]
    pub organization_name: Option<String>,
    pub address_line_1: String,
    #[serde(default)]
    pub address_line_2: Option<String>,
    pub city: String,
    #[serde(default)]
    pub state: Option<String>,
    /// ISO 3166-1 alpha-2 (`US`, `DE`).
    pub country_code: String,
    pub zip_code: String,
    /// `+CC.NUMBER`, e.g. `+1.5555550100`.
    pub phone_number: String,
    pub email: String,
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn yes() -> bool {
    true
}

fn person() -> String {
    "PERSON".to_owned()
}

const CONTACT_TYPES: [&str; 5] = [
    "PERSON",
    "COMPANY",
    "ASSOCIATION",
    "PUBLIC_BODY",
    "RESELLER",
];

impl ContactSettings {
    /// The contact, or the key whose value Route 53 Domains would refuse.
    fn check(&self) -> Result<Contact, SettingsError> {
        let bad = |key: &str, message: &str| {
            SettingsError::new(Capability::Registrar, &format!("contact.{key}"), message)
        };
        for (key, value) in [
            ("first_name", &self.first_name),
            ("last_name", &self.last_name),
            ("address_line_1", &self.address_line_1),
            ("city", &self.city),
            ("zip_code", &self.zip_code),
        ] {
            if value.trim().is_empty() {
                return Err(bad(key, "must not be empty"));
            }
        }
        let contact_type = self.contact_type.trim().to_ascii_uppercase();
        if !CONTACT_TYPES.contains(&contact_type.as_str()) {
            return Err(bad(
                "contact_type",
                &format!(
                    "`{}` is not one of {}",
                    self.contact_type,
                    CONTACT_TYPES.join(", ")
                ),
            ));
        }
        let organization = self
            .organization_name
            .as_deref()
            .map(str::trim)
            .filter(|o| !o.is_empty());
        if contact_type != "PERSON" && organization.is_none() {
            return Err(bad(
                "organization_name",
                "a contact that is not a PERSON needs its organization's name",
            ));
        }
        let country = self.country_code.trim().to_ascii_uppercase();
        if country.len() != 2 || !country.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(bad(
                "country_code",
                &format!("`{}` is not an ISO 3166 alpha-2 code", self.country_code),
            ));
        }
        if !phone_number_form(self.phone_number.trim()) {
            return Err(bad(
                "phone_number",
                &format!(
                    "`{}` is not of the form +CC.NUMBER (e.g. +1.5555550100)",
                    self.phone_number
                ),
            ));
        }
        let email = self.email.trim();
        if email.split('@').count() != 2 || email.starts_with('@') || email.ends_with('@') {
            return Err(bad("email", &format!("`{}` is not an address", self.email)));
        }
        let optional = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(Contact {
            first_name: self.first_name.trim().to_owned(),
            last_name: self.last_name.trim().to_owned(),
            contact_type,
            organization_name: organization.map(str::to_owned),
            address_line_1: self.address_line_1.trim().to_owned(),
            address_line_2: optional(&self.address_line_2),
            city: self.city.trim().to_owned(),
            state: optional(&self.state),
            country_code: country,
            zip_code: self.zip_code.trim().to_owned(),
            phone_number: self.phone_number.trim().to_owned(),
            email: email.to_owned(),
        })
    }
}

/// `+CC.NUMBER`: a country calling code of 1 to 3 digits, a dot, and at least four digits.
fn phone_number_form(phone: &str) -> bool {
    let Some((code, number)) = phone.strip_prefix('+').and_then(|p| p.split_once('.')) else {
        return false;
    };
    (1..=3).contains(&code.len())
        && code.bytes().all(|b| b.is_ascii_digit())
        && number.len() >= 4
        && number.bytes().all(|b| b.is_ascii_digit())
}

/// A domain name as registries take it (lower case, no trailing dot), or `invalid-domain`.
fn domain_name(request: &Value) -> Result<String, CapabilityError> {
    let name = crate::model::bare(&arg::<String>(request, "name")?);
    let labels: Vec<&str> = name.split('.').collect();
    let valid = name.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if valid {
        Ok(name)
    } else {
        Err(CapabilityError::permanent(
            "invalid-domain",
            format!("{name:?} is not a domain name"),
        ))
    }
}

/// A list of name servers a domain can be delegated to: two to six host names, each once, lower
/// case without the final dot; else `invalid-request`.
fn name_servers(request: &Value) -> Result<Vec<String>, CapabilityError> {
    let asked: Vec<String> = arg(request, "name_servers")?;
    let mut servers: Vec<String> = Vec::new();
    for raw in &asked {
        let name = domain_name(&json!({"name": raw})).map_err(|_| {
            CapabilityError::permanent(
                "invalid-request",
                format!("name server {raw:?} is not a host name"),
            )
        })?;
        if !servers.contains(&name) {
            servers.push(name);
        }
    }
    if !(2..=6).contains(&servers.len()) {
        return Err(CapabilityError::permanent(
            "invalid-request",
            format!(
                "a domain is delegated to two to six name servers, not {}",
                servers.len()
            ),
        ));
    }
    Ok(servers)
}

/// Whether two lists name the same servers, in any order.
fn same_servers(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    a == b
}

fn detail_view(domain: &Domain) -> Value {
    json!({
        "name": domain.name,
        "expires_at": domain.expires_at_ms.unwrap_or(0),
        "name_servers": domain.nameservers,
    })
}

/// What the ledger holds of a delegation before its answer: the servers it replaces, and the
/// operation once Route 53 Domains named it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Delegating {
    before: Vec<String>,
    operation_id: Option<String>,
}

/// What the ledger holds of a registration before its answer: the operation once Route 53
/// Domains named it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Requested {
    operation_id: Option<String>,
}

pub struct Route53Domains {
    client: route53domains::Route53Domains,
    terms: Terms,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Route53Domains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route53Domains").finish_non_exhaustive()
    }
}

impl Route53Domains {
    pub async fn new(s: &Route53DomainsSettings, node: &Node) -> Result<Self, SettingsError> {
        let contact = s.contact.check()?;
        let aws = crate::aws::Access {
            capability: Capability::Registrar,
            region: s.region.as_ref(),
            default_region: "us-east-1",
            endpoint_url: s.endpoint_url.as_ref(),
            timeout_ms: s.timeout_ms,
            access_key_id: s.access_key_id.as_ref(),
            secret_access_key_file: s.secret_access_key_file.as_ref(),
            secret_access_key_env: s.secret_access_key_env.as_deref(),
        }
        .connect()
        .await?;
        Ok(Self {
            client: route53domains::Route53Domains::new(&aws),
            terms: Terms {
                contact,
                privacy_protection: s.privacy_protection,
                auto_renew: s.auto_renew,
            },
            ledger: Ledger::new(node.store.writer().clone(), "route53domains"),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    async fn check(&self, request: &Value) -> Answer {
        let name = domain_name(request)?;
        if self.client.detail(&name).await?.is_some() {
            return Ok(
                json!({"name": name, "registered": true, "owned": true, "available": false}),
            );
        }
        let availability = self.client.availability(&name).await?;
        let (registered, available) = match availability.as_str() {
            "AVAILABLE" => (false, true),
            "UNAVAILABLE" | "UNAVAILABLE_PREMIUM" | "UNAVAILABLE_RESTRICTED" => (true, false),
            "DONT_KNOW" | "PENDING" => {
                return Err(CapabilityError::transient(
                    "availability-unknown",
                    format!("the registry of {name} cannot tell its availability now"),
                ));
            }
            "INVALID_NAME_FOR_TLD" => {
                return Err(CapabilityError::permanent(
                    "invalid-domain",
                    format!("{name} is not a valid name under its top-level domain"),
                ));
            }
            // RESERVED, AVAILABLE_RESERVED, AVAILABLE_PREORDER: nobody holds it, and it cannot
            // be registered now.
            _ => (false, false),
        };
        Ok(json!({"name": name, "registered": registered, "owned": false, "available": available}))
    }

    async fn register(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "registrar.register-domain";
        let name = domain_name(request)?;
        let years: u32 = arg(request, "years")?;
        if !(1..=10).contains(&years) {
            return Err(CapabilityError::permanent(
                "invalid-request",
                format!("a registration runs 1 to 10 years, not {years}"),
            ));
        }
        let token = if token.is_empty() {
            capstan_core::ids::new_id()
        } else {
            token.to_owned()
        };
        let operation = match self.ledger.get(&token, OP, request).await? {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(body)) => {
                let requested: Requested = serde_json::from_value(body).map_err(storage)?;
                match requested.operation_id {
                    Some(id) => Some(self.client.operation(&id).await?),
                    // Asked before a crash, perhaps: the account lists the operation.
                    None => self.client.registration(&name).await?,
                }
            }
            None => {
                // Held already (an earlier execution, or by hand): that registration answers.
                if let Some(domain) = self.client.detail(&name).await? {
                    let id = self
                        .client
                        .registration(&name)
                        .await?
                        .map_or_else(|| name.clone(), |op| op.id);
                    let answer = json!({"name": name, "registration_id": id, "expires_at": domain.expires_at_ms});
                    self.ledger.done(&token, OP, &answer, self.now()).await?;
                    return Ok(answer);
                }
                self.ledger
                    .intend(
                        &token,
                        OP,
                        request,
                        &json!(Requested::default()),
                        self.now(),
                    )
                    .await?;
                None
            }
        };
        let operation = match operation {
            Some(op) => op,
            None => {
                let id = self.client.register(&name, years, &self.terms).await?;
                let requested = Requested {
                    operation_id: Some(id.clone()),
                };
                self.ledger
                    .intend(&token, OP, request, &json!(requested), self.now())
                    .await?;
                self.client.operation(&id).await?
            }
        };
        self.settle(&name, &token, request, operation).await
    }

    async fn get_domain(&self, request: &Value) -> Answer {
        let name = domain_name(request)?;
        Ok(self
            .client
            .detail(&name)
            .await?
            .map_or(Value::Null, |d| detail_view(&d)))
    }

    /// `UpdateDomainNameservers`, once per token: the ledger keeps the servers replaced (the
    /// receipt's `before`) and the operation, which is waited for as `delegation-in-progress`.
    async fn set_name_servers(&self, request: &Value, token: &str) -> Answer {
        const OP: &str = "registrar.set-name-servers";
        let name = domain_name(request)?;
        let wanted = name_servers(request)?;
        let earlier = if token.is_empty() {
            None
        } else {
            self.ledger.get(token, OP, request).await?
        };
        let delegating = match earlier {
            Some(Entry::Done(answer)) => return Ok(answer),
            Some(Entry::Intent(body)) => {
                serde_json::from_value::<Delegating>(body).map_err(storage)?
            }
            None => {
                let Some(domain) = self.client.detail(&name).await? else {
                    return Err(CapabilityError::permanent(
                        "not-found",
                        format!("this account does not hold {name}"),
                    ));
                };
                let before = domain.nameservers;
                if same_servers(&before, &wanted) {
                    let answer = json!({"name": name, "before": before, "after": before});
                    if !token.is_empty() {
                        self.ledger.done(token, OP, &answer, self.now()).await?;
                    }
                    return Ok(answer);
                }
                let delegating = Delegating {
                    before,
                    operation_id: None,
                };
                if !token.is_empty() {
                    self.ledger
                        .intend(token, OP, request, &json!(delegating), self.now())
                        .await?;
                }
                delegating
            }
        };
        let id = match delegating.operation_id.clone() {
            Some(id) => id,
            // Sending the same servers twice (a crash before the id was kept) changes nothing
            // more: the second operation sets what the first did.
            None => {
                let id = self.client.set_nameservers(&name, &wanted).await?;
                if !token.is_empty() {
                    let sent = Delegating {
                        operation_id: Some(id.clone()),
                        ..delegating.clone()
                    };
                    self.ledger
                        .intend(token, OP, request, &json!(sent), self.now())
                        .await?;
                }
                id
            }
        };
        let operation = self.client.operation(&id).await?;
        if operation.failed() {
            if !token.is_empty() {
                self.ledger.forget(token).await?;
            }
            return Err(CapabilityError::permanent(
                "delegation-failed",
                format!(
                    "the name server change of {name} failed: {}",
                    operation.message.as_deref().unwrap_or("no reason given")
                ),
            ));
        }
        if !operation.succeeded() {
            return Err(CapabilityError::transient(
                "delegation-in-progress",
                format!(
                    "the name server change of {name} is {} at the registry (operation {id})",
                    operation.status.to_ascii_lowercase()
                ),
            ));
        }
        let answer = json!({"name": name, "before": delegating.before, "after": wanted});
        if !token.is_empty() {
            self.ledger.done(token, OP, &answer, self.now()).await?;
        }
        Ok(answer)
    }

    /// The answer of a registration whose operation is `operation`, once it has succeeded.
    async fn settle(
        &self,
        name: &str,
        token: &str,
        request: &Value,
        operation: Operation,
    ) -> Answer {
        const OP: &str = "registrar.register-domain";
        if operation.failed() {
            self.ledger.forget(token).await?;
            return Err(CapabilityError::permanent(
                "registration-failed",
                format!(
                    "the registration of {name} failed: {}",
                    operation.message.as_deref().unwrap_or("no reason given")
                ),
            ));
        }
        if !operation.succeeded() {
            // Remember the operation (a repeat asks it, not the account's listing).
            let requested = Requested {
                operation_id: Some(operation.id.clone()),
            };
            self.ledger
                .intend(token, OP, request, &json!(requested), self.now())
                .await?;
            return Err(CapabilityError::transient(
                "registration-in-progress",
                format!(
                    "the registration of {name} is {} at the registry (operation {})",
                    operation.status.to_ascii_lowercase(),
                    operation.id
                ),
            ));
        }
        let Some(domain) = self.client.detail(name).await? else {
            return Err(CapabilityError::transient(
                "registration-in-progress",
                format!(
                    "the registration of {name} succeeded but the account does not show it yet"
                ),
            ));
        };
        let answer = json!({"name": name, "registration_id": operation.id, "expires_at": domain.expires_at_ms});
        self.ledger.done(token, OP, &answer, self.now()).await?;
        Ok(answer)
    }
}

#[async_trait]
impl Providers for Route53Domains {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "registrar.check-domain" => self.check(request).await,
            "registrar.register-domain" => self.register(request, token).await,
            "registrar.get-domain" => self.get_domain(request).await,
            "registrar.set-name-servers" => self.set_name_servers(request, token).await,
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the route53domains provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "route53domains"
    }

    async fn reachable(&self) -> Result<(), String> {
        self.client.ping().await.map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contact() -> ContactSettings {
        ContactSettings {
            first_name: "Ada".into(),
            last_name: "Lovelace".into(),
            contact_type: "person".into(),
            organization_name: None,
            address_line_1: "1 Analytical Way".into(),
            address_line_2: Some("  ".into()),
            city: "London".into(),
            state: None,
            country_code: "gb".into(),
            zip_code: "N1 1AA".into(),
            phone_number: "+44.2071234567".into(),
            email: "hostmaster@example.org".into(),
        }
    }

    #[test]
    fn a_contact_is_checked_and_normalized_before_any_call() {
        let checked = contact().check().unwrap();
        assert_eq!(checked.contact_type, "PERSON");
        assert_eq!(checked.country_code, "GB");
        assert_eq!(checked.address_line_2, None);
        for (edit, key) in [
            (
                (|c: &mut ContactSettings| c.phone_number = "020 7123 4567".into())
                    as fn(&mut ContactSettings),
                "contact.phone_number",
            ),
            (|c| c.country_code = "GBR".into(), "contact.country_code"),
            (
                |c| c.contact_type = "COMPANY".into(),
                "contact.organization_name",
            ),
            (|c| c.contact_type = "ROBOT".into(), "contact.contact_type"),
            (|c| c.email = "hostmaster".into(), "contact.email"),
            (|c| c.city = " ".into(), "contact.city"),
        ] {
            let mut c = contact();
            edit(&mut c);
            let e = c.check().unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
    }

    #[test]
    fn a_delegation_names_two_to_six_servers_each_once() {
        let servers = |list: Value| name_servers(&json!({"name_servers": list}));
        assert_eq!(
            servers(json!([
                "NS-1.awsdns-01.org.",
                "ns-2.awsdns-02.com",
                "ns-1.awsdns-01.org"
            ]))
            .unwrap(),
            ["ns-1.awsdns-01.org", "ns-2.awsdns-02.com"]
        );
        assert_eq!(
            servers(json!(["ns1.example.net"])).unwrap_err().code,
            "invalid-request"
        );
        assert_eq!(
            servers(json!(["ns1.example.net", "not a host"]))
                .unwrap_err()
                .code,
            "invalid-request"
        );
        assert!(same_servers(
            &["b.example".to_owned(), "a.example".to_owned()],
            &["a.example".to_owned(), "b.example".to_owned()]
        ));
    }

    #[test]
    fn only_domain_names_reach_the_registry() {
        let name = |n: &str| domain_name(&json!({"name": n}));
        assert_eq!(name(" Example.ORG. ").unwrap(), "example.org");
        assert_eq!(name("a-b.co.uk").unwrap(), "a-b.co.uk");
        for bad in [
            "localhost",
            "-a.org",
            "a..org",
            "exa mple.org",
            "a_b.org",
            "",
        ] {
            let e = name(bad).unwrap_err();
            assert_eq!(e.code, "invalid-domain", "{bad}");
            assert!(!e.is_transient());
        }
    }
}
