//! Keeps the configuration and the TLS pair current without restarts: both are polled, a
//! changed config builds a new provider registry that replaces the old one, and a bad new
//! config (or pair) keeps the last good one and is reported in the log, the
//! `provider_service_config_valid` metric and the `/readyz` detail.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use peerpods_runtime::admin::Readiness;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::ProviderConfig;
use crate::metrics::{Metrics, ResultLabels};
use crate::registry::{Registry, SharedRegistry};
use crate::tls::ReloadingCert;

/// Readiness component name of the configuration.
pub const READINESS_CONFIG: &str = "config";

/// Watches the config directories and swaps the registry when they change.
pub struct ConfigReloader {
    dirs: Vec<PathBuf>,
    registry: SharedRegistry,
    metrics: Metrics,
    readiness: Readiness,
    current: ProviderConfig,
    /// The last config that was rejected, so an unchanged bad config is reported once.
    rejected: Option<ProviderConfig>,
}

impl ConfigReloader {
    /// Loads the configuration and builds the first registry. Fails when there is no good
    /// configuration to start with.
    pub async fn start(
        dirs: Vec<PathBuf>,
        metrics: Metrics,
        readiness: Readiness,
    ) -> Result<Self, Error> {
        let config = ProviderConfig::load(&dirs)?;
        let registry = Registry::from_config(&config, &metrics.cloud).await?;
        tracing::info!(providers = ?registry, "configuration loaded");
        readiness.set(READINESS_CONFIG, true, describe(&registry));
        metrics.config_valid.set(1);
        Ok(ConfigReloader {
            dirs,
            registry: SharedRegistry::new(registry),
            metrics,
            readiness,
            current: config,
            rejected: None,
        })
    }

    /// The registry this reloader keeps current.
    pub fn registry(&self) -> SharedRegistry {
        self.registry.clone()
    }

    /// Reads the configuration again. `Ok(true)`: a changed config is now in use; `Ok(false)`:
    /// nothing changed (or the same bad config is still there); `Err`: a new bad config was
    /// rejected and the last good one stays in use.
    pub async fn reload(&mut self) -> Result<bool, Error> {
        let result = match ProviderConfig::load(&self.dirs) {
            Ok(config) if config == self.current => {
                if self.rejected.take().is_some() {
                    // The bad config was reverted to the one in use.
                    self.report_valid(&self.registry.current());
                }
                return Ok(false);
            }
            Ok(config) if Some(&config) == self.rejected.as_ref() => return Ok(false),
            Ok(config) => match Registry::from_config(&config, &self.metrics.cloud).await {
                Ok(registry) => Ok((config, registry)),
                Err(e) => Err((Some(config), e)),
            },
            Err(e) => Err((None, e)),
        };
        match result {
            Ok((config, registry)) => {
                tracing::info!(providers = ?registry, "configuration reloaded");
                self.report_valid(&registry);
                self.registry.replace(registry);
                self.current = config;
                self.rejected = None;
                self.count("applied");
                Ok(true)
            }
            Err((config, e)) => {
                // A file that cannot be read at all is reported every poll (nothing to compare).
                if config.is_some() {
                    self.rejected = config;
                }
                tracing::error!(error = %e, reason = e.reason(), "new configuration rejected, keeping the last good one");
                self.metrics.config_valid.set(0);
                self.readiness.set(
                    READINESS_CONFIG,
                    true,
                    format!("serving the last good configuration; new one rejected: {e}"),
                );
                self.count("rejected");
                Err(e)
            }
        }
    }

    fn report_valid(&self, registry: &Registry) {
        self.metrics.config_valid.set(1);
        self.readiness
            .set(READINESS_CONFIG, true, describe(registry));
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .config_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Polls every `interval` until `shutdown`; also reloads the TLS pair when there is one.
    pub async fn run(
        mut self,
        interval: Duration,
        tls: Option<Arc<ReloadingCert>>,
        shutdown: CancellationToken,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            // Errors are reported inside reload(); the loop goes on with the last good config.
            let _ = self.reload().await;
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(true) => tracing::info!("TLS certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "new TLS certificate rejected, keeping the old one")
                    }
                }
            }
        }
    }
}

fn describe(registry: &Registry) -> String {
    let names: Vec<&str> = registry.providers().map(|p| p.name().as_str()).collect();
    format!("providers: {}", names.join(","))
}
