//! The names of objects a remote store lists under a timeline's prefix
//! (`remote_timeline_client::index::classify_object`): each line of the input is one name.
//!
//! Checks, besides "no panic": a name taken for a layer is a layer name that prints back as
//! itself (so the object a later download asks for is the one listed), and a generation
//! suffix prints back as itself; a name taken for a WAL segment is the name the WAL archive
//! writes for it.

use pageserver::tenant::remote_timeline_client::index::{classify_object, RemoteObject};
use pageserver::tenant::remote_timeline_client::wal_index::WalIndex;
use pageserver::tenant::storage_layer::LayerName;

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    for name in text.lines() {
        match classify_object(name) {
            RemoteObject::Layer {
                name: layer,
                generation,
            } => {
                let parsed: LayerName = layer.parse().expect("classified as a layer");
                assert_eq!(
                    parsed.to_string(),
                    layer,
                    "a layer name that prints otherwise"
                );
                assert_eq!(format!("{layer}-{generation}"), name);
            }
            RemoteObject::Index(generation) => {
                assert_eq!(format!("index_part.json-{generation}"), name);
            }
            RemoteObject::Wal {
                name: segment,
                partial,
                generation,
            } => {
                // The key the archive writes for it, relative to the `wal/` folder.
                let key = WalIndex::object_name(&segment, partial, generation);
                assert_eq!(key.strip_prefix("wal/"), Some(name));
            }
            RemoteObject::Other => {}
        }
    }
}
