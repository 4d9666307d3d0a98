//! On-demand layer downloads for the timeline's reads ([`LayerDownloader`]): the layer's
//! object, by the generation the plan knows it under, streamed into the reader's file and
//! checked against the manifest's size and CRC-32C.

use std::path::Path;

use super::index::layer_path;
use super::{count, RemoteTimelineClient};
use crate::tenant::storage_layer::on_demand::LayerDownloader;

impl LayerDownloader for RemoteTimelineClient {
    fn download(&self, name: &str, dest: &Path, size: u64, crc32c: u32) -> Result<(), String> {
        let generation = self
            .state()
            .plan
            .present_generation(name)
            .ok_or_else(|| "the remote index does not list it".to_owned())?;
        let key = layer_path(&self.remote_dir, name, generation).map_err(|e| e.to_string())?;
        let storage = self.context.storage.clone();
        let (task_key, task_dest) = (key.clone(), dest.to_owned());
        let result = self
            .context
            .block_on(async move { storage.download_to_file(&task_key, &task_dest).await });
        count("download", &result);
        let got = result.map_err(|e| e.to_string())?;
        crate::metrics::REMOTE_DOWNLOADED_BYTES.inc_by(got.len);
        if (got.len, got.crc32c) != (size, crc32c) {
            let _ = std::fs::remove_file(dest);
            return Err(format!(
                "{key} is {} bytes with CRC-32C {:#010x}; the manifest lists {size} bytes with {crc32c:#010x}",
                got.len, got.crc32c
            ));
        }
        Ok(())
    }
}
