//! What a rule decides, independent of how it is sent back to the API server.

use json_patch::PatchOperation;

/// The outcome of one rule over one admission request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admit unchanged.
    Allow,
    /// Admit with these JSON-patch operations applied.
    Patch(Vec<PatchOperation>),
    /// Refuse, with a message the `kubectl` user reads.
    Deny(String),
}

/// A decision plus the warnings the API server passes on to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub decision: Decision,
    pub warnings: Vec<String>,
}

impl Verdict {
    pub fn allow() -> Self {
        Decision::Allow.into()
    }

    pub fn with_warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }

    /// The label used in metrics and logs.
    pub fn outcome(&self) -> Outcome {
        match &self.decision {
            Decision::Allow => Outcome::Allowed,
            Decision::Patch(ops) if ops.is_empty() => Outcome::Allowed,
            Decision::Patch(_) => Outcome::Patched,
            Decision::Deny(_) => Outcome::Denied,
        }
    }
}

impl From<Decision> for Verdict {
    fn from(decision: Decision) -> Self {
        Self {
            decision,
            warnings: Vec::new(),
        }
    }
}

/// How an admission request ended, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Allowed,
    Patched,
    Denied,
    /// The request could not be decoded or answered; the API server applies its failure policy.
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Patched => "patched",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
        }
    }
}
