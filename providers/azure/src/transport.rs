//! The HTTP client under azure_core's pipeline: reqwest over rustls with the ring provider (the
//! workspace's TLS stack; azure_core's own `reqwest_rustls` feature would pull in aws-lc), the
//! platform's root certificates plus `AZURE_CA_BUNDLE`, no redirects.

use std::sync::Arc;

use peerpods_provider_core::Error;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::settings::AzureSettings;

const CA_BUNDLE: &str = "AZURE_CA_BUNDLE";

/// The client every request of this backend (ARM and Entra ID) goes through.
pub fn http_client(settings: &AzureSettings) -> Result<reqwest::Client, Error> {
    let extra_roots = match &settings.ca_bundle {
        Some(bundle) => ca_certificates(&read_bundle(bundle)?)?,
        None => Vec::new(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls_problem = |e: rustls::Error| {
        Error::tls(format!("building the TLS client configuration: {e}")).with_source(e)
    };
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
        extra_roots,
        Arc::clone(&provider),
    )
    .map_err(tls_problem)?;
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_problem)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(settings.connect_timeout)
        .timeout(settings.request_timeout)
        // ARM answers long-running operations with Location headers that are polled, never
        // followed as redirects.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Error::tls(format!("building the HTTP client: {e}")).with_source(e))
}

/// The PEM text of `AZURE_CA_BUNDLE`: the value itself, or the file it names.
fn read_bundle(value: &str) -> Result<String, Error> {
    if value.starts_with("-----BEGIN") {
        return Ok(value.to_owned());
    }
    std::fs::read_to_string(value).map_err(|e| {
        Error::config(
            CA_BUNDLE,
            format!("neither PEM text nor a readable file: {e}"),
        )
        .with_source(e)
    })
}

/// The certificates of a PEM bundle; at least one, or a configuration error.
pub fn ca_certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certificates = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::config(CA_BUNDLE, format!("unreadable PEM: {e}")).with_source(e))?;
    if certificates.is_empty() {
        return Err(Error::config(CA_BUNDLE, "contains no CERTIFICATE block"));
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_without_certificates_is_a_config_error() {
        let error = ca_certificates("hello").expect_err("no certificate");
        assert!(
            matches!(&error, Error::Config { key, .. } if key == CA_BUNDLE),
            "{error:?}"
        );
        let error = read_bundle("/nonexistent/ca.pem").expect_err("no file");
        assert!(matches!(&error, Error::Config { key, .. } if key == CA_BUNDLE));
    }
}
