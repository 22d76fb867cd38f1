//! Certificates by ACME v2 (RFC 8555) with DNS-01 challenges: Let's Encrypt, Pebble, any CA that
//! speaks the protocol.
//!
//! The `certificates` interface maps onto an order:
//! - `request-certificate` opens an order for the names and answers its validation records: one
//!   `_acme-challenge.<name>` TXT record set per name, holding every challenge value of that name
//!   (a name and its wildcard share one). The workflow publishes them through `dns`.
//! - Issuance is driven by reading the certificate (`describe-certificate`, which the engine's
//!   convergence polls): each read takes one step — answer the challenges whose records resolve,
//!   finalize with a key generated here (sealed and stored before the CA sees the CSR), download
//!   the chain — and never sleeps.
//! - `delete-certificate` revokes an issued certificate; `find-certificates` reads the orders
//!   Capstan opened. A renewal is a new order for the same names.
//!
//! The order URL (the certificate's `arn`) is stored right after the CA answers the new order, and
//! the token's intent before it is asked: a repeat of the token answers the stored order. What is
//! not covered is a crash in the instant between the CA's answer and that write (the CA then holds
//! an order nobody will finish; it expires). Chains and keys are sealed with the secret keyring
//! and never returned by any API (`capstan certificates export` writes them for operators).

use crate::ledger::{Entry, Ledger, storage};
use crate::model::{self, Certificate, CertificateStatus, RecordSet, RecordType, arg};
use crate::{Node, SettingsError};
use async_trait::async_trait;
use capstan_core::secrets::Keyring;
use capstan_core::{Capability, CapabilityError, Clock, Providers};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeStatus, ChallengeType, Identifier,
    NewAccount, NewOrder, OrderStatus, RevocationReason, RevocationRequest,
};
use rustls_pki_types::pem::PemObject as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::Row;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// `[providers.certificates] kind = "acme"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeSettings {
    /// The CA's directory (`https://acme-v02.api.letsencrypt.org/directory`).
    pub directory_url: String,
    /// The account's contact (`mailto:ops@example.net`).
    #[serde(default)]
    pub contact: Option<String>,
    /// The account's credentials (key and URL, JSON), created with the account on first use.
    pub account_key_file: PathBuf,
    /// A PEM CA certificate to trust for the directory's HTTPS (a private CA, Pebble), besides
    /// the usual web roots.
    #[serde(default)]
    pub directory_ca_file: Option<PathBuf>,
    /// A DNS server (`host:port`, usually the zone's primary) asked for each challenge record
    /// before the challenge is answered, so the CA is not sent to look too early; unset, the
    /// challenges are answered at the first read after the request.
    #[serde(default)]
    pub check_dns_server: Option<String>,
}

/// The ACME provider of the `certificates` capability.
#[derive(Clone)]
pub struct Acme {
    settings: AcmeSettings,
    account: Arc<OnceCell<Account>>,
    ledger: Ledger,
    keyring: Keyring,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Acme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acme")
            .field("directory_url", &self.settings.directory_url)
            .finish_non_exhaustive()
    }
}

type Answer = Result<Value, CapabilityError>;

/// An ACME error: server problems and the network are worth a retry, the CA's refusals are not.
fn acme_error(e: instant_acme::Error) -> CapabilityError {
    match &e {
        instant_acme::Error::Api(problem) => {
            let kind = problem.r#type.as_deref().unwrap_or("");
            let text = format!("the ACME server refused: {problem}");
            if kind.ends_with(":serverInternal")
                || kind.ends_with(":rateLimited")
                || kind.ends_with(":badNonce")
                || problem.status.is_some_and(|s| s >= 500)
            {
                CapabilityError::transient("unavailable", text)
            } else {
                CapabilityError::permanent("acme-refused", text)
            }
        }
        // Keys and URLs that cannot work, or a server without a feature: no retry helps.
        instant_acme::Error::Crypto
        | instant_acme::Error::KeyRejected
        | instant_acme::Error::InvalidUri(_)
        | instant_acme::Error::Unsupported(_)
        | instant_acme::Error::Str(_) => {
            CapabilityError::permanent("acme-failed", format!("ACME: {e}"))
        }
        // The network, a timeout, or an answer garbled on the way (a proxy's error page).
        _ => CapabilityError::transient("unavailable", format!("the ACME server: {e}")),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Intent {
    names: Vec<String>,
    #[serde(default)]
    arn: Option<String>,
}

/// A stored certificate row.
struct Row_ {
    arn: String,
    names: Vec<String>,
    status: CertificateStatus,
    validation: Vec<RecordSet>,
    issued_ms: Option<i64>,
    key_sealed: Option<String>,
    kms_key_id: Option<String>,
}

fn status_text(s: CertificateStatus) -> &'static str {
    match s {
        CertificateStatus::PendingValidation => "pending-validation",
        CertificateStatus::Issued => "issued",
        CertificateStatus::Failed => "failed",
        CertificateStatus::Revoked => "revoked",
    }
}

fn status_of(text: &str) -> CertificateStatus {
    match text {
        "issued" => CertificateStatus::Issued,
        "failed" => CertificateStatus::Failed,
        "revoked" => CertificateStatus::Revoked,
        _ => CertificateStatus::PendingValidation,
    }
}

impl Row_ {
    fn view(&self) -> Certificate {
        Certificate {
            arn: self.arn.clone(),
            domain: self.names.first().cloned().unwrap_or_default(),
            subject_alternative_names: self.names.iter().skip(1).cloned().collect(),
            status: self.status,
            validation_records: self.validation.clone(),
            issued_at: self.issued_ms.and_then(|ms| u64::try_from(ms).ok()),
            in_use_by: Vec::new(),
        }
    }
}

impl Acme {
    pub async fn new(s: &AcmeSettings, node: &Node) -> Result<Self, SettingsError> {
        let c = Capability::Certificates;
        if !s.directory_url.starts_with("https://") {
            return Err(SettingsError::new(
                c,
                "directory_url",
                "must be an https:// URL (RFC 8555 §6.1)",
            ));
        }
        if let Some(contact) = &s.contact
            && !contact.starts_with("mailto:")
        {
            return Err(SettingsError::new(
                c,
                "contact",
                "must be a mailto: URL (mailto:ops@example.net)",
            ));
        }
        if let Some(ca) = &s.directory_ca_file
            && !ca.is_file()
        {
            return Err(SettingsError::new(
                c,
                "directory_ca_file",
                format!("{} is not a file", ca.display()),
            ));
        }
        if s.account_key_file.is_file() {
            let text = std::fs::read_to_string(&s.account_key_file).map_err(|e| {
                SettingsError::new(c, "account_key_file", format!("cannot read it: {e}"))
            })?;
            let _: AccountCredentials = serde_json::from_str(&text).map_err(|e| {
                SettingsError::new(
                    c,
                    "account_key_file",
                    format!("is not ACME account credentials: {e}"),
                )
            })?;
        } else if let Some(dir) = s.account_key_file.parent()
            && !dir.as_os_str().is_empty()
            && !dir.is_dir()
        {
            return Err(SettingsError::new(
                c,
                "account_key_file",
                format!("its directory {} does not exist", dir.display()),
            ));
        }
        Ok(Self {
            settings: s.clone(),
            account: Arc::new(OnceCell::new()),
            ledger: Ledger::new(node.store.writer().clone(), "acme"),
            keyring: node.keyring.clone(),
            clock: node.clock.clone(),
        })
    }

    fn now(&self) -> i64 {
        i64::try_from(self.clock.now_millis()).unwrap_or(i64::MAX)
    }

    fn builder(&self) -> Result<instant_acme::AccountBuilder, CapabilityError> {
        match &self.settings.directory_ca_file {
            Some(ca) => Account::builder_with_root(ca),
            None => Account::builder(),
        }
        .map_err(|e| CapabilityError::permanent("acme-client", e.to_string()))
    }

    /// The account: restored from `account_key_file`, or registered and written there (0600).
    async fn account(&self) -> Result<&Account, CapabilityError> {
        self.account
            .get_or_try_init(|| async {
                let path = &self.settings.account_key_file;
                if path.is_file() {
                    let text = std::fs::read_to_string(path).map_err(storage)?;
                    let credentials: AccountCredentials =
                        serde_json::from_str(&text).map_err(storage)?;
                    return self
                        .builder()?
                        .from_credentials(credentials)
                        .await
                        .map_err(acme_error);
                }
                let contact: Vec<&str> = self.settings.contact.iter().map(String::as_str).collect();
                let (account, credentials) = self
                    .builder()?
                    .create(
                        &NewAccount {
                            contact: &contact,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        self.settings.directory_url.clone(),
                        None,
                    )
                    .await
                    .map_err(acme_error)?;
                write_private(path, &serde_json::to_string(&credentials).map_err(storage)?)?;
                tracing::info!(account = account.id(), "registered an ACME account");
                Ok(account)
            })
            .await
    }

    async fn row(&self, arn: &str) -> Result<Option<Row_>, CapabilityError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM acme_certificates WHERE arn = $1"
        ))
        .bind(arn)
        .fetch_optional(self.ledger.pool())
        .await
        .map_err(storage)?;
        row.map(|r| decode(&r)).transpose()
    }

    async fn rows(&self) -> Result<Vec<Row_>, CapabilityError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM acme_certificates ORDER BY requested_ms"
        ))
        .fetch_all(self.ledger.pool())
        .await
        .map_err(storage)?;
        rows.iter().map(decode).collect()
    }

    async fn set_status(
        &self,
        arn: &str,
        status: CertificateStatus,
        error: Option<&str>,
    ) -> Result<(), CapabilityError> {
        sqlx::query("UPDATE acme_certificates SET status = $1, error = $2 WHERE arn = $3")
            .bind(status_text(status))
            .bind(error)
            .bind(arn)
            .execute(self.ledger.pool())
            .await
            .map_err(storage)?;
        Ok(())
    }

    async fn request(&self, request: &Value, token: &str) -> Answer {
        let domain = model::bare(&arg::<String>(request, "domain")?);
        let sans: Vec<String> = arg(request, "subject_alternative_names")?;
        let mut names = vec![domain.clone()];
        for n in sans.iter().map(|n| model::bare(n)) {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        if domain.is_empty() {
            return Err(CapabilityError::permanent(
                "invalid-request",
                "a certificate needs a domain name",
            ));
        }
        if !token.is_empty() {
            match self
                .ledger
                .get(token, "certificates.request-certificate", request)
                .await?
            {
                Some(Entry::Done(answer)) => return Ok(answer),
                Some(Entry::Intent(body)) => {
                    let intent: Intent = serde_json::from_value(body).map_err(storage)?;
                    if let Some(arn) = intent.arn
                        && let Some(row) = self.row(&arn).await?
                    {
                        // A crash after the order was stored: its validation records may not be.
                        let validation = if row.validation.is_empty() {
                            let account = self.account().await?;
                            let mut order = account.order(arn.clone()).await.map_err(acme_error)?;
                            Some(validation_of(&mut order).await?)
                        } else {
                            None
                        };
                        return self.answer_request(token, &arn, validation).await;
                    }
                }
                None => {}
            }
            self.ledger
                .intend(
                    token,
                    "certificates.request-certificate",
                    request,
                    &json!(Intent {
                        names: names.clone(),
                        arn: None
                    }),
                    self.now(),
                )
                .await?;
        }
        let account = self.account().await?;
        let identifiers: Vec<Identifier> = names.iter().cloned().map(Identifier::Dns).collect();
        let mut order = account
            .new_order(&NewOrder::new(&identifiers))
            .await
            .map_err(acme_error)?;
        let arn = order.url().to_owned();
        // The order exists at the CA: record it before anything else can fail.
        sqlx::query(
            "INSERT INTO acme_certificates (arn, token, domain, names, status, validation, requested_ms) VALUES ($1, $2, $3, $4, 'pending-validation', '[]', $5)",
        )
        .bind(&arn)
        .bind(token)
        .bind(&domain)
        .bind(serde_json::to_string(&names).map_err(storage)?)
        .bind(self.now())
        .execute(self.ledger.pool())
        .await
        .map_err(storage)?;
        if !token.is_empty() {
            self.ledger
                .intend(
                    token,
                    "certificates.request-certificate",
                    request,
                    &json!(Intent {
                        names: names.clone(),
                        arn: Some(arn.clone())
                    }),
                    self.now(),
                )
                .await?;
        }
        let validation = validation_of(&mut order).await?;
        self.answer_request(token, &arn, Some(validation)).await
    }

    /// Answers a request with the stored order, its validation records stored first when given.
    async fn answer_request(
        &self,
        token: &str,
        arn: &str,
        validation: Option<Vec<RecordSet>>,
    ) -> Answer {
        if let Some(validation) = validation {
            sqlx::query("UPDATE acme_certificates SET validation = $1 WHERE arn = $2")
                .bind(serde_json::to_string(&validation).map_err(storage)?)
                .bind(arn)
                .execute(self.ledger.pool())
                .await
                .map_err(storage)?;
        }
        let row = self
            .row(arn)
            .await?
            .ok_or_else(|| storage("the order just stored is gone"))?;
        let answer = serde_json::to_value(row.view()).map_err(storage)?;
        if !token.is_empty() {
            self.ledger
                .done(
                    token,
                    "certificates.request-certificate",
                    &answer,
                    self.now(),
                )
                .await?;
        }
        Ok(answer)
    }

    /// Whether every value of `set` is served by the check server (true when none is set).
    async fn resolves(&self, set: &RecordSet) -> bool {
        let Some(server) = &self.settings.check_dns_server else {
            return true;
        };
        match crate::rfc2136::txt_values(server, &set.name).await {
            Ok(values) => set.values.iter().all(|v| values.contains(v)),
            Err(e) => {
                tracing::debug!(error = %e, record = %set.name, "challenge record not readable yet");
                false
            }
        }
    }

    /// One step of the order behind `arn`, and the certificate as it stands after it.
    async fn describe(&self, arn: &str) -> Answer {
        let row = self.row(arn).await?.ok_or_else(|| {
            CapabilityError::permanent("not-found", format!("no certificate {arn}"))
        })?;
        if row.status != CertificateStatus::PendingValidation {
            return serde_json::to_value(row.view()).map_err(storage);
        }
        let account = self.account().await?;
        let mut order = account.order(arn.to_owned()).await.map_err(acme_error)?;
        let status = order.state().status;
        match status {
            OrderStatus::Pending => {
                let mut ready = Vec::new();
                for set in &row.validation {
                    if self.resolves(set).await {
                        ready.push(set.name.clone());
                    }
                }
                let mut authorizations = order.authorizations();
                while let Some(authz) = authorizations.next().await {
                    let mut authz = authz.map_err(acme_error)?;
                    if authz.status != AuthorizationStatus::Pending {
                        continue;
                    }
                    let Some(mut challenge) = authz.challenge(ChallengeType::Dns01) else {
                        continue;
                    };
                    let Identifier::Dns(host) = challenge.identifier().identifier.clone() else {
                        continue;
                    };
                    let record = format!("_acme-challenge.{}", model::bare(&host));
                    if challenge.status == ChallengeStatus::Pending && ready.contains(&record) {
                        challenge.set_ready().await.map_err(acme_error)?;
                    }
                }
            }
            OrderStatus::Ready => {
                // The key is sealed and stored before the CA sees the CSR: a crash after the
                // CA's answer must not leave a certificate whose key is lost.
                let key_pem = match &row.key_sealed {
                    Some(_) => self.open_key(&row)?,
                    None => {
                        let key = rcgen::KeyPair::generate().map_err(|e| {
                            CapabilityError::permanent("key-generation", e.to_string())
                        })?;
                        let pem = key.serialize_pem();
                        let (kms, sealed) = self.keyring.encrypt(pem.as_bytes(), arn.as_bytes());
                        sqlx::query("UPDATE acme_certificates SET key_sealed = $1, kms_key_id = $2 WHERE arn = $3")
                            .bind(&sealed)
                            .bind(&kms)
                            .bind(arn)
                            .execute(self.ledger.pool())
                            .await
                            .map_err(storage)?;
                        pem
                    }
                };
                let key = rcgen::KeyPair::from_pem(&key_pem)
                    .map_err(|e| CapabilityError::permanent("key-generation", e.to_string()))?;
                let mut params = rcgen::CertificateParams::new(row.names.clone())
                    .map_err(|e| CapabilityError::permanent("invalid-request", e.to_string()))?;
                params.distinguished_name = rcgen::DistinguishedName::new();
                let csr = params
                    .serialize_request(&key)
                    .map_err(|e| CapabilityError::permanent("key-generation", e.to_string()))?;
                order.finalize_csr(csr.der()).await.map_err(acme_error)?;
            }
            OrderStatus::Processing | OrderStatus::Valid => {
                if let Some(chain) = order.certificate().await.map_err(acme_error)? {
                    let (kms, sealed) = self.keyring.encrypt(chain.as_bytes(), arn.as_bytes());
                    sqlx::query(
                        "UPDATE acme_certificates SET status = 'issued', issued_ms = $1, chain_sealed = $2, kms_key_id = $3 WHERE arn = $4 AND status = 'pending-validation'",
                    )
                    .bind(self.now())
                    .bind(&sealed)
                    .bind(&kms)
                    .bind(arn)
                    .execute(self.ledger.pool())
                    .await
                    .map_err(storage)?;
                }
            }
            OrderStatus::Invalid => {
                let why = order
                    .state()
                    .error
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "the CA marked the order invalid".to_owned());
                self.set_status(arn, CertificateStatus::Failed, Some(&why))
                    .await?;
            }
        }
        let row = self.row(arn).await?.ok_or_else(|| {
            CapabilityError::permanent("not-found", format!("no certificate {arn}"))
        })?;
        serde_json::to_value(row.view()).map_err(storage)
    }

    fn open_key(&self, row: &Row_) -> Result<String, CapabilityError> {
        let (Some(kms), Some(sealed)) = (&row.kms_key_id, &row.key_sealed) else {
            return Err(storage("the certificate has no sealed key"));
        };
        let bytes = self
            .keyring
            .decrypt(kms, sealed, row.arn.as_bytes())
            .map_err(|e| CapabilityError::permanent("sealed", e.to_string()))?;
        String::from_utf8(bytes).map_err(storage)
    }

    async fn delete(&self, arn: &str) -> Answer {
        let row = self.row(arn).await?.ok_or_else(|| {
            CapabilityError::permanent("not-found", format!("no certificate {arn}"))
        })?;
        match row.status {
            CertificateStatus::Issued => {
                let chain = self.chain(&row).await?;
                let leaf = rustls_pki_types::CertificateDer::pem_slice_iter(chain.as_bytes())
                    .next()
                    .ok_or_else(|| storage("the stored chain has no certificate"))?
                    .map_err(storage)?;
                let account = self.account().await?;
                match account
                    .revoke(&RevocationRequest {
                        certificate: &leaf,
                        reason: Some(RevocationReason::CessationOfOperation),
                    })
                    .await
                {
                    Ok(()) => {}
                    // Revoked already (a repeat after a crash): nothing more to do.
                    Err(instant_acme::Error::Api(p))
                        if p.r#type
                            .as_deref()
                            .is_some_and(|t| t.ends_with(":alreadyRevoked")) => {}
                    Err(e) => return Err(acme_error(e)),
                }
                self.set_status(arn, CertificateStatus::Revoked, None)
                    .await?;
            }
            CertificateStatus::PendingValidation | CertificateStatus::Failed => {
                // Nothing was issued: the order expires at the CA by itself.
                sqlx::query("DELETE FROM acme_certificates WHERE arn = $1")
                    .bind(arn)
                    .execute(self.ledger.pool())
                    .await
                    .map_err(storage)?;
            }
            CertificateStatus::Revoked => {}
        }
        let mut view = row.view();
        if view.status == CertificateStatus::Issued {
            view.status = CertificateStatus::Revoked;
        }
        serde_json::to_value(view).map_err(storage)
    }

    async fn chain(&self, row: &Row_) -> Result<String, CapabilityError> {
        let r =
            sqlx::query("SELECT chain_sealed, kms_key_id FROM acme_certificates WHERE arn = $1")
                .bind(&row.arn)
                .fetch_one(self.ledger.pool())
                .await
                .map_err(storage)?;
        let sealed: Option<String> = r.try_get(0).map_err(storage)?;
        let kms: Option<String> = r.try_get(1).map_err(storage)?;
        let (Some(sealed), Some(kms)) = (sealed, kms) else {
            return Err(storage("the certificate has no stored chain"));
        };
        let bytes = self
            .keyring
            .decrypt(&kms, &sealed, row.arn.as_bytes())
            .map_err(|e| CapabilityError::permanent("sealed", e.to_string()))?;
        String::from_utf8(bytes).map_err(storage)
    }
}

/// The certificate chain and private key of an issued certificate, for an operator's export.
pub async fn export(
    store: &capstan_store::Store,
    keyring: &Keyring,
    arn: &str,
) -> Result<(String, String), String> {
    let r = sqlx::query(
        "SELECT chain_sealed, key_sealed, kms_key_id, status FROM acme_certificates WHERE arn = $1",
    )
    .bind(arn)
    .fetch_optional(store.writer())
    .await
    .map_err(|e| e.to_string())?
    .ok_or_else(|| format!("no ACME certificate {arn}"))?;
    let chain: Option<String> = r.try_get(0).map_err(|e| e.to_string())?;
    let key: Option<String> = r.try_get(1).map_err(|e| e.to_string())?;
    let kms: Option<String> = r.try_get(2).map_err(|e| e.to_string())?;
    let status: String = r.try_get(3).map_err(|e| e.to_string())?;
    let (Some(chain), Some(key), Some(kms)) = (chain, key, kms) else {
        return Err(format!(
            "certificate {arn} is {status}: it has no chain to export"
        ));
    };
    let open = |sealed: &str| -> Result<String, String> {
        let bytes = keyring
            .decrypt(&kms, sealed, arn.as_bytes())
            .map_err(|e| e.to_string())?;
        String::from_utf8(bytes).map_err(|e| e.to_string())
    };
    Ok((open(&chain)?, open(&key)?))
}

/// The order's validation records: one TXT record set per name, every dns-01 challenge value of
/// that name in it (a name and its wildcard share one).
async fn validation_of(order: &mut instant_acme::Order) -> Result<Vec<RecordSet>, CapabilityError> {
    let mut validation: Vec<RecordSet> = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(acme_error)?;
        let Some(challenge) = authz.challenge(ChallengeType::Dns01) else {
            return Err(CapabilityError::permanent(
                "acme-refused",
                "the CA offers no dns-01 challenge for a name of the order",
            ));
        };
        let Identifier::Dns(host) = challenge.identifier().identifier.clone() else {
            continue;
        };
        let record = format!("_acme-challenge.{}", model::bare(&host));
        let value = challenge.key_authorization().dns_value();
        match validation.iter_mut().find(|r| r.name == record) {
            Some(set) => {
                if !set.values.contains(&value) {
                    set.values.push(value);
                }
            }
            None => validation.push(RecordSet {
                name: record,
                type_: RecordType::Txt,
                ttl: Some(60),
                values: vec![value],
                alias_target: None,
            }),
        }
    }
    Ok(validation)
}

/// The columns [`decode`] reads, in its order (a macro, so statements stay static text).
macro_rules! columns {
    () => {
        "arn, names, status, validation, issued_ms, key_sealed, kms_key_id"
    };
}
use columns;

fn decode(r: &sqlx::any::AnyRow) -> Result<Row_, CapabilityError> {
    let names: String = r.try_get(1).map_err(storage)?;
    let status: String = r.try_get(2).map_err(storage)?;
    let validation: String = r.try_get(3).map_err(storage)?;
    Ok(Row_ {
        arn: r.try_get(0).map_err(storage)?,
        names: serde_json::from_str(&names).map_err(storage)?,
        status: status_of(&status),
        validation: serde_json::from_str(&validation).map_err(storage)?,
        issued_ms: r.try_get(4).map_err(storage)?,
        key_sealed: r.try_get(5).map_err(storage)?,
        kms_key_id: r.try_get(6).map_err(storage)?,
    })
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> Result<(), CapabilityError> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|e| {
        CapabilityError::permanent(
            "account-key-file",
            format!("cannot create {}: {e}", path.display()),
        )
    })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(storage)
}

#[async_trait]
impl Providers for Acme {
    async fn call(&self, op: &str, request: &Value, token: &str) -> Answer {
        match op {
            "certificates.request-certificate" => self.request(request, token).await,
            "certificates.describe-certificate" => {
                self.describe(&arg::<String>(request, "arn")?).await
            }
            "certificates.delete-certificate" => self.delete(&arg::<String>(request, "arn")?).await,
            "certificates.find-certificates" => {
                let domain = model::bare(&arg::<String>(request, "domain")?);
                let found: Vec<Certificate> = self
                    .rows()
                    .await?
                    .iter()
                    .filter(|r| r.names.iter().any(|n| model::covers(n, &domain)))
                    .map(Row_::view)
                    .collect();
                serde_json::to_value(found).map_err(storage)
            }
            other => Err(CapabilityError::permanent(
                "unsupported",
                format!("the acme provider has no operation {other}"),
            )),
        }
    }

    fn kind(&self) -> &'static str {
        "acme"
    }

    async fn reachable(&self) -> Result<(), String> {
        self.account().await.map(|_| ()).map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: &str, status: u16) -> instant_acme::Error {
        instant_acme::Error::Api(
            serde_json::from_value(json!({"type": kind, "detail": "no", "status": status}))
                .unwrap(),
        )
    }

    #[test]
    fn the_ca_s_refusals_are_permanent_and_its_troubles_transient() {
        for (kind, status, transient, code) in [
            (
                "urn:ietf:params:acme:error:rejectedIdentifier",
                400,
                false,
                "acme-refused",
            ),
            (
                "urn:ietf:params:acme:error:unauthorized",
                403,
                false,
                "acme-refused",
            ),
            (
                "urn:ietf:params:acme:error:malformed",
                400,
                false,
                "acme-refused",
            ),
            (
                "urn:ietf:params:acme:error:badNonce",
                400,
                true,
                "unavailable",
            ),
            (
                "urn:ietf:params:acme:error:rateLimited",
                429,
                true,
                "unavailable",
            ),
            (
                "urn:ietf:params:acme:error:serverInternal",
                500,
                true,
                "unavailable",
            ),
            ("about:blank", 503, true, "unavailable"),
        ] {
            let e = acme_error(problem(kind, status));
            assert_eq!(e.is_transient(), transient, "{kind}: {e:?}");
            assert_eq!(e.code, code, "{kind}");
            assert!(e.message.contains("no"), "the CA's detail is kept: {e:?}");
        }
    }

    #[test]
    fn the_network_is_transient_and_what_no_retry_mends_is_permanent() {
        let network = acme_error(instant_acme::Error::Other(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ))));
        assert!(network.is_transient(), "{network:?}");
        for e in [
            instant_acme::Error::KeyRejected,
            instant_acme::Error::Unsupported("profiles"),
            instant_acme::Error::Crypto,
        ] {
            let e = acme_error(e);
            assert!(!e.is_transient(), "{e:?}");
            assert_eq!(e.code, "acme-failed");
        }
    }
}
