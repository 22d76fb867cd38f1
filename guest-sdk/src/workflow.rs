//! What a workflow is to the SDK: a [`Workflow`] type with a [`Descriptor`] and a `run` function
//! over a [`Ctx`]. The export glue (`describe`, `run`) converts between JSON on the WIT boundary
//! and the workflow's typed input and output.

use crate::Error;
use crate::bindings::workflow::capstan::platform::descriptor as wit;
use crate::host::{self, platform};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::bindings::workflow::capstan::platform::context::ExecutionInfo;
pub use crate::bindings::workflow::capstan::platform::types::LogLevel;

/// How the host cancels a run of this workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CancelMode {
    /// Stopped by the host at its next host call or while it waits (the default).
    #[default]
    Immediate,
    /// The host records the request; the workflow checks [`Ctx::cancellation_requested`] at its
    /// safe points and decides.
    Cooperative,
}

/// A workflow's self-description, exported with the component so one `.wasm` is deployable.
#[derive(Debug, Clone)]
pub struct Descriptor {
    name: &'static str,
    version: &'static str,
    description: &'static str,
    stages: &'static [&'static str],
    estimated_duration_seconds: u32,
    recovery: Vec<Recovery>,
    cancel_mode: CancelMode,
    resumable_when_failed: bool,
    point_of_no_return: Option<&'static str>,
    rollback_requires_terminal: bool,
}

/// A recovery operation (`retry-finalization`, say): re-runs a finished run from `from_stage`,
/// with the outputs of every earlier stage replayed rather than repeated, for executions in one
/// of `from_statuses` (and, with [`Recovery::when_outcome`], whose outcome says so).
#[derive(Debug, Clone)]
pub struct Recovery {
    name: &'static str,
    from_stage: &'static str,
    from_statuses: &'static [&'static str],
    when_outcome: Option<(&'static str, &'static str)>,
}

impl Recovery {
    pub fn new(
        name: &'static str,
        from_stage: &'static str,
        from_statuses: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            from_stage,
            from_statuses,
            when_outcome: None,
        }
    }

    /// Only while the outcome holds the string `equals` at the JSON pointer `pointer`.
    pub fn when_outcome(mut self, pointer: &'static str, equals: &'static str) -> Self {
        self.when_outcome = Some((pointer, equals));
        self
    }
}

impl Descriptor {
    /// `name` is the workflow's route (`POST /v1/workflows/{name}`); `version` its build version.
    pub fn new(name: &'static str, version: &'static str) -> Self {
        Self {
            name,
            version,
            description: "",
            stages: &[],
            estimated_duration_seconds: 60,
            recovery: Vec::new(),
            cancel_mode: CancelMode::Immediate,
            resumable_when_failed: false,
            point_of_no_return: None,
            rollback_requires_terminal: false,
        }
    }

    pub fn description(mut self, text: &'static str) -> Self {
        self.description = text;
        self
    }

    /// The stages, in order, as the trigger response lists them. [`Ctx::stage`] refuses others.
    pub fn stages(mut self, stages: &'static [&'static str]) -> Self {
        self.stages = stages;
        self
    }

    pub fn estimated_duration_seconds(mut self, seconds: u32) -> Self {
        self.estimated_duration_seconds = seconds;
        self
    }

    /// Declares a recovery operation; the host offers it only where it applies.
    pub fn recovery(mut self, recovery: Recovery) -> Self {
        self.recovery.push(recovery);
        self
    }

    /// Rollback only once the execution is terminal, never while it is paused (a paused run may
    /// still be resumed and publish more).
    pub fn rollback_requires_terminal(mut self, yes: bool) -> Self {
        self.rollback_requires_terminal = yes;
        self
    }

    pub fn cancel_mode(mut self, mode: CancelMode) -> Self {
        self.cancel_mode = mode;
        self
    }

    /// Lets `resume` re-queue a failed or canceled run (not only a paused one).
    pub fn resumable_when_failed(mut self, yes: bool) -> Self {
        self.resumable_when_failed = yes;
        self
    }

    /// Once `stage` has begun, cancel is refused with 409 `state_invalid` (add-subdomain after the
    /// DNS service accepted its change, say).
    pub fn point_of_no_return(mut self, stage: &'static str) -> Self {
        self.point_of_no_return = Some(stage);
        self
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn stage_names(&self) -> &'static [&'static str] {
        self.stages
    }
}

/// A workflow: typed input, typed output, and the process between them.
///
/// ```ignore
/// struct Hello;
/// impl Workflow for Hello {
///     type Input = HelloInput;
///     type Output = HelloOutput;
///     fn descriptor() -> Descriptor { Descriptor::new("hello", "0.1.0").stages(&["greet"]) }
///     fn run(ctx: &mut Ctx, input: HelloInput) -> Result<HelloOutput, Error> {
///         ctx.stage("greet", |_| Ok(HelloOutput { greeting: format!("hello, {}", input.name) }))
///     }
/// }
/// capstan_sdk::export_workflow!(Hello);
/// ```
pub trait Workflow {
    /// The trigger body; its JSON Schema is published as the workflow's input schema.
    type Input: DeserializeOwned + schemars::JsonSchema;
    /// The execution's output.
    type Output: Serialize;

    fn descriptor() -> Descriptor;

    /// The process. Runs again from the top on every replay: keep it deterministic and let every
    /// effect go through `ctx` (time, sleeps, capabilities), which the host answers from its journal.
    fn run(ctx: &mut Ctx, input: Self::Input) -> Result<Self::Output, Error>;
}

/// The workflow's handle on the host.
#[derive(Debug)]
pub struct Ctx {
    stages: &'static [&'static str],
}

impl Ctx {
    /// Runs `body` as the named stage: the stage opens, and closes `succeeded` with the body's
    /// output as its `outputJson`, or `failed` with the error as its `errorJson`.
    pub fn stage<T: Serialize>(
        &mut self,
        name: &str,
        body: impl FnOnce(&mut Ctx) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if !self.stages.contains(&name) {
            return Err(Error::permanent(
                "undeclared-stage",
                format!(
                    "stage `{name}` is not in the workflow's descriptor ({:?})",
                    self.stages
                ),
            ));
        }
        platform::stage_begin(name);
        match body(self) {
            Ok(value) => {
                let output = serde_json::to_string(&value).ok();
                platform::stage_succeeded(name, output.as_deref());
                Ok(value)
            }
            Err(error) => {
                platform::stage_failed(name, &error);
                Err(error)
            }
        }
    }

    /// Execution, run, workflow and principal ids.
    pub fn info(&self) -> ExecutionInfo {
        platform::info()
    }

    /// Durable now, in milliseconds since the Unix epoch (recorded once, replayed after).
    pub fn now_millis(&self) -> u64 {
        platform::now()
    }

    /// Sleeps durably; the instance is released while the timer runs.
    pub fn sleep(&self, duration: std::time::Duration) {
        platform::sleep(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn log(&self, level: LogLevel, message: &str) {
        platform::log(level, message)
    }

    /// Appends a custom event to the execution's outbox.
    pub fn emit(&self, event_type: &str, payload: &impl Serialize) -> Result<(), Error> {
        let payload = serde_json::to_string(payload)
            .map_err(|e| Error::permanent("invalid-payload", e.to_string()))?;
        platform::emit(event_type, &payload);
        Ok(())
    }

    /// True once a cooperative cancel was requested.
    pub fn cancellation_requested(&self) -> bool {
        platform::cancellation_requested()
    }

    /// Publishes `payload` for approval under `name` and waits durably; an approver must echo
    /// `digest`. Returns the approval body.
    pub fn await_approval(
        &self,
        name: &str,
        digest: &str,
        payload: &impl Serialize,
    ) -> Result<serde_json::Value, Error> {
        let payload = serde_json::to_string(payload)
            .map_err(|e| Error::permanent("invalid-payload", e.to_string()))?;
        let body = platform::await_approval(name, digest, &payload)?;
        serde_json::from_str(&body).map_err(|e| Error::permanent("invalid-approval", e.to_string()))
    }

    pub fn dns(&self) -> host::dns::Dns {
        host::dns::Dns
    }
    pub fn registrar(&self) -> host::registrar::Registrar {
        host::registrar::Registrar
    }
    pub fn certificates(&self) -> host::certificates::Certificates {
        host::certificates::Certificates
    }
    pub fn cdn(&self) -> host::cdn::Cdn {
        host::cdn::Cdn
    }
    pub fn maps(&self) -> host::maps::Maps {
        host::maps::Maps
    }
    pub fn functions(&self) -> host::functions::Functions {
        host::functions::Functions
    }
    pub fn ticketing(&self) -> host::ticketing::Ticketing {
        host::ticketing::Ticketing
    }
    pub fn convergence(&self) -> host::convergence::Convergence {
        host::convergence::Convergence
    }
}

/// The exported `describe`.
pub fn describe<W: Workflow>() -> wit::WorkflowDescriptor {
    let d = W::descriptor();
    let schema = schemars::schema_for!(W::Input);
    wit::WorkflowDescriptor {
        name: d.name.to_owned(),
        version: d.version.to_owned(),
        description: d.description.to_owned(),
        stages: d.stages.iter().map(|s| (*s).to_owned()).collect(),
        estimated_duration_seconds: d.estimated_duration_seconds,
        input_schema: serde_json::to_string(&schema).unwrap_or_else(|_| "{}".to_owned()),
        recovery_operations: d
            .recovery
            .iter()
            .map(|r| wit::RecoveryOperation {
                name: r.name.to_owned(),
                from_stage: r.from_stage.to_owned(),
                from_statuses: r.from_statuses.iter().map(|s| (*s).to_owned()).collect(),
                when_outcome: r
                    .when_outcome
                    .map(|(pointer, equals)| wit::OutcomeCondition {
                        pointer: pointer.to_owned(),
                        equals: equals.to_owned(),
                    }),
            })
            .collect(),
        cancel_mode: match d.cancel_mode {
            CancelMode::Immediate => wit::CancelMode::Immediate,
            CancelMode::Cooperative => wit::CancelMode::Cooperative,
        },
        resumable_when_failed: d.resumable_when_failed,
        point_of_no_return: d.point_of_no_return.map(str::to_owned),
        rollback_requires_terminal: d.rollback_requires_terminal,
    }
}

/// The exported `run`: JSON in, JSON out.
pub fn run<W: Workflow>(input: &str) -> Result<String, Error> {
    let input: W::Input = serde_json::from_str(input).map_err(|e| {
        Error::permanent(
            "invalid-input",
            format!("input does not match the workflow's schema: {e}"),
        )
    })?;
    let mut ctx = Ctx {
        stages: W::descriptor().stages,
    };
    let output = W::run(&mut ctx, input)?;
    serde_json::to_string(&output).map_err(|e| Error::permanent("invalid-output", e.to_string()))
}
