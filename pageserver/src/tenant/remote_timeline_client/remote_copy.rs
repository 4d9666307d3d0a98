//! How the timeline sees its copy in remote storage ([`RemoteCopy`]): what the client does when
//! a manifest is committed, when a flush wants room in the upload queue, when the WAL receiver
//! reports a flush, and when the timeline stops.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use utils::Lsn;

use super::index::IndexPart;
use super::{lock, RemoteTimelineClient, SHUTDOWN_DRAIN_TIMEOUT};
use crate::tenant::timeline::layer_set::manifest::Manifest;
use crate::tenant::timeline::{ArchivedWalSegments, RemoteCopy, TimelineError};
use postgres_wal::segment::SegmentName;

impl RemoteCopy for RemoteTimelineClient {
    fn manifest_committed(&self, manifest: &Manifest) {
        let mut state = self.state();
        let mut target = IndexPart::from_manifest(manifest, self.generation, |name| {
            state.plan.layer_generation(name)
        });
        target.ancestry = self.ancestry;
        state.plan.set_target(target);
        self.publish_drain(&state);
        drop(state);
        self.wakeup.notify_one();
    }

    fn has_upload_room(&self) -> bool {
        self.has_room(&self.state())
    }

    fn upload_backlog(&self) -> Duration {
        self.drain.backlog()
    }

    fn wait_for_upload_room(&self, cancelled: &dyn Fn() -> bool) -> Result<(), TimelineError> {
        let limit = self.context.upload_queue_max_bytes;
        let max_wait = self.context.upload_room_timeout;
        let mut state = self.state();
        if self.has_room(&state) {
            return Ok(());
        }
        let started = Instant::now();
        tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
            queued_bytes = state.plan.pending_bytes(), limit,
            "a flush waits for the upload queue: more than upload_queue_max_bytes of layers wait for upload");
        while !self.has_room(&state) && !state.stopping && !cancelled() {
            let left = max_wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                let queued_bytes = state.plan.pending_bytes();
                let store_error = state.last_error.clone();
                drop(state);
                crate::metrics::UPLOAD_QUEUE_WAIT_SECONDS.observe(max_wait.as_secs_f64());
                tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                    queued_bytes, limit, "the upload queue had no room for {max_wait:?}: the flush gives up for now");
                return Err(TimelineError::UploadQueueFull {
                    queued_bytes,
                    limit,
                    waited: max_wait,
                    store_error: store_error
                        .map(|e| format!("; the last upload error: {e}"))
                        .unwrap_or_default(),
                });
            }
            state = self
                .progressed
                .wait_timeout(state, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let waited = started.elapsed();
        crate::metrics::UPLOAD_QUEUE_WAIT_SECONDS.observe(waited.as_secs_f64());
        tracing::info!(tenant = %self.tenant_id, timeline = %self.timeline_id,
            waited_ms = waited.as_millis() as u64, "the flush waited for the upload queue");
        Ok(())
    }

    fn remote_consistent_lsn(&self) -> Lsn {
        Lsn(self.remote_consistent_lsn.load(Ordering::Acquire))
    }

    fn is_in_store(&self, name: &str, size: u64, crc32c: u32) -> bool {
        // Listed by the durable index, not merely uploaded: a restart finds only what an index
        // lists, so a local copy whose layer no durable index lists yet must stay.
        self.state()
            .plan
            .durable_layer(name)
            .is_some_and(|l| (l.size, l.crc32c) == (size, crc32c))
    }

    fn wal_flushed(&self, dir: &Path, tli: u32, segment_size: u32, flushed: Lsn) {
        self.feed_wal(dir, tli, segment_size, flushed);
    }

    fn set_wal_receiver(&self, settings: Option<serde_json::Value>) {
        self.store_receiver_settings(settings);
    }

    fn archived_lsn(&self) -> Option<Lsn> {
        self.archived_wal_end()
    }

    fn wal_receiver_settings(&self) -> Option<serde_json::Value> {
        self.wal_index().receiver
    }

    fn fetch_wal(&self, dir: &Path, name: &str) -> Result<bool, String> {
        self.fetch_wal_segment(dir, name)
    }

    fn archived_wal_segments(&self) -> Option<ArchivedWalSegments> {
        let wal = self.wal_index();
        let size = wal.segment_size;
        let mut segments: Vec<_> = wal
            .segments
            .iter()
            .chain(wal.partial.iter().map(|(n, f)| (n, f)))
            .filter_map(|(name, f)| {
                let segment = SegmentName::parse(name, size)?;
                Some((segment.segno, name.clone(), f.commits))
            })
            .collect();
        if segments.is_empty() {
            return None;
        }
        segments.sort_by_key(|(segno, _, _)| *segno);
        Some(ArchivedWalSegments {
            segment_size: size,
            segments,
        })
    }

    fn lsn_floor_at_time(&self, unix_micros: i64) -> Option<Lsn> {
        let segments = self.archived_wal_segments()?;
        let size = segments.segment_size;
        let with_commits: Vec<_> = segments
            .segments
            .iter()
            .filter_map(|(segno, _, c)| c.map(|c| (*segno, c)))
            .collect();
        // The first segment with a commit at or after the time: the state then is at or
        // after its start. With none, the state then is the one after the last commit.
        match with_commits
            .iter()
            .find(|(_, c)| c.last_time >= unix_micros)
        {
            Some((segno, _)) => Some(postgres_wal::segment::segment_start(*segno, size)),
            None => with_commits.last().map(|(_, c)| c.last_end),
        }
    }

    fn retain_wal_from(&self, floor: Lsn) {
        self.set_wal_floor(floor);
    }

    fn fetch_wal_range(&self, dir: &Path, from: Lsn, to: Lsn) -> Result<(), String> {
        RemoteTimelineClient::fetch_wal_range(self, dir, from, to)
    }

    fn stop(&self, drain: bool) {
        let drained = drain && self.wait_settled(SHUTDOWN_DRAIN_TIMEOUT);
        if drain && !drained && !self.is_fenced() {
            tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                queued_bytes = self.queued_bytes(),
                "stopping with uploads not done after {SHUTDOWN_DRAIN_TIMEOUT:?}; the next start resumes them");
        }
        let mut state = self.state();
        state.stopping = true;
        self.publish_drain(&state);
        drop(state);
        self.wakeup.notify_one();
        self.progressed.notify_all();
        if let Some(task) = lock(&self.task).take() {
            if !drained {
                // A step in progress may wait on a store that does not answer: it is dropped
                // where it stands (the next start rebuilds the queue from the two manifests).
                task.abort();
            }
            let _ = futures::executor::block_on(task);
        }
        self.stop_wal_archive(drained);
    }
}
