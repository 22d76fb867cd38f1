//! Partners and their keys (`pk_…` production, `tk_…` sandbox). The key is shown once; the store
//! keeps its prefix (for lookup) and a peppered HMAC (computed by the API layer, like API keys).

use crate::{BookingError, Bookings, Environment};
use sqlx::Row;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartnerType {
    /// Catalog routes only.
    Affiliate,
    /// Catalog, inventory, bookings and webhooks.
    Booking,
}

impl PartnerType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Affiliate => "affiliate",
            Self::Booking => "booking",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "affiliate" => Some(Self::Affiliate),
            "booking" => Some(Self::Booking),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PartnerRecord {
    pub id: String,
    pub name: String,
    pub partner_type: PartnerType,
    pub environment: Environment,
    pub key_prefix: String,
    pub key_hash: String,
    pub pepper_version: i64,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
}

fn from_row(r: &sqlx::any::AnyRow) -> PartnerRecord {
    PartnerRecord {
        id: r.get("id"),
        name: r.get("name"),
        partner_type: PartnerType::parse(r.get::<&str, _>("partner_type"))
            .unwrap_or(PartnerType::Affiliate),
        environment: Environment::parse(r.get::<&str, _>("environment"))
            .unwrap_or(Environment::Sandbox),
        key_prefix: r.get("key_prefix"),
        key_hash: r.get("key_hash"),
        pepper_version: r.get("pepper_version"),
        created_ms: r.get("created_ms"),
        revoked_ms: r.get("revoked_ms"),
    }
}

const SELECT: &str = "SELECT id, name, partner_type, environment, key_prefix, key_hash, pepper_version, created_ms, revoked_ms FROM partners";

impl Bookings {
    pub async fn insert_partner(&self, p: &PartnerRecord) -> Result<(), BookingError> {
        sqlx::query(
            "INSERT INTO partners (id, name, partner_type, environment, key_prefix, key_hash, pepper_version, created_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&p.id)
        .bind(&p.name)
        .bind(p.partner_type.as_str())
        .bind(p.environment.as_str())
        .bind(&p.key_prefix)
        .bind(&p.key_hash)
        .bind(p.pepper_version)
        .bind(p.created_ms)
        .execute(self.store().writer())
        .await?;
        Ok(())
    }

    /// Live partners whose key starts with `prefix` (the caller verifies the hash).
    pub async fn partners_by_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<PartnerRecord>, BookingError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT} WHERE key_prefix = $1 AND revoked_ms IS NULL"
        )))
        .bind(prefix)
        .fetch_all(self.store().pool())
        .await?;
        Ok(rows.iter().map(from_row).collect())
    }

    pub async fn list_partners(&self) -> Result<Vec<PartnerRecord>, BookingError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!("{SELECT} ORDER BY created_ms")))
            .fetch_all(self.store().pool())
            .await?;
        Ok(rows.iter().map(from_row).collect())
    }

    /// Revokes a partner's key; `false` if there is no such live partner.
    pub async fn revoke_partner(&self, id: &str) -> Result<bool, BookingError> {
        let done =
            sqlx::query("UPDATE partners SET revoked_ms = $1 WHERE id = $2 AND revoked_ms IS NULL")
                .bind(self.now_ms())
                .bind(id)
                .execute(self.store().writer())
                .await?;
        Ok(done.rows_affected() == 1)
    }
}
