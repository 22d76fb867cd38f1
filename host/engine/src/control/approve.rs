//! `approve`: resolves the approval a waiting run published, if the digest is current.

use crate::*;
use capstan_core::transitions::{Facts, On};

impl Engine {
    /// Approves the approval the execution waits on; `digest` must be the one the workflow
    /// published (a stale digest is refused with the current one).
    pub async fn approve(
        &self,
        id: &str,
        digest: &str,
        body: Value,
    ) -> Result<ExecutionRecord, EngineError> {
        let execution = self.get(id).await?;
        let wait = self
            .inner
            .store
            .waits(&execution.run_id)
            .await?
            .into_iter()
            .rev()
            .find(|w| w.kind == WaitKind::Approval);
        let current = wait
            .as_ref()
            .and_then(|w| w.digest.clone())
            .unwrap_or_default();
        let facts = Facts {
            no_approval_wait: wait.is_none(),
            already_approved: wait.as_ref().is_some_and(|w| w.resolved_json.is_some()),
            stale_digest: current != digest,
            ..Facts::default()
        };
        let status = execution.status;
        let decided = super::decide(On::Approve, status, &facts, |reason| match reason {
            "already_approved" => "the approval was already given".to_owned(),
            "not_waiting" if status == ExecutionStatus::Waiting => {
                "the execution is not waiting for an approval".to_owned()
            }
            _ => format!(
                "execution is {status}; a plan can only be approved while the execution waits for it"
            ),
        });
        let wait = match (decided, wait) {
            (Ok(_), Some(wait)) => wait,
            // The stale hash is answered with the current one.
            (
                Err(EngineError::StateInvalid {
                    reason: "stale_plan_hash",
                    ..
                }),
                _,
            ) => {
                return Err(EngineError::StaleApproval { current });
            }
            (Err(e), _) => return Err(e),
            (Ok(_), None) => return Err(invalid("not_waiting", "no approval is awaited")),
        };
        let now = self.now();
        self.inner
            .apply(
                None,
                vec![
                    Write::PutWait(WaitRecord {
                        resolved_json: Some(body),
                        ..wait
                    }),
                    Write::UpdateRun(RunPatch {
                        id: execution.run_id.clone(),
                        state: Some(RunState::Runnable),
                        wake_ms: Some(now),
                        ..RunPatch::default()
                    }),
                ],
            )
            .await?;
        self.get(id).await
    }

    /// The approval the execution waits on: (name, digest, payload), if any.
    pub async fn pending_approval(&self, id: &str) -> Result<Option<WaitRecord>, EngineError> {
        let execution = self.get(id).await?;
        let waits = self.inner.store.waits(&execution.run_id).await?;
        Ok(waits
            .into_iter()
            .rev()
            .find(|w| w.kind == WaitKind::Approval))
    }
}
