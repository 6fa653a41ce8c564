//! The published shapes the emulator answers with (the JSON files in `fixtures/`, see the README), and the
//! service-account keys it trusts and refuses.

pub(crate) const SERVICE_ACCOUNT_KEY: &str = include_str!("../fixtures/service-account-key.json");
pub(crate) const WRONG_SERVICE_ACCOUNT_KEY: &str =
    include_str!("../fixtures/wrong-service-account-key.json");
pub(crate) const INSTANCE: &str = include_str!("../fixtures/instance.json");
pub(crate) const INSTANCE_LIST: &str = include_str!("../fixtures/instance-list.json");
pub(crate) const OPERATION: &str = include_str!("../fixtures/operation.json");
pub(crate) const REGION_RESOURCE: &str = include_str!("../fixtures/region.json");
pub(crate) const ERROR_NOT_FOUND: &str = include_str!("../fixtures/error-not-found.json");
pub(crate) const ERROR_NOT_READY: &str = include_str!("../fixtures/error-not-ready.json");
pub(crate) const ERROR_UNAUTHENTICATED: &str =
    include_str!("../fixtures/error-unauthenticated.json");
pub(crate) const ERROR_RATE_LIMITED: &str = include_str!("../fixtures/error-rate-limited.json");
pub(crate) const ERROR_RATE_LIMIT_EXCEEDED: &str =
    include_str!("../fixtures/error-rate-limit-exceeded.json");
pub(crate) const ERROR_OPERATION_RATE_EXCEEDED: &str =
    include_str!("../fixtures/error-operation-rate-exceeded.json");
pub(crate) const OPERATION_ERROR_NOT_READY: &str =
    include_str!("../fixtures/operation-error-not-ready.json");
pub(crate) const OPERATION_ERROR_RATE_EXCEEDED: &str =
    include_str!("../fixtures/operation-error-rate-exceeded.json");
pub(crate) const ERROR_UNAVAILABLE: &str = include_str!("../fixtures/error-unavailable.json");
pub(crate) const ERROR_INVALID_FILTER: &str = include_str!("../fixtures/error-invalid-filter.json");
