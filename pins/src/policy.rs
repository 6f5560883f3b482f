//! The per-object pin policy, `holdfast.dev/pin` (see the crate's docs, "Per-object controls").

use std::{fmt, str::FromStr};

use serde_json::Value;

/// Label (preferred) or annotation selecting the object's [`PinPolicy`].
pub const PIN_KEY: &str = "holdfast.dev/pin";

/// How holdfast treats an object's references.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PinPolicy {
    /// Pin to the tag's current digest and re-pin when the tag moves (the default).
    #[default]
    Follow,
    /// Pin once; keep the digest until the user changes the reference.
    Freeze,
    /// Opted out: never pinned, never re-pinned.
    Disabled,
}

/// A `holdfast.dev/pin` value that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {value:?}; expected follow, freeze or disabled")]
pub struct UnknownPinPolicy {
    pub value: String,
}

/// Where an object's policy came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PolicySource {
    Label,
    Annotation,
}

impl PolicySource {
    fn field(self) -> &'static str {
        match self {
            Self::Label => "labels",
            Self::Annotation => "annotations",
        }
    }
}

impl PinPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Follow => "follow",
            Self::Freeze => "freeze",
            Self::Disabled => "disabled",
        }
    }

    /// The policy of `object` (label first, then annotation) and the warnings for the client:
    /// an unknown value means the default, [`PinPolicy::Follow`].
    pub fn from_object(object: &Value) -> (Self, Vec<String>) {
        let metadata = object.get("metadata");
        let read = |source: PolicySource| {
            metadata
                .and_then(|m| m.get(source.field()))
                .and_then(|m| m.get(PIN_KEY))
                .and_then(Value::as_str)
                .map(|value| (source, value))
        };
        let label = read(PolicySource::Label);
        let annotation = read(PolicySource::Annotation);
        let mut warnings = Vec::new();
        if let (Some((_, l)), Some((_, a))) = (label, annotation)
            && l != a
        {
            warnings.push(format!(
                "metadata.labels[\"{PIN_KEY}\"] is {l:?} and metadata.annotations[\"{PIN_KEY}\"] is \
                 {a:?}; the label wins: remove one of them"
            ));
        }
        let Some((source, value)) = label.or(annotation) else {
            return (Self::default(), warnings);
        };
        match value.parse() {
            Ok(policy) => (policy, warnings),
            Err(UnknownPinPolicy { value }) => {
                warnings.push(format!(
                    "metadata.{}[\"{PIN_KEY}\"]: unknown value {value:?}; expected follow, freeze or \
                     disabled; using the default, {}",
                    source.field(),
                    Self::default()
                ));
                (Self::default(), warnings)
            }
        }
    }
}

impl FromStr for PinPolicy {
    type Err = UnknownPinPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "follow" => Ok(Self::Follow),
            "freeze" => Ok(Self::Freeze),
            "disabled" => Ok(Self::Disabled),
            other => Err(UnknownPinPolicy {
                value: other.to_owned(),
            }),
        }
    }
}

impl fmt::Display for PinPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
