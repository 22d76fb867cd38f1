//! The one error of every capability, shared with the host: it says whether a retry may help.

pub use crate::bindings::capstan::platform::types::{Error, ErrorKind};

impl Error {
    /// An error that will recur if the request is repeated: the booking fails.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Permanent,
            code: code.into(),
            message: message.into(),
        }
    }

    /// An error worth retrying later: the host runs the step again.
    pub fn transient(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Transient,
            code: code.into(),
            message: message.into(),
        }
    }

    /// True for [`ErrorKind::Transient`].
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, ErrorKind::Transient)
    }
}
