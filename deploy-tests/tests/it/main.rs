//! The Helm chart's tests, one binary: rendered and checked with the real helm and kubeconform, installed on the
//! local control plane (beside cloud-api-adaptor's own chart, over an older release, with the services' real
//! binaries), with its admission policies tried as an attacker would (`least_privilege`), and on a real node
//! (`make test-node`, as root). Each module whose tests install cluster-wide objects has a control plane of its
//! own (`testenv::shared_for`).

mod alongside_caa;
mod alongside_coco;
mod caa;
mod chart;
mod chart_resources;
mod crd_upgrade;
mod least_privilege;
mod migration;
mod node;
mod owner_references;
mod prometheus;
mod support;
mod uninstall;
mod webhook;
