//! The results of a run: `target/bench/results.json` (one key per scenario, in the order of [`Results`]) and the
//! table printed at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::Error;

/// A scenario's figures, or why there are none.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Outcome<T> {
    Measured(T),
    /// The scenario was not selected.
    Skipped {
        skipped: String,
    },
    /// The scenario was selected but a part it needs is not there: no figures, and the run exits non-zero.
    Missing {
        missing: String,
    },
    /// The scenario ran and broke; no figures.
    Failed {
        failed: String,
    },
}

impl<T> Outcome<T> {
    pub fn skipped(why: impl Into<String>) -> Self {
        Outcome::Skipped {
            skipped: why.into(),
        }
    }

    pub fn from_result(result: Result<T, Error>) -> Self {
        match result {
            Ok(figures) => Outcome::Measured(figures),
            Err(e) => Outcome::from_error(&e),
        }
    }

    /// Missing when a part is missing, failed otherwise.
    pub fn from_error(error: &Error) -> Self {
        match error {
            Error::Missing { .. } => Outcome::Missing {
                missing: error.to_string(),
            },
            _ => Outcome::Failed {
                failed: format!("{error} ({})", error.reason()),
            },
        }
    }

    /// Whether a selected scenario gave no figures (it broke, timed out, or lacked a part): the run exits non-zero.
    pub fn failed(&self) -> bool {
        matches!(self, Outcome::Failed { .. } | Outcome::Missing { .. })
    }
}

/// Field order is the order of the keys in results.json.
#[derive(Debug, Serialize)]
pub struct Results {
    /// How the local control plane the figures come from is tuned for speed (no fsync in etcd, raised request
    /// limits, ...), as it announces itself: figures from a production cluster would differ.
    pub control_plane_tuning: Vec<String>,
    pub storm: Outcome<Storm>,
    pub memory: Outcome<Memory>,
    pub cloud_calls: Outcome<CloudCalls>,
    pub convergence: Outcome<Convergence>,
    pub grpc: Outcome<Grpc>,
    /// Per cloud: the cleanup of N PeerPods under 20% 5xx, 10% throttling and 5% hangs.
    pub fault_storm: Outcome<Vec<crate::scenarios::fault_storm::CloudStorm>>,
    /// New clients beside 500 idle connections on both TLS ports; cleanup throughput under a capacity flood.
    pub load: Outcome<crate::scenarios::load::Load>,
    /// CPU and RSS of the three services at rest with N PeerPods and M Nodes.
    pub idle: Outcome<crate::scenarios::idle::Idle>,
}

#[derive(Debug, Serialize)]
pub struct Storm {
    pub peerpods: usize,
    /// Delete of all PeerPods → every finalizer released and every moto instance terminated.
    pub cleanup_seconds: f64,
    /// Delete of all PeerPods → the same client released every finalizer with parallel patches, no cloud call.
    pub floor_seconds: f64,
    pub floor_concurrency: usize,
    /// cleanup_seconds / floor_seconds.
    pub ratio: f64,
    /// The EC2 calls a confirmed delete of every instance needs (look, terminate, look), made by the bench
    /// itself on a moto of its own: what the cloud alone costs.
    pub cloud_floor_seconds: f64,
    /// cleanup_seconds / the slower of the two floors.
    pub ratio_to_slower_floor: f64,
    pub peerpods_per_second: f64,
    /// API writes (PeerPod patches, status, Events) per released PeerPod, counted by the API server.
    pub api_writes_per_delete: f64,
    /// Of those, writes to the PeerPod itself (patches and status; target: 1.0, the finalizer's release).
    pub peerpod_writes_per_delete: f64,
    /// Of those, Events (where a cleanup's outcome goes).
    pub event_writes_per_delete: f64,
    /// Delete of all PeerPods → the last of the storm's Events written: Events are written behind the releases,
    /// by one writer, so they may land after the cleanup.
    pub events_written_seconds: f64,
    /// The same storm with provider-service stopped from the delete on for this long, then back.
    pub outage_seconds: f64,
    /// API writes while provider-service was away.
    pub outage_writes_during: f64,
    /// API writes per released PeerPod through the outage and the recovery.
    pub outage_api_writes_per_delete: f64,
    /// outage_api_writes_per_delete / api_writes_per_delete (target: at most 1.2).
    pub outage_writes_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct Memory {
    pub peerpods: usize,
    pub nodes: usize,
    pub peerpod_ctrl_peak_rss_mib: f64,
    /// Resident set size once every PeerPod is reconciled and the caches settled.
    pub peerpod_ctrl_rss_mib: f64,
    pub peer_pod_config_ctrl_peak_rss_mib: f64,
    pub peer_pod_config_ctrl_rss_mib: f64,
}

#[derive(Debug, Serialize)]
pub struct CloudCalls {
    pub deletes: usize,
    /// HTTP requests to EC2 (moto) signed by provider-service during the storm, counted on the cloud's side, so
    /// retries inside the SDK count too.
    pub ec2_calls: u64,
    pub ec2_calls_by_operation: BTreeMap<String, u64>,
    /// The same calls as provider-service counts them (provider_service_cloud_api_calls_total: SDK operations).
    pub sdk_operations: u64,
    pub ec2_calls_per_delete: f64,
    /// DeleteInstance calls provider-service answered (peerpod-ctrl → provider-service).
    pub delete_instance_calls: u64,
}

#[derive(Debug, Serialize)]
pub struct Convergence {
    pub nodes: usize,
    pub from_total: u32,
    pub to_total: u32,
    /// Creating the Nodes (two writes each, no part of any figure below).
    pub nodes_created_seconds: f64,
    /// One entry per capacity mode, in the order they ran.
    pub modes: Vec<ModeConvergence>,
    /// The whole scenario: nodes created, every mode, cleanup.
    pub seconds: f64,
}

/// One capacity mode over the same Nodes. Times end when the API holds the total (every node's
/// `status.capacity` its share in node mode; the DeviceClass and a whole pool of that many devices in dra mode).
/// Writes are the API server's own count (`apiserver_request_total`), all clients, by resource.
#[derive(Debug, Serialize)]
pub struct ModeConvergence {
    /// node or dra (PeerPodConfig spec.capacityMode).
    pub mode: String,
    /// Controller start → the API holds from_total.
    pub first_seconds: f64,
    /// Writes to what carries the capacity: nodes (and nodes/status) in node mode, deviceclasses and
    /// resourceslices in dra mode.
    pub first_capacity_writes: u64,
    pub first_api_writes: u64,
    pub first_api_writes_by_resource: BTreeMap<String, u64>,
    /// PeerPodConfig update → the API holds to_total.
    pub change_seconds: f64,
    pub change_capacity_writes: u64,
    pub change_api_writes: u64,
    pub change_api_writes_by_resource: BTreeMap<String, u64>,
    pub steady_window_seconds: f64,
    /// Writes (POST/PUT/PATCH/APPLY/DELETE) the API server served in the window, by resource (all clients,
    /// including kube-controller-manager).
    pub steady_api_writes_by_resource: BTreeMap<String, u64>,
    pub steady_api_writes: u64,
    /// Writes peer-pod-config-ctrl counted itself in the window (node capacity, owned objects, status).
    pub steady_controller_writes: u64,
    /// This mode from its PeerPodConfig's creation to its removal.
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct Grpc {
    pub calls: usize,
    /// The server ran with TLS and TokenReview, as deployed.
    pub tls: bool,
    pub token_review: bool,
    pub direct_p50_us: f64,
    pub direct_p99_us: f64,
    pub grpc_p50_us: f64,
    pub grpc_p99_us: f64,
    /// grpc_p50_us - direct_p50_us.
    pub overhead_p50_us: f64,
    /// The Go client (CAA's): health Check and DeleteInstance round trips over the same TLS + token setup.
    pub go_check_p50_us: f64,
    pub go_check_p99_us: f64,
    pub go_delete_p50_us: f64,
    pub go_delete_p99_us: f64,
    /// The Rust client's authenticated DeleteInstance beside a flood: idle connections from many peers and streams
    /// of calls with no token or a forged one, every one of which was refused.
    pub flood_idle_connections: usize,
    pub flood_streams: usize,
    pub flood_calls_refused: u64,
    pub flood_delete_p50_us: f64,
    pub flood_delete_p99_us: f64,
}

impl Results {
    pub fn any_failed(&self) -> bool {
        self.storm.failed()
            || self.memory.failed()
            || self.cloud_calls.failed()
            || self.convergence.failed()
            || self.grpc.failed()
            || self.fault_storm.failed()
            || self.load.failed()
            || self.idle.failed()
            // A leaked VM, an early release, a check without an answer, an unchecked release or a deleted part
            // that was not the VM's is a failed run, whatever the figures.
            || matches!(&self.fault_storm, Outcome::Measured(clouds)
                if clouds.iter().any(|c| !c.problems().is_empty()))
    }

    pub fn to_json(&self) -> Result<String, Error> {
        Ok(serde_json::to_string_pretty(self)? + "\n")
    }

    /// The table printed at the end of a run: scenario, figure, value.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String, String)> = Vec::new();
        let mut add = |scenario: &str, figure: &str, value: String| {
            rows.push((scenario.into(), figure.into(), value));
        };
        if !self.control_plane_tuning.is_empty() {
            add(
                "cluster",
                "control plane tuned for speed",
                self.control_plane_tuning.join(", "),
            );
        }
        match &self.storm {
            Outcome::Measured(s) => {
                add("storm", "PeerPods", s.peerpods.to_string());
                add(
                    "storm",
                    "cleanup (finalizers + instances)",
                    secs(s.cleanup_seconds),
                );
                add(
                    "storm",
                    &format!("floor (parallel patches x{})", s.floor_concurrency),
                    secs(s.floor_seconds),
                );
                add("storm", "ratio cleanup / floor", format!("{:.2}x", s.ratio));
                add(
                    "storm",
                    "cloud floor (EC2 look, terminate, look; moto)",
                    secs(s.cloud_floor_seconds),
                );
                add(
                    "storm",
                    "ratio cleanup / slower floor",
                    format!("{:.2}x", s.ratio_to_slower_floor),
                );
                add(
                    "storm",
                    "PeerPods/s",
                    format!("{:.1}", s.peerpods_per_second),
                );
                add(
                    "storm",
                    "API writes per delete (API server's count)",
                    format!("{:.2}", s.api_writes_per_delete),
                );
                add(
                    "storm",
                    "  of which to the PeerPod (target 1.0)",
                    format!("{:.2}", s.peerpod_writes_per_delete),
                );
                add(
                    "storm",
                    "  of which Events",
                    format!("{:.2}", s.event_writes_per_delete),
                );
                add(
                    "storm",
                    "every Event written (behind the releases)",
                    secs(s.events_written_seconds),
                );
                add(
                    "storm",
                    &format!("outage ({:.0} s): API writes while away", s.outage_seconds),
                    format!("{:.0}", s.outage_writes_during),
                );
                add(
                    "storm",
                    "outage: API writes per delete",
                    format!("{:.2}", s.outage_api_writes_per_delete),
                );
                add(
                    "storm",
                    "outage: writes / success path (target <= 1.2x)",
                    format!("{:.2}x", s.outage_writes_ratio),
                );
            }
            other => add("storm", "", not_measured(other)),
        }
        match &self.memory {
            Outcome::Measured(m) => {
                add(
                    "memory",
                    "PeerPods / Nodes",
                    format!("{} / {}", m.peerpods, m.nodes),
                );
                add(
                    "memory",
                    "peerpod-ctrl peak / settled RSS",
                    format!(
                        "{} / {}",
                        mib(m.peerpod_ctrl_peak_rss_mib),
                        mib(m.peerpod_ctrl_rss_mib)
                    ),
                );
                add(
                    "memory",
                    "peer-pod-config-ctrl peak / settled RSS",
                    format!(
                        "{} / {}",
                        mib(m.peer_pod_config_ctrl_peak_rss_mib),
                        mib(m.peer_pod_config_ctrl_rss_mib)
                    ),
                );
            }
            other => add("memory", "", not_measured(other)),
        }
        match &self.idle {
            Outcome::Measured(i) => {
                add(
                    "idle",
                    "PeerPods / Nodes (selected)",
                    format!("{} / {} ({})", i.peerpods, i.nodes, i.selected_nodes),
                );
                for s in &i.services {
                    add(
                        "idle",
                        &format!("{} idle CPU / RSS / peak RSS (catch-up CPU)", s.name),
                        format!(
                            "{:.2}m / {} / {} ({:.1} s)",
                            s.cpu_millicores,
                            mib(s.rss_mib),
                            mib(s.peak_rss_mib),
                            s.catch_up_cpu_seconds
                        ),
                    );
                }
            }
            other => add("idle", "", not_measured(other)),
        }
        match &self.cloud_calls {
            Outcome::Measured(c) => {
                add("cloud_calls", "deletes", c.deletes.to_string());
                add(
                    "cloud_calls",
                    "EC2 HTTP requests (counted by moto)",
                    c.ec2_calls.to_string(),
                );
                for (operation, n) in &c.ec2_calls_by_operation {
                    add("cloud_calls", &format!("  {operation}"), n.to_string());
                }
                add(
                    "cloud_calls",
                    "EC2 calls per delete",
                    format!("{:.3}", c.ec2_calls_per_delete),
                );
                add(
                    "cloud_calls",
                    "EC2 operations (provider-service's count)",
                    c.sdk_operations.to_string(),
                );
                add(
                    "cloud_calls",
                    "DeleteInstance gRPC calls",
                    c.delete_instance_calls.to_string(),
                );
            }
            other => add("cloud_calls", "", not_measured(other)),
        }
        match &self.convergence {
            Outcome::Measured(c) => {
                add(
                    "convergence",
                    "nodes (created in)",
                    format!("{} ({})", c.nodes, secs(c.nodes_created_seconds)),
                );
                for m in &c.modes {
                    let mode = &m.mode;
                    add(
                        "convergence",
                        &format!(
                            "{mode}: first (total {}): time / capacity writes / API writes",
                            c.from_total
                        ),
                        format!(
                            "{} / {} / {}",
                            secs(m.first_seconds),
                            m.first_capacity_writes,
                            m.first_api_writes
                        ),
                    );
                    add(
                        "convergence",
                        &format!(
                            "{mode}: change {} -> {}: time / capacity writes / API writes",
                            c.from_total, c.to_total
                        ),
                        format!(
                            "{} / {} / {}",
                            secs(m.change_seconds),
                            m.change_capacity_writes,
                            m.change_api_writes
                        ),
                    );
                    for (resource, n) in &m.change_api_writes_by_resource {
                        add("convergence", &format!("  {resource}"), n.to_string());
                    }
                    let window = format!("{:.0}s", m.steady_window_seconds);
                    add(
                        "convergence",
                        &format!("{mode}: steady API / controller writes per {window}"),
                        format!("{} / {}", m.steady_api_writes, m.steady_controller_writes),
                    );
                    for (resource, n) in &m.steady_api_writes_by_resource {
                        add("convergence", &format!("  {resource}"), n.to_string());
                    }
                    add(
                        "convergence",
                        &format!("{mode}: mode took"),
                        secs(m.seconds),
                    );
                }
                add("convergence", "scenario took", secs(c.seconds));
            }
            other => add("convergence", "", not_measured(other)),
        }
        match &self.grpc {
            Outcome::Measured(g) => {
                add("grpc", "DeleteInstance calls each way", g.calls.to_string());
                add(
                    "grpc",
                    "direct p50 / p99",
                    format!("{} / {}", us(g.direct_p50_us), us(g.direct_p99_us)),
                );
                add(
                    "grpc",
                    "via gRPC p50 / p99",
                    format!("{} / {}", us(g.grpc_p50_us), us(g.grpc_p99_us)),
                );
                add(
                    "grpc",
                    "overhead p50 (TLS + TokenReview)",
                    us(g.overhead_p50_us),
                );
                add(
                    "grpc",
                    "Go client Check p50 / p99",
                    format!("{} / {}", us(g.go_check_p50_us), us(g.go_check_p99_us)),
                );
                add(
                    "grpc",
                    "Go client DeleteInstance p50 / p99",
                    format!("{} / {}", us(g.go_delete_p50_us), us(g.go_delete_p99_us)),
                );
                add(
                    "grpc",
                    &format!(
                        "flood: {} idle connections, {} streams without a valid token",
                        g.flood_idle_connections, g.flood_streams
                    ),
                    format!("{} calls refused", g.flood_calls_refused),
                );
                add(
                    "grpc",
                    "DeleteInstance p50 / p99 under the flood",
                    format!(
                        "{} / {}",
                        us(g.flood_delete_p50_us),
                        us(g.flood_delete_p99_us)
                    ),
                );
            }
            other => add("grpc", "", not_measured(other)),
        }
        match &self.fault_storm {
            Outcome::Measured(clouds) => {
                for cloud in clouds {
                    for (figure, value) in crate::scenarios::fault_storm::rows(cloud) {
                        add(&format!("fault_storm {}", cloud.cloud), &figure, value);
                    }
                }
            }
            other => add("fault_storm", "", not_measured(other)),
        }
        match &self.load {
            Outcome::Measured(load) => {
                for (figure, value) in crate::scenarios::load::rows(load) {
                    add("load", &figure, value);
                }
            }
            other => add("load", "", not_measured(other)),
        }
        let width =
            |f: fn(&(String, String, String)) -> usize| rows.iter().map(f).max().unwrap_or(0);
        let (w0, w1) = (width(|r| r.0.len()).max(8), width(|r| r.1.len()).max(6));
        let mut out = String::new();
        let _ = writeln!(out, "{:<w0$}  {:<w1$}  value", "scenario", "figure");
        let _ = writeln!(
            out,
            "{}  {}  {}",
            "-".repeat(w0),
            "-".repeat(w1),
            "-".repeat(12)
        );
        for (scenario, figure, value) in &rows {
            let _ = writeln!(out, "{scenario:<w0$}  {figure:<w1$}  {value}");
        }
        out
    }
}

fn not_measured<T>(outcome: &Outcome<T>) -> String {
    match outcome {
        Outcome::Skipped { skipped } => format!("skipped: {skipped}"),
        Outcome::Missing { missing } => format!("missing: {missing}"),
        Outcome::Failed { failed } => format!("failed: {failed}"),
        Outcome::Measured(_) => String::new(),
    }
}

fn secs(s: f64) -> String {
    format!("{s:.2} s")
}

fn mib(m: f64) -> String {
    format!("{m:.1} MiB")
}

fn us(u: f64) -> String {
    format!("{u:.0} µs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keys_in_issue_order_with_skips_and_failures() {
        let results = Results {
            control_plane_tuning: vec!["etcd-unsafe-no-fsync".into()],
            storm: Outcome::Measured(Storm {
                peerpods: 2,
                cleanup_seconds: 4.0,
                floor_seconds: 1.0,
                floor_concurrency: 32,
                ratio: 4.0,
                cloud_floor_seconds: 2.0,
                ratio_to_slower_floor: 2.0,
                peerpods_per_second: 0.5,
                api_writes_per_delete: 2.0,
                peerpod_writes_per_delete: 1.0,
                event_writes_per_delete: 1.0,
                events_written_seconds: 5.0,
                outage_seconds: 10.0,
                outage_writes_during: 4.0,
                outage_api_writes_per_delete: 2.1,
                outage_writes_ratio: 1.05,
            }),
            memory: Outcome::skipped("not selected"),
            cloud_calls: Outcome::from_result(Err(Error::Missing {
                what: "moto".into(),
                hint: "make moto".into(),
                source: None,
            })),
            convergence: Outcome::from_result(Err(Error::setup("broken"))),
            grpc: Outcome::skipped("not selected"),
            fault_storm: Outcome::skipped("not selected"),
            load: Outcome::skipped("not selected"),
            idle: Outcome::skipped("not selected"),
        };
        let json = results.to_json().expect("encodes");
        let keys: Vec<usize> = [
            "\"control_plane_tuning\"",
            "\"storm\"",
            "\"memory\"",
            "\"cloud_calls\"",
            "\"convergence\"",
            "\"grpc\"",
        ]
        .iter()
        .map(|k| json.find(k).expect("key present"))
        .collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "keys out of order: {json}"
        );
        let value: serde_json::Value = serde_json::from_str(&json).expect("parses");
        assert_eq!(value["memory"]["skipped"], "not selected");
        assert!(
            value["cloud_calls"]["missing"]
                .as_str()
                .is_some_and(|s| s.contains("make moto"))
        );
        assert!(
            value["convergence"]["failed"]
                .as_str()
                .is_some_and(|s| s.contains("Setup"))
        );
        assert_eq!(value["storm"]["ratio"], 4.0);
        assert_eq!(value["storm"]["peerpod_writes_per_delete"], 1.0);
        assert_eq!(value["storm"]["event_writes_per_delete"], 1.0);
        assert_eq!(value["control_plane_tuning"][0], "etcd-unsafe-no-fsync");
        assert!(results.any_failed());
        let table = results.table();
        assert!(table.contains("skipped: not selected"));
        assert!(table.contains("failed: broken"));
        assert!(table.contains("missing: "));
        assert!(table.contains("4.00x"));
        assert!(table.contains("of which to the PeerPod (target 1.0)"));
    }

    #[test]
    fn convergence_prints_and_records_each_capacity_mode() {
        let mode = |mode: &str, change_seconds: f64, change_capacity_writes: u64| ModeConvergence {
            mode: mode.into(),
            first_seconds: 1.0,
            first_capacity_writes: 10,
            first_api_writes: 30,
            first_api_writes_by_resource: BTreeMap::new(),
            change_seconds,
            change_capacity_writes,
            change_api_writes: change_capacity_writes + 3,
            change_api_writes_by_resource: BTreeMap::from([("peerpodconfigs".into(), 1)]),
            steady_window_seconds: 60.0,
            steady_api_writes_by_resource: BTreeMap::new(),
            steady_api_writes: 0,
            steady_controller_writes: 0,
            seconds: 70.0,
        };
        let results = Results {
            convergence: Outcome::Measured(Convergence {
                nodes: 5000,
                from_total: 5000,
                to_total: 12500,
                nodes_created_seconds: 20.0,
                modes: vec![mode("node", 50.5, 5000), mode("dra", 0.75, 98)],
                seconds: 200.0,
            }),
            ..fault_storm(clean_cloud())
        };
        let table = results.table();
        for row in [
            "node: change 5000 -> 12500: time / capacity writes / API writes",
            "50.50 s / 5000 / 5003",
            "dra: change 5000 -> 12500: time / capacity writes / API writes",
            "0.75 s / 98 / 101",
        ] {
            assert!(table.contains(row), "{row} missing: {table}");
        }
        let value: serde_json::Value =
            serde_json::from_str(&results.to_json().expect("encodes")).expect("parses");
        let modes = &value["convergence"]["modes"];
        assert_eq!(modes[0]["mode"], "node");
        assert_eq!(modes[1]["mode"], "dra");
        assert_eq!(modes[1]["change_capacity_writes"], 98);
        assert_eq!(modes[1]["change_seconds"], 0.75);
        assert_eq!(
            modes[0]["change_api_writes_by_resource"]["peerpodconfigs"],
            1
        );
    }

    fn fault_storm(cloud: crate::scenarios::fault_storm::CloudStorm) -> Results {
        Results {
            control_plane_tuning: Vec::new(),
            storm: Outcome::skipped("not selected"),
            memory: Outcome::skipped("not selected"),
            cloud_calls: Outcome::skipped("not selected"),
            convergence: Outcome::skipped("not selected"),
            grpc: Outcome::skipped("not selected"),
            fault_storm: Outcome::Measured(vec![cloud]),
            load: Outcome::skipped("not selected"),
            idle: Outcome::skipped("not selected"),
        }
    }

    fn clean_cloud() -> crate::scenarios::fault_storm::CloudStorm {
        crate::scenarios::fault_storm::CloudStorm {
            cloud: "azure".into(),
            peerpods: 20,
            settings: crate::scenarios::fault_storm::StormSettings {
                server_error_rate: 0.2,
                throttle_rate: 0.1,
                hang_rate: 0.05,
                operation_polls: Some(8),
                invisible_get_seconds: 10.0,
                invisible_list_seconds: 20.0,
                invisible_delete_seconds: 10.0,
                flapping_seconds: 30.0,
                flapping_miss_rate: 0.5,
                seed: 7,
            },
            cleanup_seconds: 12.5,
            release_p50_seconds: 6.0,
            release_p95_seconds: 11.0,
            releases_observed: 20,
            releases_unchecked: 0,
            released_early: 0,
            leaked: 0,
            failed_checks: 0,
            failed_check_errors: Vec::new(),
            foreign_parts: 2,
            foreign_parts_deleted: 0,
            cloud_requests: 300,
            cloud_requests_per_peerpod: 15.0,
            server_errors: 50,
            throttled: 30,
            hangs: 10,
            not_seen: 40,
            delete_instance_calls: 60,
        }
    }

    #[test]
    fn a_fault_storm_fails_the_run_by_a_check_without_answer_an_unchecked_release_or_a_foreign_part()
     {
        let clean = fault_storm(clean_cloud());
        assert!(!clean.any_failed());
        let table = clean.table();
        for figure in [
            "cleanup (last finalizer)",
            "cloud calls per PeerPod",
            "released early",
            "VMs leaked",
            "foreign parts deleted",
            "failed checks",
        ] {
            assert!(table.contains(figure), "{figure} missing: {table}");
        }
        assert!(table.contains("0 of 2"), "{table}");
        let value: serde_json::Value =
            serde_json::from_str(&clean.to_json().expect("encodes")).expect("parses");
        let cloud = &value["fault_storm"][0];
        for key in [
            "cleanup_seconds",
            "cloud_requests_per_peerpod",
            "released_early",
            "leaked",
            "foreign_parts_deleted",
            "failed_checks",
        ] {
            assert!(cloud.get(key).is_some(), "{key} missing: {value}");
        }
        assert_eq!(cloud["settings"]["operation_polls"], 8);

        let failed_check = fault_storm(crate::scenarios::fault_storm::CloudStorm {
            failed_checks: 1,
            failed_check_errors: vec!["release check of vm-1: no answer".into()],
            ..clean_cloud()
        });
        assert!(failed_check.any_failed());
        assert!(
            failed_check
                .table()
                .contains("FAILED: 1 checks without an answer"),
            "{}",
            failed_check.table()
        );
        let unchecked = crate::scenarios::fault_storm::CloudStorm {
            releases_observed: 19,
            releases_unchecked: 1,
            ..clean_cloud()
        };
        assert!(fault_storm(unchecked).any_failed());
        let foreign = crate::scenarios::fault_storm::CloudStorm {
            foreign_parts_deleted: 1,
            ..clean_cloud()
        };
        assert!(fault_storm(foreign).any_failed());
    }
}
