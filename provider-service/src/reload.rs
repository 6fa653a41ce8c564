//! Keeps the configuration and the TLS pair current without restarts: both are polled, a
//! changed config builds a new provider registry that replaces the old one, and a bad new
//! config (or pair) keeps the last good one and is reported in the log, the
//! `provider_service_config_valid` metric and the `/readyz` detail. Without any good config yet
//! (none mounted, or a refused one) nothing is served and the service is not ready.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use peerpods_runtime::admin::Readiness;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::ProviderConfig;
use crate::metrics::{Metrics, ResultLabels};
use crate::registry::{NotServing, Registry, SharedRegistry};
use crate::tls::ReloadingCert;

/// Readiness component name of the configuration.
pub const READINESS_CONFIG: &str = "config";

/// Watches the config directories and swaps the registry when they change.
pub struct ConfigReloader {
    dirs: Vec<PathBuf>,
    /// Development mode: the embedded defaults may stand in (see [`ProviderConfig::for_development`]).
    development: bool,
    registry: SharedRegistry,
    metrics: Metrics,
    readiness: Readiness,
    /// The config in use, `None` while no good one was ever loaded (nothing is served then).
    current: Option<ProviderConfig>,
    /// The last config that was rejected, so an unchanged bad config is reported once.
    rejected: Option<ProviderConfig>,
}

impl ConfigReloader {
    /// Loads the configuration and builds the first registry. A configuration that cannot be used
    /// (none at all, or a refused one) does not stop the service: it serves nothing, is not ready
    /// (the reason on `/readyz`) and refuses every call with that reason until a reload brings a
    /// good one, so an operator who creates peer-pods-cm later needs no restart.
    pub async fn start(
        dirs: Vec<PathBuf>,
        development: bool,
        metrics: Metrics,
        readiness: Readiness,
    ) -> Result<Self, Error> {
        if development {
            tracing::warn!(
                "development mode: without CLOUD_PROVIDER the embedded libvirt test driver answers; never use this for a real cluster"
            );
        }
        let mut reloader = ConfigReloader {
            dirs,
            development,
            registry: SharedRegistry::new(Registry::default()),
            metrics,
            readiness,
            current: None,
            rejected: None,
        };
        match reloader.load().await {
            Ok((config, registry)) => {
                tracing::info!(providers = ?registry, "configuration loaded");
                reloader.report_valid(&registry);
                reloader.registry.replace(registry);
                reloader.current = Some(config);
            }
            Err((config, e)) => {
                reloader.rejected = config;
                reloader.refuse_all(&e);
            }
        }
        Ok(reloader)
    }

    /// The configuration in use, `None` while no good one was ever loaded.
    pub fn config(&self) -> Option<&ProviderConfig> {
        self.current.as_ref()
    }

    /// The registry this reloader keeps current.
    pub fn registry(&self) -> SharedRegistry {
        self.registry.clone()
    }

    /// Reads the configuration files (and environment) in this service's mode.
    fn read(&self) -> Result<ProviderConfig, Error> {
        Ok(ProviderConfig::load(&self.dirs)?.for_development(self.development))
    }

    /// Reads and builds a configuration; on failure, the config that was read (if any).
    async fn load(&self) -> Result<(ProviderConfig, Registry), (Option<ProviderConfig>, Error)> {
        let config = self.read().map_err(|e| (None, e))?;
        match Registry::from_config(&config, &self.metrics.cloud).await {
            Ok(registry) => Ok((config, registry)),
            Err(e) => Err((Some(config), e)),
        }
    }

    /// Serves nothing: every call is refused with `e`, and the service is not ready.
    fn refuse_all(&self, e: &Error) {
        tracing::error!(error = %e, reason = e.reason(), "no usable configuration: serving no cloud, every call is refused");
        let refusal = NotServing::from_error(e);
        self.metrics.config_valid.set(0);
        self.readiness.set(
            READINESS_CONFIG,
            false,
            format!("{}: {}", refusal.reason, refusal.why),
        );
        self.registry.replace(Registry::not_serving(refusal));
    }

    /// Reads the configuration again. `Ok(true)`: a changed config is now in use; `Ok(false)`:
    /// nothing changed (or the same bad config is still there); `Err`: a new bad config was
    /// rejected and the last good one stays in use (or, without one, nothing is served).
    pub async fn reload(&mut self) -> Result<bool, Error> {
        let result = match self.read() {
            Ok(config) if Some(&config) == self.current.as_ref() => {
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
                self.current = Some(config);
                self.rejected = None;
                self.count("applied");
                Ok(true)
            }
            Err((config, e)) => {
                // A file that cannot be read at all is reported every poll (nothing to compare).
                if config.is_some() {
                    self.rejected = config;
                }
                if self.current.is_none() {
                    self.refuse_all(&e);
                } else {
                    tracing::error!(error = %e, reason = e.reason(), "new configuration rejected, keeping the last good one");
                    self.metrics.config_valid.set(0);
                    self.readiness.set(
                        READINESS_CONFIG,
                        true,
                        format!("serving the last good configuration; new one rejected: {e}"),
                    );
                }
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
