//! The WAL archive: the WAL a timeline's receiver stored on the local disk (`<timeline>/wal/`,
//! see `walreceiver::wal_store`), copied into the object store and listed in the remote index
//! (`wal_index.rs`), so that a lost disk or an attach elsewhere loses at most
//! `wal_upload_interval` of it, and so that restores read it from the store.
//!
//! A task of the client's, started by the first flush a receiver reports, runs a *round* every
//! `wal_upload_interval` (woken early by a stop):
//!
//! 1. every whole segment on the local disk that the section does not list is uploaded (its
//!    length and CRC-32C taken first, and checked against what the upload reads);
//! 2. the partial tail, from its segment's start to the flushed LSN, is uploaded when it grew,
//!    over the same object;
//! 3. each upload changes the section the upload queue writes into the next index (see
//!    `upload_plan.rs`: a WAL change is a target of its own), so an index never lists WAL
//!    the store does not hold;
//! 4. an object the section no longer lists (the partial tail of a segment now whole, an
//!    older generation's tail, a segment GC removed) is deleted once the durable index does
//!    not list it.
//!
//! GC (`timeline::gc::wal_floor`) hands the archive a floor: a round first removes the whole
//! segments below it from the local disk (so no round uploads them again), then from the
//! section. Every change to the section is made by the task, one round at a time, so a GC
//! never races an upload into listing a removed segment again.
//!
//! Each segment uploaded (and the tail) is decoded as well, for its first and last commit
//! (`wal_commits.rs`), which the section lists with it: the index of restores by time.
//!
//! `archived_lsn` is the durable index's: everything below it survives the local disk.
//!
//! Restores and `GET .../wal/{file}` fetch what the local disk lacks (`fetch_wal_segment`):
//! downloaded into the WAL directory under a temporary name, checked against the section
//! (a partial one's first `len` bytes), zero-filled to the segment size as the receiver's own
//! files are, fsynced, and linked into place unless the receiver wrote the file meanwhile.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use postgres_wal::segment::{segment_files_in, segment_start, segno_of, SegmentName};
use postgres_wal::xact::CommitRange;
use remote_storage::Transferred;
use utils::Lsn;

use super::upload_plan::UploadPlan;
use super::wal_commits::CommitScan;
use super::wal_index::{ArchivedFile, WalIndex, MAX_HISTORY_FILES, PARTIAL_SUFFIX};
use super::{count, lock, RemoteClientError, RemoteTimelineClient};
use crate::io::transfer_file::TransferFile;
use crate::tenant::timeline::WAL_DIR;

/// Where the receiver's WAL is, and how far it is durable there.
#[derive(Clone, Debug)]
pub(super) struct WalFeed {
    dir: PathBuf,
    tli: u32,
    segment_size: u32,
    flushed: Lsn,
}

/// The archive's part of the client's state.
#[derive(Default)]
pub(super) struct WalArchiveState {
    feed: Option<WalFeed>,
    /// Objects (keys under the timeline's prefix) the section stopped listing: deleted once no
    /// index the store or the queue holds lists them.
    retired: Vec<String>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub(super) last_error: Option<String>,
    /// WAL below it serves no restore (the timeline's GC says so): its whole segments go.
    floor: Lsn,
    /// The commit times of what was uploaded (`wal_commits.rs`); taken out during a round.
    scan: Option<CommitScan>,
}

impl RemoteTimelineClient {
    /// The receiver made the WAL of timeline `tli` durable in `dir` up to `flushed`. Starts
    /// the archive's task the first time.
    pub(super) fn feed_wal(&self, dir: &Path, tli: u32, segment_size: u32, flushed: Lsn) {
        let stopping = self.state().stopping;
        let mut wal = lock(&self.wal);
        wal.feed = Some(WalFeed {
            dir: dir.to_owned(),
            tli,
            segment_size,
            flushed,
        });
        if wal.task.is_none() && !stopping {
            if let Some(me) = self.me.upgrade() {
                wal.task = Some(self.context.handle().spawn(me.run_wal_archive()));
            }
        }
    }

    /// WAL below `floor` serves no restore: the next round removes the whole segments below
    /// it, from the local disk first and then from the section (whose objects then go).
    pub(super) fn set_wal_floor(&self, floor: Lsn) {
        let stopping = self.state().stopping;
        let has_wal =
            !self.state().plan.wal().segments.is_empty() || self.local_dir.join(WAL_DIR).exists();
        let mut wal = lock(&self.wal);
        if floor <= wal.floor {
            return;
        }
        wal.floor = floor;
        if wal.task.is_none() && !stopping && has_wal {
            if let Some(me) = self.me.upgrade() {
                wal.task = Some(self.context.handle().spawn(me.run_wal_archive()));
            }
        }
        drop(wal);
        self.wal_wakeup.notify_one();
    }

    /// The receiver's settings were stored (`Some`) or removed: the next index says so.
    pub(super) fn store_receiver_settings(&self, settings: Option<serde_json::Value>) {
        let mut state = self.state();
        let mut wal = state.plan.wal().clone();
        wal.receiver = settings;
        state.plan.set_wal(wal);
        drop(state);
        self.wakeup.notify_one();
    }

    /// Just past the last byte of WAL the durable index lists.
    pub fn archived_wal_end(&self) -> Option<Lsn> {
        self.state()
            .plan
            .durable_wal()
            .and_then(|w| w.archived_lsn())
    }

    /// The WAL section as the next index will have it.
    pub fn wal_index(&self) -> WalIndex {
        self.state().plan.wal().clone()
    }

    /// Whether the store holds, as the durable index of `plan` lists it, all the WAL
    /// reported flushed.
    pub(super) fn wal_caught_up(&self, plan: &UploadPlan) -> bool {
        let flushed = lock(&self.wal).feed.as_ref().map(|f| f.flushed);
        let archived = plan.durable_wal().and_then(|w| w.archived_lsn());
        flushed.is_none_or(|f| archived.is_some_and(|a| a >= f))
    }

    async fn run_wal_archive(self: Arc<Self>) {
        loop {
            if self.state().stopping || self.state().plan.is_fenced() {
                break;
            }
            let result = self.archive_round().await;
            let failed = result.as_ref().err().map(|e| e.to_string());
            if let Some(e) = &failed {
                tracing::error!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                    "archiving WAL failed; the next round tries again: {e}");
            }
            lock(&self.wal).last_error = failed;
            self.progressed.notify_all();
            let interval = self.context.wal_upload_interval;
            let _ = tokio::time::timeout(interval, self.wal_wakeup.notified()).await;
        }
    }

    /// One round: see the module documentation.
    async fn archive_round(&self) -> Result<(), RemoteClientError> {
        let (feed, floor) = {
            let state = lock(&self.wal);
            (state.feed.clone(), state.floor)
        };
        let mut wal = self.state().plan.wal().clone();
        let size = feed.as_ref().map_or(wal.segment_size, |f| f.segment_size);
        // Below it, nothing is uploaded and nothing is kept.
        let floor_segno = if size == 0 || floor == Lsn(0) {
            0
        } else {
            segno_of(floor, size)
        };
        if floor_segno > 0 {
            self.remove_wal_below(&mut wal, size, floor_segno).await?;
        }
        let Some(feed) = feed else {
            return self.delete_retired().await;
        };
        if wal.segment_size == 0 {
            wal.segment_size = feed.segment_size;
        } else if wal.segment_size != feed.segment_size {
            return Err(RemoteClientError::Local(format!(
                "the primary's WAL segments are {} bytes, the archive's {}: refusing to mix them",
                feed.segment_size, wal.segment_size
            )));
        }
        // The history files of the timelines the WAL went through (small: listed whole).
        let dir = feed.dir.clone();
        let histories = blocking(move || history_files(&dir))
            .await
            .map_err(|e| RemoteClientError::Local(format!("{}: {e}", feed.dir.display())))?;
        let mut new_history = false;
        for (name, contents) in histories {
            if wal.history.get(&name) != Some(&contents) {
                wal.history.insert(name, contents);
                new_history = true;
            }
        }
        if new_history {
            self.publish(&wal);
        }
        let dir = feed.dir.clone();
        let whole = blocking(move || whole_segments(&dir, size))
            .await
            .map_err(|e| RemoteClientError::Local(format!("{}: {e}", feed.dir.display())))?;
        for name in whole {
            let below_floor =
                SegmentName::parse(&name, size).is_some_and(|s| s.segno < floor_segno);
            if below_floor || wal.segments.contains_key(&name) || self.state().stopping {
                continue;
            }
            let path = feed.dir.join(&name);
            // Not a whole segment (a file someone put there): left alone, and logged.
            match std::fs::metadata(&path) {
                Ok(m) if m.len() != u64::from(size) => {
                    tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                        "{}: {} bytes, not a whole segment of {size}: not archived", path.display(), m.len());
                    continue;
                }
                _ => {}
            }
            let key = WalIndex::object_name(&name, false, self.generation);
            // Gone since the listing: removed by the WAL's garbage collection.
            let Some(mut file) = self.upload_wal_file(&path, &key, None).await? else {
                continue;
            };
            if let Some(segment) = SegmentName::parse(&name, size) {
                file.commits = self
                    .scan_commits(&path, segment.segno, file.len, size)
                    .await;
            }
            if file.len != u64::from(size) {
                return Err(RemoteClientError::Local(format!(
                    "{}: {} bytes, not a whole segment",
                    path.display(),
                    file.len
                )));
            }
            if let Some((partial, old)) = wal.partial.take_if(|(p, _)| *p == name) {
                self.retire(WalIndex::object_name(&partial, true, old.generation));
            }
            wal.segments.insert(name, file);
            self.publish(&wal);
        }
        let offset = feed.flushed.0 % u64::from(size);
        let tail = SegmentName::of(feed.tli, feed.flushed, size);
        let tail_name = tail.file_name(size);
        let newest_whole = wal
            .segments
            .keys()
            .filter_map(|n| SegmentName::parse(n, size))
            .map(|s| s.segno)
            .max();
        let grew = match &wal.partial {
            Some((name, f)) if *name == tail_name => offset > f.len,
            // An older segment's, or this one's under the timeline before a switch in it.
            Some((name, _)) => SegmentName::parse(name, size)
                .is_some_and(|s| (s.segno, s.tli) < (tail.segno, tail.tli)),
            None => true,
        };
        if offset > 0 && grew && newest_whole.is_none_or(|n| n < tail.segno) {
            let path = feed.dir.join(format!("{tail_name}{PARTIAL_SUFFIX}"));
            let key = WalIndex::object_name(&tail_name, true, self.generation);
            // `None`: filled up and renamed since the feed was read; the next round uploads it
            // whole.
            if let Some(mut file) = self.upload_wal_file(&path, &key, Some(offset)).await? {
                file.commits = self.scan_commits(&path, tail.segno, offset, size).await;
                if let Some((old, f)) = wal.partial.take() {
                    let old_key = WalIndex::object_name(&old, true, f.generation);
                    if old_key != key {
                        self.retire(old_key);
                    }
                }
                wal.partial = Some((tail_name, file));
                self.publish(&wal);
            }
        }
        self.delete_retired().await
    }

    /// Removes the WAL segments below segment `floor_segno`: the local files first (so no
    /// round uploads them again), then the section's entries, whose objects are retired.
    async fn remove_wal_below(
        &self,
        wal: &mut WalIndex,
        size: u32,
        floor_segno: u64,
    ) -> Result<(), RemoteClientError> {
        let dir = self.local_dir.join(WAL_DIR);
        let removed = blocking(move || {
            let mut removed = 0;
            for file in segment_files_in(&dir, size)? {
                if file.segment.segno < floor_segno {
                    std::fs::remove_file(&file.path)?;
                    removed += 1;
                }
            }
            if removed > 0 {
                crate::io::crashsafe::fsync_dir(&dir)?;
            }
            Ok(removed)
        })
        .await
        .map_err(|e| RemoteClientError::Local(format!("removing WAL below the GC floor: {e}")))?;
        let below =
            |name: &str| SegmentName::parse(name, size).is_some_and(|s| s.segno < floor_segno);
        let doomed: Vec<(String, ArchivedFile)> = wal
            .segments
            .iter()
            .filter(|(name, _)| below(name))
            .map(|(n, f)| (n.clone(), *f))
            .collect();
        let partial_doomed = wal.partial.as_ref().is_some_and(|(name, _)| below(name));
        if doomed.is_empty() && !partial_doomed && removed == 0 {
            return Ok(());
        }
        for (name, file) in &doomed {
            wal.segments.remove(name);
            self.retire(WalIndex::object_name(name, false, file.generation));
        }
        if partial_doomed {
            if let Some((name, file)) = wal.partial.take() {
                self.retire(WalIndex::object_name(&name, true, file.generation));
            }
        }
        if !doomed.is_empty() || partial_doomed {
            tracing::info!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                segments = doomed.len(), local_files = removed,
                "the WAL's GC removes the segments no restore needs");
            self.publish(wal);
        }
        Ok(())
    }

    /// Uploads the local WAL file `path` (its first `prefix` bytes, when given) as `key`;
    /// returns what the section lists of it, or `None` if the file is gone.
    async fn upload_wal_file(
        &self,
        path: &Path,
        key: &str,
        prefix: Option<u64>,
    ) -> Result<Option<ArchivedFile>, RemoteClientError> {
        let local = |e: io::Error| RemoteClientError::Local(format!("{}: {e}", path.display()));
        let opened = path.to_owned();
        let file = blocking(move || {
            let file = match prefix {
                Some(len) => TransferFile::open_prefix(&opened, len),
                None => TransferFile::open(&opened),
            };
            let file = match file {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                file => file?,
            };
            let (len, crc32c) = file.read_back()?;
            if prefix.is_some_and(|p| p != len) {
                return Err(io::Error::other(format!(
                    "{len} bytes, fewer than the {} reported flushed",
                    prefix.unwrap_or(0)
                )));
            }
            Ok(Some((file, Transferred { len, crc32c })))
        })
        .await
        .map_err(local)?;
        let Some((file, expected)) = file else {
            return Ok(None);
        };
        let key = self.remote_dir.join(key)?;
        let result = (self.context.storage)
            .upload(&key, Arc::new(file), Some(expected))
            .await;
        count("upload_wal", &result);
        let sent = result?;
        crate::metrics::REMOTE_UPLOADED_BYTES.inc_by(sent.len);
        Ok(Some(ArchivedFile {
            len: expected.len,
            crc32c: expected.crc32c,
            generation: self.generation,
            commits: None,
        }))
    }

    /// The commits of segment `segno` (`wal_commits.rs`), its file `path` fed to the scan up
    /// to `len` bytes; `None` if it has none, or its WAL does not decode (logged: a search by
    /// time then decodes more, nothing else is lost).
    async fn scan_commits(
        &self,
        path: &Path,
        segno: u64,
        len: u64,
        size: u32,
    ) -> Option<CommitRange> {
        let start = segment_start(segno, size);
        let kept = lock(&self.wal).scan.take();
        let mut scan = kept
            .filter(|s| s.next() >= start && s.next().0 <= start.0 + len)
            .unwrap_or_else(|| CommitScan::new(segno, size));
        let path = path.to_owned();
        let fed = blocking(move || {
            // A tail that filled up since it was uploaded has its final name now, and one a
            // timeline switch moved has a later timeline's (its first `len` bytes the same).
            let path = if path.exists() {
                path
            } else {
                let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
                // Not an older timeline's: its bytes after its own switch are another history.
                let tli = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| SegmentName::parse(n.get(..24)?, size))
                    .map_or(0, |s| s.tli);
                segment_files_in(&dir, size)?
                    .into_iter()
                    .filter(|f| f.segment.segno == segno && f.segment.tli >= tli)
                    .max_by_key(|f| (f.segment.tli, !f.partial))
                    .map_or(path, |f| f.path)
            };
            let result = scan.feed_file(&path, segno, len);
            Ok((scan, result))
        })
        .await;
        match fed {
            Ok((mut scan, Ok(()))) => {
                let range = scan.range_of(segno);
                scan.forget_before(segno);
                lock(&self.wal).scan = Some(scan);
                range
            }
            Ok((_, Err(e))) | Err(e) => {
                tracing::warn!(tenant = %self.tenant_id, timeline = %self.timeline_id,
                    "reading the commit times of WAL segment {segno:X}: {e}; the scan starts again at the next segment");
                None
            }
        }
    }

    /// Makes `wal` (the round's copy) the section the next index has. The receiver's settings
    /// are not the round's to change: they stay as `store_receiver_settings` last set them.
    fn publish(&self, wal: &WalIndex) {
        let mut state = self.state();
        let mut wal = wal.clone();
        wal.receiver = state.plan.wal().receiver.clone();
        state.plan.set_wal(wal);
        drop(state);
        self.wakeup.notify_one();
    }

    fn retire(&self, key: String) {
        lock(&self.wal).retired.push(key);
    }

    async fn delete_retired(&self) -> Result<(), RemoteClientError> {
        let retired = std::mem::take(&mut lock(&self.wal).retired);
        let mut kept = Vec::new();
        for key in retired {
            if self.state().plan.lists_wal_object(&key) {
                kept.push(key);
                continue;
            }
            let path = self.remote_dir.join(&key)?;
            let result = self.context.storage.delete(&path).await;
            count("delete", &result);
            if let Err(e) = result {
                kept.push(key);
                lock(&self.wal).retired.extend(kept);
                return Err(e.into());
            }
        }
        lock(&self.wal).retired.extend(kept);
        Ok(())
    }

    /// Makes WAL segment `name` (whole or partial) a file in the local WAL directory `dir`,
    /// downloading it if the section lists it and the directory lacks it. `Ok(false)` if
    /// neither has it.
    pub(super) fn fetch_wal_segment(&self, dir: &Path, name: &str) -> Result<bool, String> {
        let whole = dir.join(name);
        let partial_path = dir.join(format!("{name}{PARTIAL_SUFFIX}"));
        if whole.is_file() || partial_path.is_file() {
            return Ok(true);
        }
        let wal = self.state().plan.wal().clone();
        if let Some(contents) = wal.history.get(name) {
            write_history(dir, name, contents).map_err(|e| format!("{}: {e}", dir.display()))?;
            return Ok(true);
        }
        let (file, partial) = match (wal.segments.get(name), &wal.partial) {
            (Some(f), _) => (*f, false),
            (None, Some((p, f))) if p == name => (*f, true),
            _ => return Ok(false),
        };
        let key = WalIndex::object_name(name, partial, file.generation);
        let remote = self.remote_dir.join(&key).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // A name of its own: two fetches of one segment must not share a file.
        static FETCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = FETCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let temp = dir.join(format!("{name}.download-{n}"));
        let dest = if partial { partial_path } else { whole };
        let local = |e: io::Error| format!("{}: {e}", temp.display());
        let download = Arc::new(TransferFile::create(&temp).map_err(local)?);
        let storage = self.context.storage.clone();
        let task_file = download.clone();
        let result = self
            .context
            .block_on(async move { storage.download(&remote, task_file).await });
        count("download", &result);
        let got = result.map_err(|e| e.to_string())?;
        crate::metrics::REMOTE_DOWNLOADED_BYTES.inc_by(got.len);
        drop(download);
        let checked = (|| {
            let prefix = TransferFile::open_prefix(&temp, file.len)?;
            let (len, crc) = prefix.read_back()?;
            if (len, crc) != (file.len, file.crc32c) {
                return Err(io::Error::other(format!(
                    "the store's {key} holds {len} bytes with CRC-32C {crc:#010x} where the index lists {} bytes with {:#010x}",
                    file.len, file.crc32c
                )));
            }
            let f = std::fs::OpenOptions::new().write(true).open(&temp)?;
            // What the index does not vouch for is dropped; the rest of the segment is zeros,
            // as in the receiver's own files.
            f.set_len(file.len)?;
            f.set_len(u64::from(wal.segment_size))?;
            f.sync_all()?;
            // Not over a file the receiver created meanwhile: its own is newer.
            match std::fs::hard_link(&temp, &dest) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            std::fs::remove_file(&temp)?;
            crate::io::crashsafe::fsync_dir(dir)
        })();
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&temp);
            return Err(local(e));
        }
        Ok(true)
    }

    /// Makes every WAL segment the section lists that holds WAL of `from..=to` a file in
    /// `dir` (see [`Self::fetch_wal_segment`]).
    pub(super) fn fetch_wal_range(&self, dir: &Path, from: Lsn, to: Lsn) -> Result<(), String> {
        let wal = self.state().plan.wal().clone();
        let size = wal.segment_size;
        let wanted = wal
            .segments
            .keys()
            .chain(wal.partial.iter().map(|(name, _)| name))
            .filter(|name| {
                SegmentName::parse(name, size).is_some_and(|s| {
                    let start = s.start(size);
                    start <= to && Lsn(start.0.saturating_add(u64::from(size))) > from
                })
            })
            .cloned()
            .collect::<Vec<_>>();
        for name in wanted {
            self.fetch_wal_segment(dir, &name)?;
        }
        for (name, contents) in &wal.history {
            if !dir.join(name).is_file() {
                write_history(dir, name, contents)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
            }
        }
        Ok(())
    }

    /// Stops the archive's task (after the upload queue's: see `RemoteCopy::stop`).
    pub(super) fn stop_wal_archive(&self, drained: bool) {
        self.wal_wakeup.notify_one();
        let task = lock(&self.wal).task.take();
        if let Some(task) = task {
            if !drained {
                task.abort();
            }
            let _ = futures::executor::block_on(task);
        }
    }
}

/// The timeline history files in `dir`, by name, with their contents (those that are not
/// text, or not a history, are left out and logged: the archive lists only what restores can
/// use).
fn history_files(dir: &Path) -> io::Result<Vec<(String, String)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(tli) = postgres_wal::segment::parse_history_file_name(name) else {
            continue;
        };
        if found.len() == MAX_HISTORY_FILES {
            tracing::warn!(
                "{}: more than {MAX_HISTORY_FILES} history files: the rest are not archived",
                dir.display()
            );
            break;
        }
        let bytes = std::fs::read(entry.path())?;
        // Checked as the index's reader checks it (its length too), so that no index
        // published is one a later load refuses.
        match postgres_wal::history::TimelineHistory::parse(tli, &bytes) {
            Ok(_) => found.push((
                name.to_owned(),
                String::from_utf8(bytes).expect("a parsed history is text"),
            )),
            Err(e) => tracing::warn!("{}: {e}: not archived", entry.path().display()),
        }
    }
    Ok(found)
}

/// Writes history file `name` into `dir`, durably (its contents come from the index).
fn write_history(dir: &Path, name: &str, contents: &str) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // A name of its own: two restores may fetch the same file at once.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.download-{n}"));
    std::fs::write(&tmp, contents)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    crate::io::crashsafe::rename_durably(&tmp, &dir.join(name)).map_err(io::Error::other)
}

/// The whole segments in `dir` (names of `segment_size`), oldest first.
fn whole_segments(dir: &Path, segment_size: u32) -> io::Result<Vec<String>> {
    let mut found: Vec<_> = segment_files_in(dir, segment_size)?
        .into_iter()
        .filter(|f| !f.partial)
        .map(|f| {
            (
                f.segment.segno,
                f.segment.tli,
                f.segment.file_name(segment_size),
            )
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, _, name)| name).collect())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e.to_string())))
}
