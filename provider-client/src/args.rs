//! The flags of the provider-service client, flattened into a controller's clap `Parser` (`#[command(flatten)]`).
//! Every flag has an environment variable of the same meaning (the Helm chart sets those).

use std::path::PathBuf;
use std::time::Duration;

use peerpods_runtime::args::duration;

use crate::ProviderClientConfig;

/// The default of `--provider-timeout`, the deadline of each provider-service call.
pub const DEFAULT_PROVIDER_TIMEOUT: Duration = Duration::from_secs(90);

/// How the caller authenticates to provider-service.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderAuth {
    /// A projected ServiceAccount token (`--token-file`).
    Token,
    /// Nothing (local development only).
    None,
}

/// The provider-service client.
#[derive(clap::Args, Debug, Clone)]
pub struct ProviderArgs {
    /// provider-service address: https://host:port (TLS, needs --provider-ca) or http://host:port (local only).
    #[arg(long, env = "PROVIDER_ENDPOINT")]
    pub provider_endpoint: Option<String>,
    /// How to authenticate to provider-service: a projected ServiceAccount token, or nothing (local only).
    #[arg(long, env = "PROVIDER_AUTH", value_enum, default_value_t = ProviderAuth::Token)]
    pub provider_auth: ProviderAuth,
    /// PEM file with the CA of provider-service's certificate.
    #[arg(long, env = "PROVIDER_CA")]
    pub provider_ca: Option<PathBuf>,
    /// Name to verify provider-service's certificate against, when it differs from the endpoint host.
    #[arg(long, env = "PROVIDER_SERVER_NAME")]
    pub provider_server_name: Option<String>,
    /// Projected ServiceAccount token (audience provider-service); re-read when rotated.
    #[arg(
        long,
        env = "TOKEN_FILE",
        default_value = "/var/run/secrets/provider-service/token"
    )]
    pub token_file: PathBuf,
    /// Deadline of each provider-service call: the outermost of the deadlines (provider-service/README.md,
    /// "Deadlines"). provider-service answers within it: a delete that takes longer runs on there and is answered
    /// "in progress", reads are cut by provider-service's own 75 s bound (above the clouds' per-call timeouts).
    #[arg(long, env = "PROVIDER_TIMEOUT", default_value = "90s", value_parser = duration)]
    pub provider_timeout: Duration,
}

impl ProviderArgs {
    /// The client configuration, or `None` when no endpoint is set.
    pub fn client_config(&self) -> Option<ProviderClientConfig> {
        let endpoint = self.provider_endpoint.clone()?;
        Some(ProviderClientConfig {
            endpoint,
            ca_file: self.provider_ca.clone(),
            tls_server_name: self.provider_server_name.clone(),
            token_file: (self.provider_auth == ProviderAuth::Token)
                .then(|| self.token_file.clone()),
            timeout: Some(self.provider_timeout),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        provider: ProviderArgs,
    }

    #[test]
    fn the_flags_fit_together() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Every variable the chart (deploy/), the Tiltfile and mk/ set for the provider-service client is read.
    #[test]
    fn the_variables_deployments_set_are_read() {
        use clap::CommandFactory;
        let unread = peerpods_runtime::args::unread_env(
            &Cli::command(),
            "PROVIDER_ENDPOINT PROVIDER_AUTH PROVIDER_CA PROVIDER_SERVER_NAME \
             TOKEN_FILE PROVIDER_TIMEOUT",
        );
        assert!(unread.is_empty(), "not read: {unread:?}");
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(
            cli.provider.client_config().is_none(),
            "no endpoint, no client"
        );
        assert_eq!(cli.provider.provider_timeout, DEFAULT_PROVIDER_TIMEOUT);
    }

    #[test]
    fn provider_client_from_flags() {
        let cli = Cli::try_parse_from([
            "x",
            "--provider-endpoint",
            "https://provider-service:50051",
            "--provider-ca",
            "/ca.crt",
            "--provider-server-name",
            "ps.svc",
            "--token-file",
            "/token",
            "--provider-timeout",
            "30s",
        ])
        .unwrap();
        let config = cli.provider.client_config().unwrap();
        assert_eq!(config.endpoint, "https://provider-service:50051");
        assert_eq!(config.ca_file, Some(PathBuf::from("/ca.crt")));
        assert_eq!(config.tls_server_name.as_deref(), Some("ps.svc"));
        assert_eq!(config.token_file, Some(PathBuf::from("/token")));
        assert_eq!(config.timeout, Some(Duration::from_secs(30)));
        let cli = Cli::try_parse_from([
            "x",
            "--provider-endpoint",
            "http://127.0.0.1:50051",
            "--provider-auth",
            "none",
        ])
        .unwrap();
        assert_eq!(cli.provider.client_config().unwrap().token_file, None);
    }
}
