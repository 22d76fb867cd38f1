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
            self.activate(run, None, None).await;
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
    /// once, until `shutdown` flips. One claimer per node keeps claims off SQLite's single
    /// writer; a commit of this node that makes a run due wakes it at once ([`schedule`]). A
    /// trigger that finds a slot free starts its run itself ([`EagerStart`]) and the claimer
    /// only takes the task over.
    ///
    /// Between claims the claimer sleeps until the earliest run it knows of falls due: the
    /// store's earliest wake time, read after a claim that came up short; the runs this node's
    /// commits scheduled since; and at most [`EngineConfig::idle_poll`], for due runs no one
    /// announced. `others` changes when another node commits (PostgreSQL's `NOTIFY`): the
    /// claimer then claims, at most once per [`EngineConfig::poll`].
    pub fn spawn_workers(
        &self,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        others: Option<tokio::sync::watch::Receiver<u64>>,
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
            use tokio::time::Instant;
            let config = &engine.inner.config;
            let schedule = &engine.inner.schedule;
            // No other node's commits to hear of: a receiver that never changes.
            let (_no_others, quiet) = tokio::sync::watch::channel(0);
            let mut others = others.unwrap_or(quiet);
            let mut others_open = true;
            let mut tasks = tokio::task::JoinSet::new();
            // Whether runs may be due that no claim has taken yet: set by a wake-up or the
            // alarm, cleared by a claim that found fewer than it could take. A slot that frees
            // up claims only then (with triggers starting their own runs, most finished tasks
            // leave nothing behind to claim).
            let mut backlog = true;
            // When the earliest run the claimer knows of falls due; once it has passed, the
            // next claim that comes up short reads the store's next one.
            let mut alarm = Instant::now();
            let mut last_claim = Instant::now();
            // A clock time as an instant of the runtime's timer (in the past: now; at most a
            // day ahead, so a wake time far off cannot overflow the timer, and the alarm is
            // never later than `idle_poll` anyway once the store has been read).
            let at = |ms: Millis| {
                let wait = u64::try_from(ms.saturating_sub(engine.now())).unwrap_or(0);
                Instant::now() + Duration::from_millis(wait.min(86_400_000))
            };
            'claims: loop {
                if *shutdown.borrow() {
                    break;
                }
                // Listen for wake-ups before claiming, so a commit that lands while the claim
                // runs is not missed (it would otherwise wait for the alarm). A wake-up kept
                // since the last turn is taken here, and `enable`'s answer is then its only
                // record: the future would drop it with itself if another branch of the wait
                // below (a finished task, an announcement) ended the turn first.
                let woken = schedule.now.notified();
                tokio::pin!(woken);
                if woken.as_mut().enable() {
                    backlog = true;
                }
                let sooner = schedule.sooner.notified();
                tokio::pin!(sooner);
                sooner.as_mut().enable();
                if let Some(next) = schedule.take_next() {
                    alarm = alarm.min(at(next));
                }
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
                    last_claim = Instant::now();
                    let now = engine.now();
                    match engine
                        .inner
                        .store
                        .claim_runs(&config.node_id, now, config.lease_ms, free as i64)
                        .await
                    {
                        Ok(runs) => {
                            // Fewer than asked for: nothing else is due now, so wait for a
                            // wake-up or the alarm instead of claiming again at once (an empty
                            // claim is still a write statement).
                            backlog = runs.len() >= free;
                            for (run, permit) in runs.into_iter().zip(permits) {
                                let engine = engine.clone();
                                tasks.spawn(async move {
                                    engine.activate(run, None, None).await;
                                    drop(permit);
                                });
                            }
                            if backlog {
                                continue;
                            }
                            if alarm <= Instant::now() {
                                // What the alarm was set for has been claimed: the store
                                // tells when the next run falls due (a read, not a claim).
                                let idle = Instant::now() + config.idle_poll;
                                alarm = match engine.inner.store.next_wake().await {
                                    // A millisecond late: a lease expiring at `ms` is
                                    // claimable only after it.
                                    Ok(Some(ms)) => idle.min(at(ms.saturating_add(1))),
                                    Ok(None) => idle,
                                    Err(e) => {
                                        tracing::warn!(error = %e, "reading when runs fall due failed; retrying");
                                        Instant::now() + config.poll
                                    }
                                };
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "claiming runs failed; retrying");
                            // The alarm retries.
                            backlog = false;
                            alarm = Instant::now() + config.poll;
                        }
                    }
                }
                let sleep = tokio::time::sleep_until(alarm);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        // With a backlog every slot is taken: a slot that frees claims.
                        () = &mut sleep, if !backlog => backlog = true,
                        () = &mut woken => backlog = true,
                        // Sets the alarm again, at the top of the loop.
                        () = &mut sooner => {}
                        changed = others.changed(), if others_open => {
                            if changed.is_err() {
                                others_open = false;
                                continue;
                            }
                            // Another node's commit may have made runs due: claim, though
                            // not more often than `poll` while they keep committing.
                            alarm = alarm.min(last_claim + config.poll);
                        }
                        // Also when the sender is gone (a panicking owner): that means stop
                        // too, and waiting on a closed channel would return at once, forever.
                        _ = shutdown.wait_for(|s| *s) => break 'claims,
                        Some(_) = tasks.join_next() => {}
                        Some(Started { run, execution, permit, ahead }) = started.recv() => {
                            let engine = engine.clone();
                            tasks.spawn(async move {
                                engine.activate(run, Some(execution), ahead).await;
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
                ahead,
            }) = started.try_recv()
            {
                let engine = engine.clone();
                tasks.spawn(async move {
                    engine.activate(run, Some(execution), ahead).await;
                    drop(permit);
                });
            }
            while tasks.join_next().await.is_some() {}
        });
        vec![handle]
    }
}
