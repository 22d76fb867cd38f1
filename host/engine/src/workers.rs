//! Workers: claiming due runs under leases, the scheduler's slots, and the loops `capstan serve`
//! spawns (claimers woken by triggers and by other nodes, runs started eagerly by triggers).

use super::*;

impl Engine {
    /// Claims due runs and activates them, one after the other; returns how many ran.
    pub async fn run_once(&self) -> Result<usize, EngineError> {
        let now = self.now();
        let runs = self
            .inner
            .store
            .claim_runs(
                &self.inner.config.node_id,
                now,
                self.inner.config.lease_ms,
                8,
            )
            .await?;
        let n = runs.len();
        for run in runs {
            self.activate(run, None).await;
        }
        Ok(n)
    }

    /// Runs due work until none is left (tests and tools; servers use [`Engine::spawn_workers`]).
    pub async fn run_until_idle(&self) -> Result<usize, EngineError> {
        let mut total = 0;
        loop {
            let n = self.run_once().await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }

    /// Starts the node's scheduler: one claimer that takes due runs in batches (as many as there
    /// are free worker slots) and activates each on its own task, at most `config.workers` at
    /// once, until `shutdown` flips. One claimer per node keeps idle polling off SQLite's single
    /// writer; a trigger or command wakes it at once. A trigger that finds a slot free starts its
    /// run itself ([`EagerStart`]) and the claimer only takes the task over.
    pub fn spawn_workers(
        &self,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let engine = self.clone();
        let workers = self.inner.config.workers.max(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(workers));
        let (runs, mut started) = tokio::sync::mpsc::unbounded_channel::<Started>();
        *self
            .inner
            .eager
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(EagerStart {
            slots: slots.clone(),
            runs,
        });
        let handle = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            // Whether runs may be due that no claim has taken yet: set by a wake-up or a poll,
            // cleared by a claim that found fewer than it could take. A slot that frees up
            // claims only then (with triggers starting their own runs, most finished tasks
            // leave nothing behind to claim).
            let mut backlog = true;
            'claims: loop {
                if *shutdown.borrow() {
                    break;
                }
                // Listen for wake-ups before claiming, so a trigger that lands while the claim
                // runs is not missed (it would otherwise wait for the next poll).
                let woken = engine.inner.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                // The slots are taken before the claim, so a trigger cannot take one between
                // the claim and its run's start (the claimer must never wait for a slot: the
                // runs that would free one may be waiting in its own inbox).
                let permits: Vec<_> = if backlog {
                    std::iter::from_fn(|| slots.clone().try_acquire_owned().ok()).collect()
                } else {
                    Vec::new()
                };
                let free = permits.len();
                if free > 0 {
                    let now = engine.now();
                    match engine
                        .inner
                        .store
                        .claim_runs(
                            &engine.inner.config.node_id,
                            now,
                            engine.inner.config.lease_ms,
                            free as i64,
                        )
                        .await
                    {
                        Ok(runs) => {
                            // Fewer than asked for: nothing else is due now, so wait for a
                            // wake-up instead of claiming again at once (an empty claim is
                            // still a write statement on SQLite's single writer).
                            backlog = runs.len() >= free;
                            for (run, permit) in runs.into_iter().zip(permits) {
                                let engine = engine.clone();
                                tasks.spawn(async move {
                                    engine.activate(run, None).await;
                                    drop(permit);
                                });
                            }
                            if backlog {
                                continue;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "claiming runs failed; retrying"),
                    }
                }
                let poll = tokio::time::sleep(engine.inner.config.poll);
                tokio::pin!(poll);
                loop {
                    tokio::select! {
                        () = &mut poll => backlog = true,
                        () = &mut woken => backlog = true,
                        // Also when the sender is gone (a panicking owner): that means stop
                        // too, and waiting on a closed channel would return at once, forever.
                        _ = shutdown.wait_for(|s| *s) => break 'claims,
                        Some(_) = tasks.join_next() => {}
                        Some(Started { run, execution, permit }) = started.recv() => {
                            let engine = engine.clone();
                            tasks.spawn(async move {
                                engine.activate(run, Some(execution)).await;
                                drop(permit);
                            });
                            continue;
                        }
                    }
                    continue 'claims;
                }
            }
            // Triggers stop handing runs over; those already handed over run like claimed ones.
            started.close();
            while let Ok(Started {
                run,
                execution,
                permit,
            }) = started.try_recv()
            {
                let engine = engine.clone();
                tasks.spawn(async move {
                    engine.activate(run, Some(execution)).await;
                    drop(permit);
                });
            }
            while tasks.join_next().await.is_some() {}
        });
        vec![handle]
    }
}
