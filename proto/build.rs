//! Generates the gRPC code and a file descriptor set (for server reflection) at build time, with
//! a vendored protoc so a fresh machine needs no manual install step.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "proto/poolgate/admission/v1/admission.proto",
        "proto/poolgate/selector/v1/selector.proto",
    ];
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("poolgate_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    Ok(())
}
