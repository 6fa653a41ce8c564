//! The DRA v1 API (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`), served on the DRA socket: a thin layer from the
//! kubelet's messages to [`crate::claims`] and back.
//!
//! What the 1.37 kubelet requires of an answer: an entry for every claim of the request, keyed by claim UID (a
//! missing one fails the pod's preparation, "skipped N ResourceClaims", and is retried); an entry with a non-empty
//! `error` fails it too. The devices of a prepared claim are optional: the kubelet only copies them into its
//! claim cache for their CDI device IDs (what it asks the runtime to inject), the PodResources API and device
//! health. A slot of the VM pool injects nothing, so the answer lists no devices, and the plugin needs no API
//! access to learn which devices were allocated.

use tonic::{Request, Response, Status};

use crate::api::dra::dra_plugin_server::DraPlugin;
use crate::api::dra::{
    Claim as ApiClaim, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::claims::{self, Claim};

/// The DRA service of one driver's plugin on one node.
#[derive(Debug)]
pub struct DraService {
    driver: String,
    node: String,
}

impl DraService {
    pub fn new(driver: String, node: String) -> Self {
        DraService { driver, node }
    }

    /// The answer to the claims of a request, logged per claim; a request that cannot be answered is
    /// INVALID_ARGUMENT.
    fn answer(
        &self,
        operation: &'static str,
        claims: &[ApiClaim],
    ) -> Result<claims::Answer, Status> {
        let answer = claims::answer(claims.iter().map(|c| Claim {
            namespace: &c.namespace,
            uid: &c.uid,
            name: &c.name,
        }))
        .map_err(|refusal| {
            tracing::warn!(node = %self.node, driver = %self.driver, operation, %refusal, "request refused");
            Status::invalid_argument(refusal.to_string())
        })?;
        for claim in claims {
            match answer.get(&claim.uid) {
                Some(Ok(())) => tracing::info!(
                    node = %self.node,
                    driver = %self.driver,
                    operation,
                    claim = %format_args!("{}/{}", claim.namespace, claim.name),
                    uid = %claim.uid,
                    "done, nothing to inject"
                ),
                Some(Err(problem)) => tracing::warn!(
                    node = %self.node,
                    driver = %self.driver,
                    operation,
                    uid = %claim.uid,
                    %problem,
                    "claim refused"
                ),
                None => {}
            }
        }
        Ok(answer)
    }
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let answer = self.answer("prepare", &request.get_ref().claims)?;
        let claims = answer
            .into_iter()
            .map(|(uid, outcome)| {
                let error = outcome.err().map(|p| p.to_string()).unwrap_or_default();
                (
                    uid,
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    },
                )
            })
            .collect();
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let answer = self.answer("unprepare", &request.get_ref().claims)?;
        let claims = answer
            .into_iter()
            .map(|(uid, outcome)| {
                let error = outcome.err().map(|p| p.to_string()).unwrap_or_default();
                (uid, NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
