//! The one error type of this crate. `reason()` is stable: it is used as a metric label and in logs.

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

    /// The request body is not an AdmissionReview with a request, or its object is not a Pod.
    #[error("malformed admission request: {0}")]
    MalformedRequest(String),

    /// The JSON patch could not be built or encoded.
    #[error("building the patch: {0}")]
    Patch(String),

    /// The serving certificate or key is missing, unreadable or unusable.
    #[error("serving certificate: {0}")]
    Certificate(String),

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

impl Error {
    /// A CamelCase word for metric labels and logs; never changes for a variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Quantity { .. } => "InvalidQuantity",
            Error::PodField { .. } => "InvalidPod",
            Error::MalformedRequest(_) => "MalformedRequest",
            Error::Patch(_) => "Patch",
            Error::Certificate(_) => "Certificate",
            Error::ListenAddress { .. } => "ListenAddress",
            Error::Io { .. } => "Io",
            Error::Runtime(_) => "Runtime",
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
            Error::Quantity { .. } | Error::PodField { .. } | Error::MalformedRequest(_)
        )
    }
}
