//! peer-pod-config-ctrl's integration tests, one binary: PeerPodConfig scenarios against the real control
//! plane (Node objects created through the API), one at a time (`Scenario`); the CAA DaemonSet compared with
//! cloud-api-adaptor's own chart; cloud-api-adaptor's developer mode; the API requests it makes, counted on control
//! planes of their own.

mod caa_daemonset;
mod developer_mode;
mod dra;
mod operate;
mod outage;
mod scenarios;
mod support;
