//! The kubelet's plugin-registration API (`pluginregistration.Registration`), served on the registration socket.
//!
//! The kubelet's plugin watcher dials every socket that appears in `plugins_registry`, asks GetInfo (with a 1 s
//! timeout), hands the answer to the handler of its `type` (the DRA plugin manager for `DRAPlugin`), and tells the
//! plugin the outcome with NotifyRegistrationStatus. If that notification fails after a successful registration,
//! the kubelet deregisters the plugin again: it must always succeed.
//!
//! The 1.37 kubelet's DRA manager reads `supported_versions` as the list of gRPC services the plugin serves and
//! picks the newest it knows (`v1.DRAPlugin`, then `v1beta1.DRAPlugin`); the DRAResourceHealth service is optional
//! and only used when listed. This plugin serves DRA v1 alone and reports no device health.

use std::path::Path;

use tonic::{Request, Response, Status};

use crate::api::pluginregistration::registration_server::Registration;
use crate::api::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::driver::DriverName;

/// The plugin type the kubelet's DRA manager handles (k8s.io/kubelet pluginregistration/v1 `DRAPlugin`).
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// The gRPC services this plugin serves on its DRA socket, as the kubelet reads `supported_versions`
/// (k8s.io/kubelet dra/v1 `DRAPluginService`).
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1.DRAPlugin"];

/// The GetInfo answer: a DRA plugin for `driver`, served at `dra_socket` (the path the kubelet dials).
pub fn plugin_info(driver: &DriverName, dra_socket: &Path) -> PluginInfo {
    PluginInfo {
        r#type: PLUGIN_TYPE.to_owned(),
        name: driver.to_string(),
        endpoint: dra_socket.display().to_string(),
        supported_versions: SUPPORTED_VERSIONS.map(str::to_owned).to_vec(),
    }
}

/// The registration service of one driver's plugin.
#[derive(Debug)]
pub struct RegistrationService {
    info: PluginInfo,
    node: String,
}

impl RegistrationService {
    pub fn new(info: PluginInfo, node: String) -> Self {
        RegistrationService { info, node }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(node = %self.node, driver = %self.info.name, "the kubelet asked who we are");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(node = %self.node, driver = %self.info.name, "registered with the kubelet");
        } else {
            // The kubelet has already given up on this registration; answering with an error would only add a
            // second message to its log. The plugin keeps serving: the kubelet retries when the socket is
            // created again (a restart of the plugin).
            tracing::error!(
                node = %self.node,
                driver = %self.info.name,
                error = %status.error,
                "the kubelet refused the registration"
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_names_the_driver_its_socket_and_dra_v1() {
        let driver = DriverName::parse("vm.peerpods.io").unwrap();
        let info = plugin_info(&driver, Path::new("/k/plugins/vm.peerpods.io/dra.sock"));
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "vm.peerpods.io");
        assert_eq!(info.endpoint, "/k/plugins/vm.peerpods.io/dra.sock");
        assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    }
}
