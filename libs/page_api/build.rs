//! Compiles `proto/page_service.proto` with protox, a protobuf compiler in Rust, so that a build
//! needs no `protoc` on the machine, and writes the compiled file descriptor set beside the
//! generated code: the server's reflection serves it ([`FILE_DESCRIPTOR_SET`] in the crate).

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/page_service.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR not set")?);
    std::fs::write(
        out_dir.join("page_service_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        // Pages are `Bytes`: a decoded page is a slice of the received buffer, not a copy.
        .bytes(".")
        .codec_path("crate::codec::PageCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
