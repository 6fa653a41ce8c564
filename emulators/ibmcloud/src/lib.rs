//! A local emulator of the IBM Cloud endpoints provider-service's `ibmcloud` and
//! `ibmcloud-powervs` backends call, for tests: [`VpcEmulator`] (IAM, VPC API, Global Tagging,
//! Global Search)
//! and [`PowerVsEmulator`] (IAM, Power Cloud API, Global Tagging). Each is an axum server on
//! 127.0.0.1, on its own thread, stopped when dropped; answers are built from the fixtures in
//! `fixtures/` (see the README for their sources).

mod common;
mod front_door;
mod powervs;
mod search;
#[cfg(test)]
mod visibility_tests;
mod vpc;

pub use common::{ACCOUNT_ID, API_KEY, IbmEmulator, Knobs};
pub use powervs::{PowerVsEmulator, WORKSPACE_ID, ZONE as POWERVS_ZONE};
pub use vpc::{VpcEmulator, ZONE as VPC_ZONE};

/// Response examples of IBM's published API definitions, verbatim (sources in the README), to
/// be served with [`IbmEmulator::answer_next_verbatim`].
pub mod examples {
    /// `GET /v1/instances` (VPC API `ListInstances`): one instance, `next.href` to a 2nd page.
    pub const VPC_LIST_INSTANCES: &str =
        include_str!("../fixtures/examples/vpc_list_instances.json");
    /// `GET /v1/instances/{id}/network_interfaces/{nic}/floating_ips` (VPC API
    /// `ListInstanceNetworkInterfaceFloatingIps`): one floating IP.
    pub const VPC_LIST_NIC_FLOATING_IPS: &str =
        include_str!("../fixtures/examples/vpc_list_instance_network_interface_floating_ips.json");
    /// A VPC 409 Conflict (the VPC error schema: `errors[]` of `code`, `message`, `more_info`,
    /// `status_code`, `trace`): the instance's status does not allow the request yet. Serve it
    /// with `answer_next_verbatim(route, 409, ..)`.
    pub const VPC_ERROR_CONFLICT: &str = include_str!("../fixtures/vpc_error_conflict.json");
    /// A Power Cloud 409 Conflict (the Power `Error` model: `code`, `description`, `error`,
    /// `message`), which the Power API definition lists for deleting a PVM instance: the
    /// instance is in a transitional state. Serve it with `answer_next_verbatim(route, 409, ..)`.
    pub const POWER_ERROR_CONFLICT: &str = include_str!("../fixtures/power_error_conflict.json");
}
