//! Compiles the `.proto` files under `<workspace>/proto` with protox (pure Rust, no protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let protos = [root.join("rl/env/v1/env_server.proto"), root.join("rl/train/v1/batch.proto")];
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let descriptors = protox::compile(&protos, [&root])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(descriptors)?;
    Ok(())
}
