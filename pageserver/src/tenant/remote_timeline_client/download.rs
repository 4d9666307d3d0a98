//! On-demand layer downloads for the timeline's reads ([`LayerDownloader`]): the layer's
//! object, by the generation the plan knows it under, streamed into the reader's file
//! ([`TransferFile`]) and checked against the manifest's size and CRC-32C twice: as it arrived,
//! and as the disk holds it, read back (a torn write is found there, not by a later read).
//!
//! The deadline comes from remote storage itself (`remote_storage_operation_timeout` of each
//! part): a stalled store fails the download, and so the read, within it. A failure is shared
//! for [`FAILED_DOWNLOAD_SHARED_FOR`] with the readers queued behind it on the same layer.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::index::layer_path;
use super::{count, lock, RemoteTimelineClient};
use crate::io::transfer_file::TransferFile;
use crate::tenant::storage_layer::on_demand::LayerDownloader;

/// A layer download that failed is not tried again for this long: the readers queued behind it
/// on the layer take its error at once, instead of each waiting out a deadline of its own (with
/// a stalled store, the last of three readers would wait three deadlines); a reader after that
/// tries again.
pub const FAILED_DOWNLOAD_SHARED_FOR: Duration = Duration::from_secs(1);
impl LayerDownloader for RemoteTimelineClient {
    /// The deadline comes from remote storage: the download fails within
    /// `remote_storage_operation_timeout` of its last part, whatever the store does.
    fn download(&self, name: &str, dest: &Path, size: u64, crc32c: u32) -> Result<(), String> {
        if let Some(e) = self.recent_download_failure(name) {
            return Err(e);
        }
        let result = self.download_layer(name, dest, size, crc32c);
        let mut failed = lock(&self.failed_downloads);
        match &result {
            Ok(()) => {
                failed.remove(name);
            }
            Err(e) => {
                failed.retain(|_, (at, _)| at.elapsed() < FAILED_DOWNLOAD_SHARED_FOR);
                failed.insert(name.to_owned(), (Instant::now(), e.clone()));
            }
        }
        result
    }
}

impl RemoteTimelineClient {
    /// The error of a download of `name` that failed within [`FAILED_DOWNLOAD_SHARED_FOR`].
    fn recent_download_failure(&self, name: &str) -> Option<String> {
        let failed = lock(&self.failed_downloads);
        let (at, e) = failed.get(name)?;
        let ago = at.elapsed();
        (ago < FAILED_DOWNLOAD_SHARED_FOR)
            .then(|| format!("{e} (a download that failed {} ms ago)", ago.as_millis()))
    }

    fn download_layer(
        &self,
        name: &str,
        dest: &Path,
        size: u64,
        crc32c: u32,
    ) -> Result<(), String> {
        let generation = self
            .state()
            .plan
            .present_generation(name)
            .ok_or_else(|| "the remote index does not list it".to_owned())?;
        let key = layer_path(&self.remote_dir, name, generation).map_err(|e| e.to_string())?;
        let file = Arc::new(
            TransferFile::create(dest).map_err(|e| format!("creating {}: {e}", dest.display()))?,
        );
        let storage = self.context.storage.clone();
        let (task_key, task_file) = (key.clone(), file.clone());
        let result = self
            .context
            .block_on(async move { storage.download(&task_key, task_file).await });
        count("download", &result);
        let got = result.map_err(|e| e.to_string())?;
        crate::metrics::REMOTE_DOWNLOADED_BYTES.inc_by(got.len);
        let refuse = |what: &str, len: u64, crc: u32| {
            let _ = std::fs::remove_file(dest);
            Err(format!(
                "{what} is {len} bytes with CRC-32C {crc:#010x}; the manifest lists {size} bytes with {crc32c:#010x}"
            ))
        };
        if (got.len, got.crc32c) != (size, crc32c) {
            return refuse(&key.to_string(), got.len, got.crc32c);
        }
        // What arrived was right; what the disk holds is what reads will see.
        let (len, crc) = file
            .read_back()
            .map_err(|e| format!("reading back {}: {e}", dest.display()))?;
        if (len, crc) != (size, crc32c) {
            return refuse(
                &format!("the download of {key} as written to disk"),
                len,
                crc,
            );
        }
        Ok(())
    }
}
