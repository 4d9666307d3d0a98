//! Compiles `proto/page_service.proto` with protox, a protobuf compiler in Rust, so that a build
//! needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/page_service.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Pages are `Bytes`: a decoded page is a slice of the received buffer, not a copy.
        .bytes(".")
        .codec_path("crate::codec::PageCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
