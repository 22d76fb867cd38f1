//! The token ledger of real providers (`provider_effects`): what a side effect under an engine
//! token is about to do (`intent`, written before the provider hears of it) and what the provider
//! answered (`done`). A repeated token reads its row first: `done` is answered again, `intent`
//! is finished from what it recorded (the adapter checks what the provider already did), so a
//! crash between the provider's answer and the engine's commit never does a change twice. A
//! token is bound to the call it was first used for (operation and request digest): another
//! call under it is refused, never answered with the first one's result.

use capstan_core::CapabilityError;
use capstan_core::providers::call_digest;
use capstan_core::store::json_string;
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

    /// What the ledger holds for `token`, which must have been first used for this `op` and
    /// `request`: another call under it is refused ([`CapabilityError::token_reused`]).
    pub async fn get(
        &self,
        token: &str,
        op: &str,
        request: &Value,
    ) -> Result<Option<Entry>, CapabilityError> {
        let row = sqlx::query(
            "SELECT state, body, op, request_digest FROM provider_effects WHERE token = $1",
        )
        .bind(token)
        .fetch_optional(&self.pool)
        .await
        .map_err(storage)?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get(0).map_err(storage)?;
        let body: String = row.try_get(1).map_err(storage)?;
        let first_op: String = row.try_get(2).map_err(storage)?;
        let digest: Option<String> = row.try_get(3).map_err(storage)?;
        if first_op != op || digest.is_some_and(|d| d != call_digest(op, request)) {
            return Err(CapabilityError::token_reused(op, &first_op));
        }
        let body: Value = serde_json::from_str(&body).map_err(storage)?;
        Ok(Some(if state == "done" {
            Entry::Done(body)
        } else {
            Entry::Intent(body)
        }))
    }

    /// Records the intent of `token` for `op` with `request` (replacing an earlier intent;
    /// never a `done`).
    pub async fn intend(
        &self,
        token: &str,
        op: &str,
        request: &Value,
        body: &Value,
        now_ms: i64,
    ) -> Result<(), CapabilityError> {
        sqlx::query(
            "INSERT INTO provider_effects (token, provider, op, state, body, at_ms, request_digest) VALUES ($1, $2, $3, 'intent', $4, $5, $6)
             ON CONFLICT (token) DO UPDATE SET body = excluded.body, at_ms = excluded.at_ms
             WHERE provider_effects.state = 'intent'",
        )
        .bind(token)
        .bind(self.provider)
        .bind(op)
        .bind(json_string(body))
        .bind(now_ms)
        .bind(call_digest(op, request))
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
        .bind(json_string(answer))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_token_answers_only_the_call_it_was_first_used_for() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            capstan_store::Store::open(&capstan_testdb::fresh_database_url(dir.path()).await)
                .await
                .unwrap();
        let ledger = Ledger::new(store.pool().clone(), "test");
        let op = "dns.change-records";
        let request = json!({"zone_id": "example.com.", "changes": [{"Delete": {"name": "a"}}]});
        let other = json!({"zone_id": "example.com.", "changes": [{"Delete": {"name": "b"}}]});
        assert_eq!(ledger.get("t1", op, &request).await.unwrap(), None);
        ledger
            .intend("t1", op, &request, &json!({"step": 1}), 10)
            .await
            .unwrap();
        assert_eq!(
            ledger.get("t1", op, &request).await.unwrap(),
            Some(Entry::Intent(json!({"step": 1})))
        );
        ledger
            .done("t1", op, &json!({"change_id": "C1"}), 11)
            .await
            .unwrap();
        assert_eq!(
            ledger.get("t1", op, &request).await.unwrap(),
            Some(Entry::Done(json!({"change_id": "C1"})))
        );
        for (op, request) in [(op, &other), ("certificates.request-certificate", &request)] {
            let refused = ledger.get("t1", op, request).await.unwrap_err();
            assert!(refused.is_token_reused(), "{refused:?}");
        }
    }
}
