//! Names that more than one component spells, each declared once here.

/// The extended resource that counts peer-pod VMs: peer-pod-config-ctrl advertises it on nodes (or maps it onto
/// its DRA pool), the webhook makes a peer pod request one, `kubectl peerpods` reads it back.
pub const EXTENDED_RESOURCE: &str = "kata.peerpods.io/vm";

/// cloud-api-adaptor's ConfigMap (`CLOUD_PROVIDER`, `PODVM_DEVELOPER_MODE`, ...), as its chart names it. Both
/// controllers read it: peer-pod-config-ctrl wires it into CAA's DaemonSet, peerpod-ctrl reads developer mode.
pub const CAA_CONFIG_MAP: &str = "peer-pods-cm";

/// The path the peer-pods webhook serves and its MutatingWebhookConfiguration calls.
pub const WEBHOOK_PATH: &str = "/mutate-v1-pod";

/// The DRA driver of the peer-pod VM pool: peer-pod-config-ctrl publishes the pool's ResourceSlices under it and
/// the DRA kubelet plugin registers it (the plugin, which has no Kubernetes client, spells it once more and a
/// test of its ties it to this one).
pub const DRA_DRIVER: &str = "vm.peerpods.io";
