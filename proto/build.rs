//! Generates the tonic client and server for `peerpods.provider.v1` with protox, so building needs
//! no protoc binary, and writes the encoded descriptor set that server reflection serves.

use std::path::PathBuf;

const PROTO: &str = "peerpods/provider/v1/provider.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The include root is this crate's directory, which is also the buf module root.
    let descriptors = protox::compile([PROTO], ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("peerpods_provider_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=peerpods");
    Ok(())
}
