//! The clock of the scans (orphans, reverse collection): a pass every interval over the PeerPod cache of the
//! leadership term, once its first list is complete.

use std::time::Duration;

use kube::runtime::reflector::Store;
use peerpods_api::peerpod::PeerPod;
use tokio::sync::watch;

/// A scan's clock: the term's complete PeerPod cache, and a tick every interval (a late tick delays the next
/// rather than bunching them).
pub(crate) struct Every {
    store: Store<PeerPod>,
    ticker: tokio::time::Interval,
}

impl Every {
    /// Waits for the term's PeerPod cache to be complete; `None` when the term ends first.
    pub(crate) async fn start(
        interval: Duration,
        mut store: watch::Receiver<Option<Store<PeerPod>>>,
    ) -> Option<Every> {
        let store = complete_store(&mut store).await?;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(Every { store, ticker })
    }

    /// Waits for the next pass (the first is at once) and hands it the cache to scan.
    pub(crate) async fn tick(&mut self) -> &Store<PeerPod> {
        self.ticker.tick().await;
        &self.store
    }
}

/// The PeerPod cache of this leadership term once its first list is complete (before that a scan would only see
/// part of the PeerPods); `None` when the term ends first.
async fn complete_store(
    store: &mut watch::Receiver<Option<Store<PeerPod>>>,
) -> Option<Store<PeerPod>> {
    let store = loop {
        if let Some(store) = store.borrow_and_update().clone() {
            break store;
        }
        store.changed().await.ok()?;
    };
    store.wait_until_ready().await.ok()?;
    Some(store)
}
