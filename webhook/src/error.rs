//! The one error type of this crate. `reason()` is stable: it is used as a metric label and in logs.
//!
//! An error built from another keeps it as its `source()`; the text stays the one the webhook has always
//! shown, since a refusal's text is the message the API server gets back in the AdmissionReview.

use peerpods_runtime::{Cause, with_cause};

/// What went wrong while admitting a Pod or running the webhook.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A resource quantity is not in Kubernetes' quantity syntax (`500m`, `4Gi`, `1.5`, `2e3`).
    #[error("quantity {quantity:?}: {problem}")]
    Quantity {
        quantity: String,
        problem: &'static str,
    },

    /// A field of the Pod under admission cannot be read; `field` says which.
    #[error("{field}: {source}")]
    PodField {
        field: String,
        #[source]
        source: Box<Error>,
    },

    /// The request body is not an AdmissionReview with a request, or its object is not a Pod; `source` is the
    /// error that said so (the JSON parser's, the body reader's), if any.
    #[error("malformed admission request: {}", with_cause(message, source))]
    MalformedRequest {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// The JSON patch could not be built or encoded: the serializer's error.
    #[error("building the patch: {0}")]
    Patch(#[source] Cause),

    /// The serving certificate or key is missing, unreadable or unusable; `source` is the error that made it so
    /// (reading the file, parsing its PEM, the key's type, the pair's mismatch), if any.
    #[error("serving certificate: {}", with_cause(message, source))]
    Certificate {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// A listen address is not `host:port`, `:port` or `0`.
    #[error("listen address {address:?}: {problem}")]
    ListenAddress {
        address: String,
        problem: &'static str,
    },

    /// Binding a port or serving on it failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// The health server (from the shared runtime) failed.
    #[error(transparent)]
    Runtime(#[from] peerpods_runtime::Error),
}

impl peerpods_runtime::service::StopReason for Error {
    fn reason(&self) -> &'static str {
        Error::reason(self)
    }
}

impl Error {
    /// A CamelCase word for metric labels and logs; never changes for a variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Quantity { .. } => "InvalidQuantity",
            Error::PodField { .. } => "InvalidPod",
            Error::MalformedRequest { .. } => "MalformedRequest",
            Error::Patch(_) => "Patch",
            Error::Certificate { .. } => "Certificate",
            Error::ListenAddress { .. } => "ListenAddress",
            Error::Io { .. } => "Io",
            Error::Runtime(_) => "Runtime",
        }
    }

    /// [`Error::MalformedRequest`] that no other error caused.
    pub(crate) fn malformed(message: impl Into<String>) -> Self {
        Error::MalformedRequest {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::MalformedRequest`]: `message` says what was being read (empty: the cause says it all), `source`
    /// why it could not be.
    pub(crate) fn malformed_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::MalformedRequest {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`Error::Certificate`] that no other error caused.
    pub(crate) fn certificate(message: impl Into<String>) -> Self {
        Error::Certificate {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Certificate`]: `message` names the file or the step, `source` is the error it failed with.
    pub(crate) fn certificate_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Certificate {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether the request itself is at fault (answered like HTTP 400), not the webhook.
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            Error::Quantity { .. } | Error::PodField { .. } | Error::MalformedRequest { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_unreadable_review_keeps_the_parser_error_and_its_old_text() {
        let json = serde_json::from_slice::<serde_json::Value>(b"{not json").unwrap_err();
        let text = json.to_string();
        let error = Error::malformed_from("", json);
        // The text the API server has always been answered with: the parser's words after the prefix.
        assert_eq!(
            error.to_string(),
            format!("malformed admission request: {text}")
        );
        let source = error.source().expect("the parser's error is the source");
        assert!(source.downcast_ref::<serde_json::Error>().is_some());

        let object = serde_json::from_str::<u8>("\"pod\"").unwrap_err();
        let text = object.to_string();
        let error = Error::malformed_from("the object is not a Pod", object);
        assert_eq!(
            error.to_string(),
            format!("malformed admission request: the object is not a Pod: {text}")
        );
        assert!(error.source().is_some());
        assert!(error.is_bad_request());

        let own = Error::malformed("a create request without an object");
        assert_eq!(
            own.to_string(),
            "malformed admission request: a create request without an object"
        );
        assert!(own.source().is_none());
    }

    #[test]
    fn a_patch_error_is_its_source() {
        let json = serde_json::from_str::<u8>("x").unwrap_err();
        let text = json.to_string();
        let error = Error::Patch(json.into());
        assert_eq!(error.to_string(), format!("building the patch: {text}"));
        assert_eq!(error.source().map(ToString::to_string), Some(text));
        assert!(!error.is_bad_request());
    }
}
