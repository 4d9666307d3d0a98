//! The page service's gRPC protocol (`proto/page_service.proto`, docs/grpc-api.md): the
//! messages and the client and server that tonic generates from it, and the checked
//! conversions between its wire fields and our types.
//!
//! Both ends use this crate: the pageserver implements [`proto::page_service_server`], and
//! pagebench (or an embedding client) calls through [`proto::page_service_client`]. Every field
//! that arrives from the other end is untrusted; the conversions here refuse what is not
//! exactly a key, an LSN or a relation fork, with an error that says which field and why.

use pageserver_api::datadir::RelTag;
use pageserver_api::key::KEY_SIZE;
use pageserver_api::Key;
use utils::Lsn;

pub mod codec;

/// The generated messages, client and server.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("pageserver.page.v1");
}

/// The compiled `.proto` (a `FileDescriptorSet`, encoded): what server reflection tells clients
/// such as grpcurl about the protocol.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("page_service_descriptor");

/// Metadata that names the tenant of a call.
pub const TENANT_ID_HEADER: &str = "tenant-id";
/// Metadata that names the timeline of a call.
pub const TIMELINE_ID_HEADER: &str = "timeline-id";

/// Most pages one `GetPagesRequest` may ask for.
pub const MAX_BATCH_PAGES: usize = 1024;

/// A wire field that is not what the protocol says it must be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("key: {0} bytes, expected {KEY_SIZE}")]
    KeyLength(usize),
    #[error("rel: missing")]
    MissingRel,
    #[error("rel.fork: {0} is not a fork number (0 main, 1 fsm, 2 visibility map, 3 init)")]
    Fork(u32),
    #[error("pages: a batch asks for 1 to {MAX_BATCH_PAGES} pages, this one for {0}")]
    BatchSize(usize),
}

/// The key of a wire `key` field.
pub fn key_from_wire(bytes: &[u8]) -> Result<Key, ProtocolError> {
    let bytes: [u8; KEY_SIZE] = bytes
        .try_into()
        .map_err(|_| ProtocolError::KeyLength(bytes.len()))?;
    Ok(Key::from_bytes(bytes))
}

/// A wire `lsn`: `None` for 0, "the latest".
pub fn lsn_from_wire(lsn: u64) -> Option<Lsn> {
    Some(Lsn(lsn)).filter(|l| l.is_valid())
}

/// The relation fork of a wire `rel` field.
pub fn rel_from_wire(rel: Option<&proto::RelTag>) -> Result<RelTag, ProtocolError> {
    let rel = rel.ok_or(ProtocolError::MissingRel)?;
    let forknum = u8::try_from(rel.fork)
        .ok()
        .filter(|f| *f <= 3)
        .ok_or(ProtocolError::Fork(rel.fork))?;
    Ok(RelTag {
        spcnode: rel.spcnode,
        dbnode: rel.dbnode,
        relnode: rel.relnode,
        forknum,
    })
}

/// The wire form of a relation fork.
pub fn rel_to_wire(rel: &RelTag) -> proto::RelTag {
    proto::RelTag {
        spcnode: rel.spcnode,
        dbnode: rel.dbnode,
        relnode: rel.relnode,
        fork: u32::from(rel.forknum),
    }
}

/// Checks a batch's size.
pub fn check_batch_size(pages: usize) -> Result<(), ProtocolError> {
    if (1..=MAX_BATCH_PAGES).contains(&pages) {
        Ok(())
    } else {
        Err(ProtocolError::BatchSize(pages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_wrong_lengths_are_refused() {
        let key = Key::rel_block(1663, 5, 16384, 0, 7);
        assert_eq!(key_from_wire(&key.to_bytes()), Ok(key));
        assert_eq!(key_from_wire(&[0; 17]), Err(ProtocolError::KeyLength(17)));
        assert_eq!(key_from_wire(&[]), Err(ProtocolError::KeyLength(0)));
        assert_eq!(key_from_wire(&[0; 19]), Err(ProtocolError::KeyLength(19)));
    }

    #[test]
    fn lsn_zero_is_the_latest() {
        assert_eq!(lsn_from_wire(0), None);
        assert_eq!(lsn_from_wire(0x16B5A50), Some(Lsn(0x16B5A50)));
    }

    #[test]
    fn rels_round_trip_and_bad_forks_are_refused() {
        let rel = RelTag {
            spcnode: 1663,
            dbnode: 5,
            relnode: 16384,
            forknum: 2,
        };
        assert_eq!(rel_from_wire(Some(&rel_to_wire(&rel))), Ok(rel));
        assert_eq!(rel_from_wire(None), Err(ProtocolError::MissingRel));
        let bad = proto::RelTag {
            fork: 4,
            ..rel_to_wire(&rel)
        };
        assert_eq!(rel_from_wire(Some(&bad)), Err(ProtocolError::Fork(4)));
        let huge = proto::RelTag {
            fork: 260,
            ..rel_to_wire(&rel)
        };
        assert_eq!(rel_from_wire(Some(&huge)), Err(ProtocolError::Fork(260)));
    }

    #[test]
    fn the_descriptor_set_describes_the_service() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
        let file = set
            .file
            .iter()
            .find(|f| f.name() == "page_service.proto")
            .unwrap();
        assert_eq!(file.package(), "pageserver.page.v1");
        let service = &file.service[0];
        assert_eq!(
            format!("{}.{}", file.package(), service.name()),
            proto::page_service_server::SERVICE_NAME
        );
        assert!(service.method.iter().any(|m| m.name() == "GetPages"));
    }

    #[test]
    fn batch_sizes() {
        assert!(check_batch_size(1).is_ok());
        assert!(check_batch_size(MAX_BATCH_PAGES).is_ok());
        assert_eq!(check_batch_size(0), Err(ProtocolError::BatchSize(0)));
        assert_eq!(
            check_batch_size(MAX_BATCH_PAGES + 1),
            Err(ProtocolError::BatchSize(MAX_BATCH_PAGES + 1))
        );
    }
}
