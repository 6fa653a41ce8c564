//! Reading libvirt's failures into the core [`Error`].

use virt::error::{Error as VirtError, ErrorNumber};

use peerpods_provider_core::Error;

/// Errors after which the connection is not usable any more.
pub(crate) fn is_connection_error(e: &VirtError) -> bool {
    e.code().is_any(vec![
        ErrorNumber::InvalidConn,
        ErrorNumber::NoConnect,
        ErrorNumber::Rpc,
    ])
}

/// libvirt's answers that the domain (or the resource) is in a state that does not allow the
/// call now (`virerror.h`): `VIR_ERR_OPERATION_INVALID` ("operation is not valid", e.g. a domain
/// mid-transition), `VIR_ERR_RESOURCE_BUSY` ("resource is busy") and
/// `VIR_ERR_OPERATION_TIMEOUT` (e.g. "cannot acquire state change lock": another job holds the
/// domain). The state moves on, so the call is worth repeating.
pub(crate) fn is_busy(e: &VirtError) -> bool {
    e.code().is_any(vec![
        ErrorNumber::OperationInvalid,
        ErrorNumber::ResourceBusy,
        ErrorNumber::OperationTimeout,
    ])
}

/// The crate error for libvirt's answer `e`, which stays its source.
pub(crate) fn map_error(e: VirtError) -> Error {
    let message = format!("libvirt: {}", e.message());
    let mapped = if is_connection_error(&e) {
        Error::unavailable(message)
    } else if is_busy(&e) {
        Error::unavailable(format!(
            "{message} (the domain is busy or mid-transition; try again)"
        ))
    } else if e
        .code()
        .is_any(vec![ErrorNumber::AuthFailed, ErrorNumber::AccessDenied])
    {
        Error::cloud_permission_denied(message)
    } else {
        Error::internal(message)
    };
    mapped.with_source(e)
}

#[cfg(test)]
mod tests {
    use virt::connect::Connect;

    use super::*;

    /// A real `VIR_ERR_OPERATION_INVALID` from the libvirt library (its test driver: destroying a
    /// domain that is not running) is retryable, not an internal error.
    #[test]
    fn a_domain_in_the_wrong_state_is_retryable() {
        let conn = Connect::open(Some("test:///default")).expect("test driver");
        let domain = conn
            .lookup_domain_by_name("test")
            .expect("its default domain");
        if domain.is_active().expect("state") {
            domain.destroy().expect("the running default domain stops");
        }
        let e = domain.destroy().expect_err("it is not running any more");
        assert!(e.code().is(ErrorNumber::OperationInvalid), "{e}");
        let mapped = map_error(e);
        assert!(
            matches!(&mapped, Error::Unavailable { message, .. } if message.contains("try again")),
            "{mapped:?}"
        );
        // The chain reaches libvirt's own error, code and all.
        let source = std::error::Error::source(&mapped)
            .and_then(|s| s.downcast_ref::<VirtError>())
            .expect("libvirt's error is the source");
        assert!(source.code().is(ErrorNumber::OperationInvalid), "{source}");
        // An error that is not about the domain's state stays what it was.
        let missing = conn
            .lookup_domain_by_name("no-such-domain")
            .expect_err("unknown");
        assert!(matches!(map_error(missing), Error::Internal { .. }));
    }
}
