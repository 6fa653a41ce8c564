//! Generates the tonic servers (and, for the tests, clients) of the two kubelet APIs vendored in `proto/` with
//! protox, as the workspace's proto crate does: no protoc binary anywhere.

const PROTOS: [&str; 2] = [
    "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
    "k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
