//! cloud-api-adaptor's developer mode, read from CAA's ConfigMap through the API.
//!
//! With `PODVM_DEVELOPER_MODE` on, CAA keeps a failed pod's VM for debugging: it neither deletes the VM nor
//! releases the PeerPod's finalizer. Read as "CAA failed", that held finalizer would make this controller delete
//! exactly the VM the developer wanted to keep, so a delete not yet asked for is held while the mode is on
//! (`peerpods_protocol::decide::under_developer_mode`).
//!
//! One ConfigMap, by name, is watched (a `metadata.name` field selector, which a Role's `resourceNames`
//! allows): no other ConfigMap of CAA's namespace is read. What the mode is, from what the watch shows:
//! - the ConfigMap or the key missing: off, CAA's own default;
//! - the key set: Go's `strconv.ParseBool`, as CAA reads it; another value is unknown;
//! - the watch failing (forbidden, the API server unreachable): unknown until it works again.
//!
//! Unknown fails closed: nothing is deleted that the mode might be keeping, each such PeerPod says so
//! (reason `DeveloperModeUnknown`) and is retried with its backoff. Any change of the mode reconciles every
//! PeerPod, so switching it off resumes the held cleanups at once.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use peerpods_protocol::decide::DeveloperMode;
use peerpods_runtime::watch;
use tracing::{info, warn};

/// cloud-api-adaptor's ConfigMap, as its install names it.
pub use peerpods_api::keys::CAA_CONFIG_MAP;
/// The namespace cloud-api-adaptor's own install (kustomize and chart) runs in.
pub const CAA_NAMESPACE: &str = "confidential-containers-system";
/// The key of cloud-api-adaptor's ConfigMap that turns its developer mode on (CAA keeps a failed pod's VM).
pub use peerpods_protocol::decide::DEVELOPER_MODE_KEY as KEY;

/// Which ConfigMap says whether developer mode is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeveloperModeSettings {
    pub namespace: String,
    pub name: String,
}

impl Default for DeveloperModeSettings {
    /// CAA's defaults.
    fn default() -> Self {
        DeveloperModeSettings {
            namespace: CAA_NAMESPACE.into(),
            name: CAA_CONFIG_MAP.into(),
        }
    }
}

/// The mode as last read, for the reconciler and the orphan scan. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Mode(tokio::sync::watch::Receiver<Option<DeveloperMode>>);

/// Where [`follow`] writes what it reads.
pub type ModeSender = tokio::sync::watch::Sender<Option<DeveloperMode>>;

/// A sender for [`follow`] and the [`Mode`] it feeds; nothing is read yet.
pub fn channel() -> (ModeSender, Mode) {
    let (tx, rx) = tokio::sync::watch::channel(None);
    (tx, Mode(rx))
}

impl Mode {
    /// A mode that never changes (nothing follows a ConfigMap), e.g. for a scan run on its own.
    pub fn fixed(mode: DeveloperMode) -> Mode {
        Mode(tokio::sync::watch::channel(Some(mode)).1)
    }

    /// The mode now: unknown until the ConfigMap has been read once.
    pub fn current(&self) -> DeveloperMode {
        self.0.borrow().unwrap_or(DeveloperMode::Unknown)
    }

    /// Waits for the first outcome of reading the ConfigMap (read, or failed to): reconciles that start earlier
    /// would all report the mode unknown.
    pub async fn first_read(&mut self) {
        let _ = self.0.wait_for(Option::is_some).await;
    }

    /// One item per change of the mode from now on; ends when [`follow`] does.
    pub fn changes(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut rx = self.0.clone();
        rx.mark_unchanged();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

/// Watches the ConfigMap `settings` names and keeps `tx` up to date until the future is dropped.
pub async fn follow(client: kube::Client, settings: DeveloperModeSettings, tx: ModeSender) {
    let api: Api<ConfigMap> = Api::namespaced(client, &settings.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", settings.name));
    let mut events = watch::backoff(watcher(api, config)).boxed();
    // What a (re-)list brought so far: the mode is decided when it is done.
    let mut listed: Option<ConfigMap> = None;
    while let Some(event) = events.next().await {
        let mode = match event {
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(cm)) => {
                listed = Some(cm);
                continue;
            }
            Ok(watcher::Event::InitDone) => mode_of(listed.take().as_ref()),
            Ok(watcher::Event::Apply(cm)) => mode_of(Some(&cm)),
            Ok(watcher::Event::Delete(_)) => mode_of(None),
            Err(error) => {
                warn!(%error, namespace = %settings.namespace, name = %settings.name,
                    "cannot read cloud-api-adaptor's ConfigMap; developer mode unknown, no VM is deleted until it is read");
                DeveloperMode::Unknown
            }
        };
        let changed = tx.send_if_modified(|current| {
            let changed = *current != Some(mode);
            *current = Some(mode);
            changed
        });
        if changed {
            info!(?mode, namespace = %settings.namespace, name = %settings.name, "cloud-api-adaptor developer mode");
        }
    }
}

/// cloud-api-adaptor's developer mode from its ConfigMap (`None`: there is none). A missing ConfigMap or key, or
/// an empty value, is off: CAA's default. A value is read as Go's `strconv.ParseBool` reads it, as CAA does; any
/// other value is unknown (CAA would not start with it), and unknown holds every delete not yet asked for.
pub fn mode_of(config_map: Option<&ConfigMap>) -> DeveloperMode {
    // The one rule for the value, shared with peer-pod-config-ctrl.
    DeveloperMode::from_setting(
        config_map
            .and_then(|cm| cm.data.as_ref())
            .and_then(|data| data.get(KEY))
            .map(String::as_str),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn developer_mode_is_read_as_caa_reads_it() {
        let cm = |value: Option<&str>| ConfigMap {
            data: value
                .map(|v| std::collections::BTreeMap::from([(KEY.to_string(), v.to_string())])),
            ..ConfigMap::default()
        };
        assert_eq!(mode_of(None), DeveloperMode::Off, "no ConfigMap");
        assert_eq!(mode_of(Some(&cm(None))), DeveloperMode::Off, "no key");
        for on in ["true", "1", "t", "T", "TRUE", "True", " true "] {
            assert_eq!(mode_of(Some(&cm(Some(on)))), DeveloperMode::On, "{on:?}");
        }
        for off in ["", "false", "0", "f", "F", "FALSE", "False"] {
            assert_eq!(mode_of(Some(&cm(Some(off)))), DeveloperMode::Off, "{off:?}");
        }
        for odd in ["yes", "on", "tRUE"] {
            assert_eq!(
                mode_of(Some(&cm(Some(odd)))),
                DeveloperMode::Unknown,
                "{odd:?}"
            );
        }
    }
}
