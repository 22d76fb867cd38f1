//! Amazon Route 53 Domains as the registrar adapter needs it: what the account holds of a
//! domain, whether a name can be registered, registrations and the operations that carry them
//! out, and a domain's name servers. Names go out and come back bare (lower case, no trailing
//! dot).

use crate::{Aws, classify};
use aws_sdk_route53domains::types::{
    ContactDetail, ContactType, CountryCode, Nameserver, OperationStatus, OperationType,
};
use capstan_core::CapabilityError;

/// A domain registered in this account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    /// Milliseconds since the epoch.
    pub expires_at_ms: Option<u64>,
    pub nameservers: Vec<String>,
}

/// A registrar operation (a registration, a name server change), as far as it has gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub id: String,
    /// `SUBMITTED`, `IN_PROGRESS`, `ERROR`, `SUCCESSFUL` or `FAILED`.
    pub status: String,
    pub message: Option<String>,
}

impl Operation {
    pub fn succeeded(&self) -> bool {
        self.status == OperationStatus::Successful.as_str()
    }

    pub fn failed(&self) -> bool {
        self.status == OperationStatus::Failed.as_str()
            || self.status == OperationStatus::Error.as_str()
    }
}

/// The contact a registration names as registrant, administrative and technical contact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contact {
    pub first_name: String,
    pub last_name: String,
    /// `PERSON`, `COMPANY`, `ASSOCIATION`, `PUBLIC_BODY` or `RESELLER`.
    pub contact_type: String,
    pub organization_name: Option<String>,
    pub address_line_1: String,
    pub address_line_2: Option<String>,
    pub city: String,
    pub state: Option<String>,
    /// ISO 3166 alpha-2 (`US`, `DE`).
    pub country_code: String,
    pub zip_code: String,
    /// `+CC.NUMBER` (`+1.5555550100`), as Route 53 Domains requires.
    pub phone_number: String,
    pub email: String,
}

impl Contact {
    fn detail(&self) -> ContactDetail {
        ContactDetail::builder()
            .first_name(&self.first_name)
            .last_name(&self.last_name)
            .contact_type(ContactType::from(self.contact_type.as_str()))
            .set_organization_name(self.organization_name.clone())
            .address_line1(&self.address_line_1)
            .set_address_line2(self.address_line_2.clone())
            .city(&self.city)
            .set_state(self.state.clone())
            .country_code(CountryCode::from(self.country_code.as_str()))
            .zip_code(&self.zip_code)
            .phone_number(&self.phone_number)
            .email(&self.email)
            .build()
    }
}

/// What a registration asks besides the name and the term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terms {
    pub contact: Contact,
    /// Hide the contacts from WHOIS where the registry allows it.
    pub privacy_protection: bool,
    pub auto_renew: bool,
}

/// A Route 53 Domains client.
#[derive(Debug, Clone)]
pub struct Route53Domains {
    client: aws_sdk_route53domains::Client,
}

/// Route 53 Domains' own codes read as the engine's.
fn known(code: &str, message: &str) -> Option<CapabilityError> {
    match code {
        "InvalidInput" => Some(CapabilityError::permanent("invalid-request", message)),
        "UnsupportedTLD" => Some(CapabilityError::permanent("unsupported-tld", message)),
        "DomainLimitExceeded" => Some(CapabilityError::permanent("limit-exceeded", message)),
        "OperationLimitExceeded" => Some(CapabilityError::transient("throttling", message)),
        // A registration of the name is already under way.
        "DuplicateRequest" => Some(CapabilityError::transient(
            "registration-in-progress",
            message,
        )),
        "TLDRulesViolation" => Some(CapabilityError::permanent("invalid-domain", message)),
        _ => None,
    }
}

fn bare(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

fn build_error(e: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::permanent("invalid-request", e.to_string())
}

impl Route53Domains {
    pub fn new(aws: &Aws) -> Self {
        Self {
            client: aws_sdk_route53domains::Client::new(&aws.config),
        }
    }

    /// One cheap call that needs the account's credentials (`/readyz`).
    pub async fn ping(&self) -> Result<(), CapabilityError> {
        self.client
            .list_domains()
            .max_items(1)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(())
    }

    /// The domain if this account holds it; `None` if it does not. Route 53 Domains answers
    /// `InvalidInput` for a name the account does not hold, and for a malformed one: the caller
    /// checks the name's form first.
    pub async fn detail(&self, name: &str) -> Result<Option<Domain>, CapabilityError> {
        let out = match self
            .client
            .get_domain_detail()
            .domain_name(name)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                let error = classify(&e, known);
                if error.code == "invalid-request" {
                    return Ok(None);
                }
                return Err(error);
            }
        };
        Ok(Some(Domain {
            name: bare(out.domain_name().unwrap_or(name)),
            expires_at_ms: out
                .expiration_date()
                .and_then(|d| d.to_millis().ok())
                .and_then(|ms| u64::try_from(ms).ok()),
            nameservers: out.nameservers().iter().map(|n| bare(n.name())).collect(),
        }))
    }

    /// Route 53 Domains' word on whether `name` can be registered (`AVAILABLE`,
    /// `UNAVAILABLE`, `RESERVED`, `DONT_KNOW`, …).
    pub async fn availability(&self, name: &str) -> Result<String, CapabilityError> {
        let out = self
            .client
            .check_domain_availability()
            .domain_name(name)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(out
            .availability()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_else(|| "DONT_KNOW".to_owned()))
    }

    /// Asks for `name` to be registered for `years`; the operation's id. Route 53 Domains takes
    /// no idempotency token here: the caller makes a repeat find the first registration
    /// ([`Route53Domains::registration`]) instead of asking twice.
    pub async fn register(
        &self,
        name: &str,
        years: u32,
        terms: &Terms,
    ) -> Result<String, CapabilityError> {
        let contact = terms.contact.detail();
        let out = self
            .client
            .register_domain()
            .domain_name(name)
            .duration_in_years(i32::try_from(years).map_err(build_error)?)
            .auto_renew(terms.auto_renew)
            .admin_contact(contact.clone())
            .registrant_contact(contact.clone())
            .tech_contact(contact)
            .privacy_protect_admin_contact(terms.privacy_protection)
            .privacy_protect_registrant_contact(terms.privacy_protection)
            .privacy_protect_tech_contact(terms.privacy_protection)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        out.operation_id().map(str::to_owned).ok_or_else(|| {
            CapabilityError::transient("unavailable", "Route 53 Domains answered no operation id")
        })
    }

    pub async fn operation(&self, id: &str) -> Result<Operation, CapabilityError> {
        let out = self
            .client
            .get_operation_detail()
            .operation_id(id)
            .send()
            .await
            .map_err(|e| classify(&e, known))?;
        Ok(Operation {
            id: id.to_owned(),
            status: out
                .status()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
            message: out.message().map(str::to_owned),
        })
    }

    /// The newest registration operation of `name` in this account, if any: what a repeat of a
    /// registration whose answer was lost looks for.
    pub async fn registration(&self, name: &str) -> Result<Option<Operation>, CapabilityError> {
        let mut marker: Option<String> = None;
        let mut newest: Option<(i64, Operation)> = None;
        loop {
            let out = self
                .client
                .list_operations()
                .r#type(OperationType::RegisterDomain)
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| classify(&e, known))?;
            for op in out.operations() {
                if op.domain_name().map(bare).as_deref() != Some(name) {
                    continue;
                }
                let submitted = op.submitted_date().map_or(0, |d| d.secs());
                if newest.as_ref().is_some_and(|(at, _)| *at > submitted) {
                    continue;
                }
                newest = Some((
                    submitted,
                    Operation {
                        id: op.operation_id().unwrap_or_default().to_owned(),
                        status: op
                            .status()
                            .map(|s| s.as_str().to_owned())
                            .unwrap_or_default(),
                        message: op.message().map(str::to_owned),
                    },
                ));
            }
            match out.next_page_marker() {
                Some(next) if !next.is_empty() => marker = Some(next.to_owned()),
                _ => break,
            }
        }
        Ok(newest.map(|(_, op)| op))
    }

    /// Points `name` at `nameservers`; the operation's id.
    pub async fn set_nameservers(
        &self,
        name: &str,
        nameservers: &[String],
    ) -> Result<String, CapabilityError> {
        let mut request = self.client.update_domain_nameservers().domain_name(name);
        for ns in nameservers {
            request = request.nameservers(
                Nameserver::builder()
                    .name(ns)
                    .build()
                    .map_err(build_error)?,
            );
        }
        let out = request.send().await.map_err(|e| {
            let e = classify(&e, known);
            // Here an operation under way is a name server change, not a registration.
            if e.code == "registration-in-progress" {
                CapabilityError::transient("delegation-in-progress", e.message)
            } else {
                e
            }
        })?;
        out.operation_id().map(str::to_owned).ok_or_else(|| {
            CapabilityError::transient("unavailable", "Route 53 Domains answered no operation id")
        })
    }
}
