//! This controller's name, as the API server, its Events and the objects it owns know it.

/// This controller's name: the field manager of its applies and status writes (the deletion hold's condition has
/// its own, see [`crate::hold`]), the reporter of its Events, and the `app.kubernetes.io/managed-by` of what it owns.
pub const FIELD_MANAGER: &str = "peer-pod-config-ctrl";
