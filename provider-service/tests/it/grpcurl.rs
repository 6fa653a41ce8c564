//! grpcurl (the common gRPC command-line client, from `.tools/venv`, installed by
//! `make python-tools`) can list the services through reflection and check health.

use std::process::Command;

fn grpcurl() -> std::path::PathBuf {
    let path = std::env::var_os("GRPCURL").map_or_else(
        || testenv::repo_root().join(".tools/venv/bin/grpcurl"),
        std::path::PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: run `make python-tools` (make test does)",
        path.display()
    );
    path
}

fn run(args: &[&str]) -> String {
    let out = Command::new(grpcurl()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "grpcurl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcurl_lists_describes_and_checks_health() {
    let dir = tempfile::tempdir().unwrap();
    crate::common::write_config(
        dir.path(),
        &[
            ("CLOUD_PROVIDER", "libvirt"),
            ("LIBVIRT_URI", "test:///default"),
        ],
    );
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let addr = server.addr.to_string();
    // grpcurl blocks; run it off the runtime that serves.
    let services = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || run(&["-plaintext", &addr, "list"])
    })
    .await
    .unwrap();
    // grpcurl 1.8 speaks reflection v1alpha, and the list shows the reflection service it used.
    for service in [
        "peerpods.provider.v1.ProviderService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(
            services.lines().any(|l| l == service),
            "{service} not in {services}"
        );
    }

    let health = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || run(&["-plaintext", &addr, "grpc.health.v1.Health/Check"])
    })
    .await
    .unwrap();
    assert!(health.contains("\"SERVING\""), "{health}");

    // Reflection serves the error details too, so grpcurl shows the ErrorInfo of an error.
    let refused = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            Command::new(grpcurl())
                .args([
                    "-plaintext",
                    "-d",
                    r#"{"cloud_provider": "nimbus", "instance_id": "x"}"#,
                    &addr,
                    "peerpods.provider.v1.ProviderService/DeleteInstance",
                ])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&refused.stderr).into_owned()
        + &String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "{shown}");
    for expected in [
        "Code:InvalidArgument",
        "type.googleapis.com/google.rpc.ErrorInfo",
        "\"reason\":\"UnknownProvider\"",
        "\"domain\":\"provider.peerpods.io\"",
    ] {
        let compact: String = shown.split_whitespace().collect();
        assert!(compact.contains(expected), "{expected} not in {shown}");
    }

    let providers = tokio::task::spawn_blocking(move || {
        run(&[
            "-plaintext",
            &addr,
            "peerpods.provider.v1.ProviderService/ListProviders",
        ])
    })
    .await
    .unwrap();
    assert!(providers.contains("\"libvirt\""), "{providers}");
}
