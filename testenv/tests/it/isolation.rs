//! Test processes each get a control plane of their own, side by side, and leave nothing running behind.

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

/// Run in child processes by `two_test_processes_run_side_by_side`; on its own it only proves a start works.
#[tokio::test]
#[ignore = "run as a child process by two_test_processes_run_side_by_side"]
async fn child_process_probe() {
    let cp = testenv::shared();
    let client = cp.client().await;
    let ns = testenv::namespace(&client, "probe").await;
    println!("PROBE server={} namespace={ns}", cp.server_url());
}

struct Probe {
    server: String,
    namespace: String,
}

fn parse_probe(stdout: &str) -> Probe {
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("PROBE ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no PROBE line in child output:\n{stdout}"));
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            .to_owned()
    };
    Probe {
        server: field("server="),
        namespace: field("namespace="),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_test_processes_run_side_by_side() {
    let exe = std::env::current_exe().expect("test binary path");
    let spawn = || {
        Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                &testenv::test_name!("child_process_probe"),
                "--nocapture",
                "--test-threads=1",
            ])
            .output()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().expect("thread a"), b.join().expect("thread b"))
    });
    let (a, b) = (a.expect("run child a"), b.expect("run child b"));
    for out in [&a, &b] {
        assert!(
            out.status.success(),
            "child failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (a, b) = (
        parse_probe(&String::from_utf8_lossy(&a.stdout)),
        parse_probe(&String::from_utf8_lossy(&b.stdout)),
    );
    assert_ne!(a.server, b.server, "each process has its own API server");

    // This process's control plane is a third one and saw none of the children's namespaces.
    let client = testenv::shared().client().await;
    let namespaces: Api<Namespace> = Api::all(client);
    for probe in [&a, &b] {
        assert!(
            namespaces
                .get_opt(&probe.namespace)
                .await
                .expect("get")
                .is_none()
        );
    }

    // The children have exited: their control planes notice and stop, freeing their ports.
    for probe in [&a, &b] {
        let addr = probe.server.trim_start_matches("https://").to_owned();
        testenv::wait_for(
            &format!("control plane at {addr} to stop"),
            Duration::from_secs(40),
            || {
                let addr = addr.clone();
                async move {
                    TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_millis(200))
                        .is_err()
                        .then_some(())
                }
            },
        )
        .await;
    }
}
