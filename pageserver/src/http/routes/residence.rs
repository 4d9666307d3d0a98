//! How much of a timeline's layer files, or a tenant's, is on the local disk: the fields of
//! tenant and timeline info that show an attach's prefetch filling the disk (and eviction
//! emptying it), `resident_layers` of `layers_total` files and `resident_bytes` of
//! `layer_bytes_total` bytes.
//!
//! Layer files only: the open and frozen in-memory layers are the timeline's own and always
//! local. Without remote storage, or once the prefetch is done within `max_local_layer_bytes`,
//! every file is resident; after an attach, none is until the prefetch or a read downloads it.

use serde_json::{json, Map, Value as JsonValue};

use crate::tenant::timeline::Timeline;

/// Resident layer files and bytes, against all of them.
#[derive(Default)]
pub(super) struct Residence {
    resident_layers: usize,
    layers_total: usize,
    resident_bytes: u64,
    layer_bytes_total: u64,
}

impl Residence {
    pub(super) fn of<'a>(timelines: impl IntoIterator<Item = &'a Timeline>) -> Residence {
        let mut r = Residence::default();
        for layer in timelines.into_iter().flat_map(|t| t.layers()) {
            if layer.file_name.is_none() {
                continue;
            }
            r.layers_total += 1;
            r.layer_bytes_total += layer.size_bytes;
            if layer.resident {
                r.resident_layers += 1;
                r.resident_bytes += layer.size_bytes;
            }
        }
        r
    }

    /// Adds the four fields to an info object.
    pub(super) fn add_to(&self, info: &mut JsonValue) {
        let fields: Map<String, JsonValue> = [
            ("resident_layers", json!(self.resident_layers)),
            ("layers_total", json!(self.layers_total)),
            ("resident_bytes", json!(self.resident_bytes)),
            ("layer_bytes_total", json!(self.layer_bytes_total)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if let JsonValue::Object(info) = info {
            info.extend(fields);
        }
    }
}
