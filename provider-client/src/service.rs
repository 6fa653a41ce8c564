//! The domain client of provider-service: each call in the domain's terms ([`crate::answers`], [`Capacity`]),
//! each error read once ([`CallError`]). Both controllers call provider-service through it; nothing past it sees
//! a protobuf type.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use peerpods_proto::v1::{
    DeleteInstanceRequest, DeleteResult, DeleteWait, GetCapacityRequest, ListInstancesRequest,
    ListProvidersRequest, Requester,
};

use crate::answers::{About, DeleteAnswer, Deleted, Instance, Waiting};
use crate::breaker::Breakers;
use crate::capacity::Capacity;
use crate::failure::CallError;
use crate::{Error, ProviderClient, ProviderClientConfig};

/// provider-service, for one calling component. Cheap to clone: clones share one connection. Each call carries
/// the token and the current trace context (see [`crate::connect`]), so a reconcile and the cloud call it causes
/// are one trace.
#[derive(Clone)]
pub struct ProviderService {
    client: ProviderClient,
    /// Who calls, as the requester of a delete names it (`peerpod-ctrl`).
    component: &'static str,
    /// The circuit breaker deletes go through, when turned on ([`ProviderService::with_breaker`]).
    breakers: Option<Arc<Breakers>>,
}

impl ProviderService {
    pub fn new(client: ProviderClient, component: &'static str) -> Self {
        ProviderService {
            client,
            component,
            breakers: None,
        }
    }

    /// The same client with a circuit breaker of its own in front of its deletes (see [`crate::breaker`]):
    /// while provider-service or a cloud is down, one delete probes it and the others come back at once as
    /// [`CallError::Held`]. Clones share the breaker; a controller takes a fresh one per leadership term.
    pub fn with_breaker(&self) -> Self {
        ProviderService {
            breakers: Some(Arc::default()),
            ..self.clone()
        }
    }

    /// Connects lazily: the caller starts while provider-service is down, and calls fail with an unavailable
    /// [`CallError`] until it is up.
    pub fn connect(config: &ProviderClientConfig, component: &'static str) -> Result<Self, Error> {
        crate::connect(config).map(|client| ProviderService::new(client, component))
    }

    /// Deletes one VM, or asks how the delete provider-service is running for it goes. Only
    /// [`DeleteAnswer::Gone`] lets a caller release a finalizer; an error or [`DeleteAnswer::InProgress`] keeps
    /// it in place.
    pub async fn delete_instance(
        &self,
        provider: &str,
        instance_id: &str,
        about: About<'_>,
    ) -> Result<DeleteAnswer, CallError> {
        match &self.breakers {
            Some(breakers) => {
                breakers
                    .guard(provider, self.ask_delete(provider, instance_id, about))
                    .await
            }
            None => self.ask_delete(provider, instance_id, about).await,
        }
    }

    async fn ask_delete(
        &self,
        provider: &str,
        instance_id: &str,
        about: About<'_>,
    ) -> Result<DeleteAnswer, CallError> {
        let request = DeleteInstanceRequest {
            cloud_provider: provider.to_owned(),
            instance_id: instance_id.to_owned(),
            requester: Some(Requester {
                component: self.component.to_owned(),
                namespace: about.namespace.to_owned(),
                name: about.name.to_owned(),
                reason: about.reason.as_str().to_owned(),
            }),
            // The controllers re-ask with backoff until the VM is confirmed gone.
            accept_in_progress: true,
        };
        let response = self
            .client
            .clone()
            .delete_instance(request)
            .await?
            .into_inner();
        match response.result() {
            DeleteResult::Deleted => Ok(DeleteAnswer::Gone(Deleted::Deleted)),
            DeleteResult::AlreadyGone => Ok(DeleteAnswer::Gone(Deleted::AlreadyGone)),
            DeleteResult::InProgress => Ok(DeleteAnswer::InProgress {
                retry_after: response
                    .retry_after
                    .and_then(|d| Duration::try_from(d).ok()),
                waiting: match response.waiting() {
                    DeleteWait::NotYetVisible => Waiting::NotYetVisible {
                        unknown_for: response
                            .unknown_for
                            .and_then(|d| Duration::try_from(d).ok()),
                    },
                    // What provider-service always waited for before it said.
                    DeleteWait::CloudDeleting | DeleteWait::Unspecified => Waiting::CloudDeleting,
                },
            }),
            // Never treat an answer we do not understand as "gone": that could leak a VM.
            DeleteResult::Unspecified => Err(CallError::unreadable(
                "DeleteInstance answered without a result",
            )),
        }
    }

    /// Names of the providers configured on provider-service.
    pub async fn providers(&self) -> Result<Vec<String>, CallError> {
        let response = self
            .client
            .clone()
            .list_providers(ListProvidersRequest {})
            .await?
            .into_inner();
        Ok(response.providers.into_iter().map(|p| p.name).collect())
    }

    /// VMs of `provider` carrying every tag of `selector`.
    pub async fn instances(
        &self,
        provider: &str,
        selector: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, CallError> {
        let response = self
            .client
            .clone()
            .list_instances(ListInstancesRequest {
                cloud_provider: provider.to_owned(),
                tag_selector: selector
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .await?
            .into_inner();
        Ok(response
            .instances
            .into_iter()
            .map(|i| Instance {
                instance_id: i.instance_id,
                created: i
                    .create_time
                    .and_then(|t| jiff::Timestamp::new(t.seconds, t.nanos).ok()),
                tags: i.tags.into_iter().collect(),
                name: i.name,
            })
            .collect())
    }

    /// The room `provider`'s cloud reports for peer-pod VMs.
    pub async fn capacity(&self, provider: &str) -> Result<Capacity, CallError> {
        let answer = self
            .client
            .clone()
            .get_capacity(GetCapacityRequest {
                cloud_provider: provider.to_owned(),
            })
            .await?
            .into_inner();
        Ok(answer.into())
    }
}
