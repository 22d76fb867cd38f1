//! The token ledger of real providers (`provider_effects`): what a side effect under an engine
//! token is about to do (`intent`, written before the provider hears of it) and what the provider
//! answered (`done`). A repeated token reads its row first: `done` is answered again, `intent`
//! is finished from what it recorded (the adapter checks what the provider already did), so a
//! crash between the provider's answer and the engine's commit never does a change twice.

use capstan_core::CapabilityError;
use serde_json::Value;
use sqlx::{AnyPool, Row};

/// What the ledger holds for a token.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// Recorded before the provider was asked; the provider may or may not have acted.
    Intent(Value),
    /// The provider's answer, to be given again.
    Done(Value),
}

#[derive(Debug, Clone)]
pub struct Ledger {
    pool: AnyPool,
    provider: &'static str,
}

pub(crate) fn storage(e: impl std::fmt::Display) -> CapabilityError {
    CapabilityError::transient("unavailable", format!("Capstan's own storage failed: {e}"))
}

impl Ledger {
    pub fn new(pool: AnyPool, provider: &'static str) -> Self {
        Self { pool, provider }
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub async fn get(&self, token: &str) -> Result<Option<Entry>, CapabilityError> {
        let row = sqlx::query("SELECT state, body FROM provider_effects WHERE token = $1")
            .bind(token)
            .fetch_optional(&self.pool)
            .await
            .map_err(storage)?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get(0).map_err(storage)?;
        let body: String = row.try_get(1).map_err(storage)?;
        let body: Value = serde_json::from_str(&body).map_err(storage)?;
        Ok(Some(if state == "done" {
            Entry::Done(body)
        } else {
            Entry::Intent(body)
        }))
    }

    /// Records the intent of `token` (replacing an earlier intent; never a `done`).
    pub async fn intend(
        &self,
        token: &str,
        op: &str,
        body: &Value,
        now_ms: i64,
    ) -> Result<(), CapabilityError> {
        sqlx::query(
            "INSERT INTO provider_effects (token, provider, op, state, body, at_ms) VALUES ($1, $2, $3, 'intent', $4, $5)
             ON CONFLICT (token) DO UPDATE SET body = excluded.body, at_ms = excluded.at_ms
             WHERE provider_effects.state = 'intent'",
        )
        .bind(token)
        .bind(self.provider)
        .bind(op)
        .bind(body.to_string())
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(storage)?;
        Ok(())
    }

    /// Records the answer of `token`.
    pub async fn done(
        &self,
        token: &str,
        op: &str,
        answer: &Value,
        now_ms: i64,
    ) -> Result<(), CapabilityError> {
        sqlx::query(
            "INSERT INTO provider_effects (token, provider, op, state, body, at_ms) VALUES ($1, $2, $3, 'done', $4, $5)
             ON CONFLICT (token) DO UPDATE SET state = 'done', body = excluded.body, at_ms = excluded.at_ms",
        )
        .bind(token)
        .bind(self.provider)
        .bind(op)
        .bind(answer.to_string())
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(storage)?;
        Ok(())
    }

    /// Forgets an intent the provider refused, so the next attempt starts afresh.
    pub async fn forget(&self, token: &str) -> Result<(), CapabilityError> {
        sqlx::query("DELETE FROM provider_effects WHERE token = $1 AND state = 'intent'")
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(storage)?;
        Ok(())
    }
}
