//! The gRPC API of provider-service, generated from `peerpods/provider/v1/provider.proto`.
//!
//! - [`v1`]: messages plus `provider_service_client` / `provider_service_server`.
//! - [`ProviderName`]: the values of `cloud_provider` (cloud-api-adaptor's `CLOUD_PROVIDER` names).
//! - [`ErrorReason`]: the `ErrorInfo` reasons of provider-service's errors; [`RequesterReason`]: why a
//!   controller asks for a delete.
//! - [`marks_do_not_delete`]: which values of the do-not-delete mark protect.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC server reflection.

pub use peerpods_protocol::{ProviderName, UnknownProviderName};

/// The key that marks something as not to be deleted, on both sides of the API: as a tag (label)
/// on a VM, provider-service refuses every delete of it (`FAILED_PRECONDITION`, reason
/// `DoNotDelete`); as an annotation on a PeerPod, peerpod-ctrl leaves its VM alone. Any value
/// counts except `false`. [`DO_NOT_DELETE_PORTABLE`] is the same mark spelled so that every cloud
/// can carry it as a VM tag. The rule lives with the protocol.
pub use peerpods_protocol::{DO_NOT_DELETE, DO_NOT_DELETE_PORTABLE};

/// Whether a value of the do-not-delete mark protects: any value except `false` (ignoring case and
/// blanks), so a typo protects rather than exposes. provider-service's guard and peerpod-ctrl's
/// annotation and tag reading both use it.
pub use peerpods_protocol::guard::marks_do_not_delete;

mod reason;
pub use reason::{ErrorReason, RequesterReason};

/// `peerpods.provider.v1`.
// Generated code: its doc comments are the proto comments verbatim, which rustdoc lints dislike.
#[allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]
pub mod v1 {
    tonic::include_proto!("peerpods.provider.v1");
}

/// Encoded `FileDescriptorSet` of `peerpods.provider.v1` (with its imports), for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(
    env!("OUT_DIR"),
    "/peerpods_provider_v1_descriptor.bin"
));
