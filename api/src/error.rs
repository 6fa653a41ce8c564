//! The one error of this crate: a CRD that cannot be rendered.

/// The cause of a failed rendering, whichever serializer failed.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CustomResourceDefinition could not be turned into JSON or YAML.
    #[error("cannot render the {kind} CRD: {source}")]
    CrdSerialization {
        kind: &'static str,
        #[source]
        source: Cause,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn names_the_kind_and_keeps_the_cause() {
        let json = serde_json::from_str::<u8>("x").unwrap_err();
        let text = json.to_string();
        let error = Error::CrdSerialization {
            kind: "PeerPod",
            source: json.into(),
        };
        assert_eq!(
            error.to_string(),
            format!("cannot render the PeerPod CRD: {text}")
        );
        assert_eq!(error.source().map(ToString::to_string), Some(text));
    }
}
