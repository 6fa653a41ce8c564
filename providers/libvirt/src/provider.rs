//! [`LibvirtProvider`]: the [`Provider`] implementation over the shared connection.

use async_trait::async_trait;

use peerpods_provider_core::deletion::{Bound, window_from_config};
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Deleter, Error, Health, Instance, OwnerTag, Pace,
    Provider, ProviderConfig, ProviderName, TagSelector,
};

use crate::connection::{Connection, start_event_loop};
use crate::domains::{capacity, list_domains};
use crate::ports::DomainPorts;
use crate::settings::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_BLOCKING_CALLS, DEFAULT_URI, NOT_FOUND_WINDOW,
    NOT_FOUND_WINDOW_SETTING, PACE, is_remote, is_test_driver, validate_uri,
};

/// The libvirt provider.
pub struct LibvirtProvider {
    connection: Connection,
    deleter: Deleter,
}

impl LibvirtProvider {
    /// Reads `LIBVIRT_URI` (in development mode: default [`DEFAULT_URI`], `test:` URIs allowed).
    /// Connects lazily, on the first call.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let uri = match config.get("LIBVIRT_URI") {
            Some(uri) => uri,
            None if config.is_development() => DEFAULT_URI,
            None => {
                return Err(Error::config(
                    "LIBVIRT_URI",
                    "not set: name the libvirt host (e.g. qemu+ssh://root@host/system); \
                              the in-memory test driver is for development mode only",
                ));
            }
        };
        validate_uri(uri)?;
        if is_test_driver(uri) && !config.is_development() {
            return Err(Error::config(
                "LIBVIRT_URI",
                format!(
                    "{uri:?} is libvirt's in-memory test driver, which only simulates VMs: \
                     allowed in development mode only"
                ),
            ));
        }
        // libvirt prints every error to stderr by default; we return and log them ourselves
        // (lookups of gone domains are normal and must not look like failures).
        virt::error::clear_error_callback();
        if is_remote(uri) {
            start_event_loop();
        }
        if is_test_driver(uri) {
            tracing::warn!(
                uri,
                "libvirt test driver in use: instances are simulated in memory"
            );
        }
        let call_timeout = config
            .positive_duration_secs("LIBVIRT_CALL_TIMEOUT_SECS")?
            .unwrap_or(DEFAULT_CALL_TIMEOUT);
        let max_blocking = config
            .positive("LIBVIRT_MAX_BLOCKING_CALLS")?
            .unwrap_or(DEFAULT_MAX_BLOCKING_CALLS);
        let deleter = Deleter::new(
            ProviderName::Libvirt,
            OwnerTag::from_config(config)?.guard(),
            window_from_config(config, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW)?,
            NOT_FOUND_WINDOW_SETTING,
            Pace::every(PACE),
        )
        .with_bound(Bound {
            within: call_timeout.saturating_mul(2),
            setting: "twice LIBVIRT_CALL_TIMEOUT_SECS",
        });
        Ok(LibvirtProvider {
            connection: Connection::new(uri.to_owned(), calls, call_timeout, max_blocking),
            deleter,
        })
    }

    /// Deletes the domain by the engine's rules. Each libvirt call is bounded by
    /// `LIBVIRT_CALL_TIMEOUT_SECS`; the waits of one delete by twice that
    /// ([`Deleter::with_bound`]), so a domain or volume that stays busy is answered a retryable
    /// `Unavailable` instead of waited for without end.
    async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let ports = DomainPorts::new(&self.connection);
        self.deleter.delete(&ports, instance_id).await
    }
}

#[async_trait]
impl Provider for LibvirtProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Libvirt
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        crate::instance_id::validate(instance_id)
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        self.delete(instance_id).await
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        self.connection.with_conn("capacity", capacity).await
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let mut instances = self
            .connection
            .with_conn("list_domains", list_domains)
            .await?;
        instances.retain(|i| i.matches(selector));
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(instances)
    }

    async fn health(&self) -> Health {
        match self
            .connection
            .with_conn("driver_type", |c| c.driver_type())
            .await
        {
            Ok(driver) => Health {
                healthy: true,
                message: format!("libvirt answers (driver {driver})"),
            },
            Err(e) => Health {
                healthy: false,
                message: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_call_timeout_or_thread_bound_is_refused_naming_key_and_value() {
        for key in ["LIBVIRT_CALL_TIMEOUT_SECS", "LIBVIRT_MAX_BLOCKING_CALLS"] {
            let config =
                ProviderConfig::from_pairs([("LIBVIRT_URI", "test:///default"), (key, "0")])
                    .for_development(true);
            let Err(error) = LibvirtProvider::from_config(&config, CloudCalls::default()) else {
                panic!("{key}=0 was accepted");
            };
            let text = error.to_string();
            assert!(
                text.starts_with(&format!("config {key}: expected")),
                "{text}"
            );
            assert!(text.ends_with(r#"greater than zero, got "0""#), "{text}");
        }
    }

    #[test]
    fn the_test_driver_needs_development_mode() {
        let config = |pairs: &[(&str, &str)]| ProviderConfig::from_pairs(pairs.iter().copied());
        let refusal = |config: ProviderConfig| match LibvirtProvider::from_config(
            &config,
            CloudCalls::default(),
        ) {
            Err(Error::Config { key, message, .. }) => (key, message),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("accepted"),
        };
        let (key, message) = refusal(config(&[]));
        assert_eq!(key, "LIBVIRT_URI");
        assert!(message.contains("not set"), "{message}");
        for uri in ["test:///default", "TEST:///tmp/host.xml"] {
            let (key, message) = refusal(config(&[("LIBVIRT_URI", uri)]));
            assert_eq!(key, "LIBVIRT_URI");
            assert!(message.contains("development mode"), "{message}");
        }
        let dev =
            LibvirtProvider::from_config(&config(&[]).for_development(true), CloudCalls::default())
                .expect("the embedded default in development mode");
        assert_eq!(dev.connection.uri, DEFAULT_URI);
        let real = LibvirtProvider::from_config(
            &config(&[("LIBVIRT_URI", "qemu+ssh://root@192.168.122.1/system")]),
            CloudCalls::default(),
        )
        .expect("a real host without development mode");
        assert_eq!(real.connection.uri, "qemu+ssh://root@192.168.122.1/system");
    }
}
