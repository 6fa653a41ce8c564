//! Reads the cluster into [`Facts`]: the only module that talks to the API server (read-only).

use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use peerpods_api::peerpod::PeerPod;

use crate::Error;
use crate::facts::{ConditionFacts, EventFacts, Facts, NodeCapacity, PeerPodFacts};

/// The extended resource each peer-pods node advertises, one per VM it may run.
pub use peerpods_api::keys::EXTENDED_RESOURCE;

/// Everything `status` and `orphans` show: every PeerPod, the Events peerpod-ctrl's orphan scan records on
/// its Namespace (wherever that is: the plugin need not know where the controller runs), and the nodes with
/// peer-pods capacity.
pub async fn cluster(client: &Client) -> Result<Facts, Error> {
    let peerpods: Api<PeerPod> = Api::all(client.clone());
    let peerpods = peerpods
        .list(&ListParams::default())
        .await
        .map_err(Error::ListPeerPods)?
        .items
        .iter()
        .map(peerpod)
        .collect();
    let events: Api<Event> = Api::all(client.clone());
    let scan_events = events
        .list(&ListParams::default().fields("involvedObject.kind=Namespace"))
        .await
        .map_err(Error::ListEvents)?
        .items
        .iter()
        .map(event)
        .collect();
    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = nodes
        .list(&ListParams::default())
        .await
        .map_err(Error::ListNodes)?
        .items
        .iter()
        .filter_map(capacity)
        .collect();
    Ok(Facts {
        peerpods,
        scan_events,
        nodes,
    })
}

/// The PeerPod `namespace/name`; a missing one is [`Error::PeerPodNotFound`].
pub async fn read_peerpod(client: &Client, namespace: &str, name: &str) -> Result<PeerPod, Error> {
    Api::<PeerPod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::ReadPeerPod)?
        .ok_or_else(|| Error::PeerPodNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
}

/// One PeerPod and the Events about it (this incarnation's: an Event about an earlier PeerPod of the same
/// name carries another UID).
pub async fn peerpod_story(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(PeerPodFacts, Vec<EventFacts>), Error> {
    let pp = read_peerpod(client, namespace, name).await?;
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let selector = format!("involvedObject.kind=PeerPod,involvedObject.name={name}");
    let uid = pp.uid();
    let events = events
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(Error::ListEvents)?
        .items
        .iter()
        .filter(|e| uid.is_none() || e.involved_object.uid == uid)
        .map(event)
        .collect();
    Ok((peerpod(&pp), events))
}

fn peerpod(pp: &PeerPod) -> PeerPodFacts {
    let status = pp.status.clone().unwrap_or_default();
    PeerPodFacts {
        namespace: pp.namespace().unwrap_or_default(),
        name: pp.name_any(),
        provider: pp.spec.cloud_provider.clone(),
        instance_id: pp.spec.instance_id.clone(),
        deleting_since: pp.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        finalizers: pp.finalizers().to_vec(),
        state: status.state,
        reason: status.reason,
        waiting_since: status.waiting_since.map(|t| t.0),
        last_attempt: status.last_attempt_time.map(|t| t.0),
        conditions: status
            .conditions
            .into_iter()
            .map(|c| ConditionFacts {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                message: c.message,
                since: Some(c.last_transition_time.0),
            })
            .collect(),
    }
}

fn event(e: &Event) -> EventFacts {
    let series = e.series.as_ref();
    let time = series
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.first_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let count = series.and_then(|s| s.count).or(e.count).unwrap_or(1);
    EventFacts {
        namespace: e.namespace().unwrap_or_default(),
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        message: e.message.clone().unwrap_or_default(),
        time,
        count,
        related: e.related.as_ref().map(|r| {
            (
                r.api_version.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            )
        }),
    }
}

fn capacity(node: &Node) -> Option<NodeCapacity> {
    let status = node.status.as_ref()?;
    let amount = |list: &Option<std::collections::BTreeMap<String, Quantity>>| {
        list.as_ref()
            .and_then(|l| l.get(EXTENDED_RESOURCE))
            .map(|q| q.0.clone())
    };
    let capacity = amount(&status.capacity);
    let allocatable = amount(&status.allocatable);
    (capacity.is_some() || allocatable.is_some()).then(|| NodeCapacity {
        name: node.name_any(),
        capacity,
        allocatable,
    })
}
