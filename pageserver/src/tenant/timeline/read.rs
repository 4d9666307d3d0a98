//! GetPage@LSN: the walk from the newest layer to the oldest, on top of a materialized page when
//! the page cache has one (see "Layer map" in the `timeline` module documentation), and the
//! layers a paged scan merges.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::tenant::storage_layer::key_history::KeyHistory;
use crate::tenant::storage_layer::VersionRef;
use scan::{LayerSetId, ScanLayer};

impl Timeline {
    /// Page `key` as of `lsn`; `None` if it has no version at or below `lsn`.
    pub fn get_page(&self, key: Key, lsn: Lsn) -> Result<Option<Bytes>, TimelineError> {
        self.get_page_inner(key, lsn, true)
    }

    /// [`Timeline::get_page`]; `check_cutoff` false only for a branch's read at its branch
    /// point ([`Timeline::ancestor_read`]), which GC retains.
    pub(super) fn get_page_inner(
        &self,
        key: Key,
        lsn: Lsn,
        check_cutoff: bool,
    ) -> Result<Option<Bytes>, TimelineError> {
        let last_record = self.last_record_lsn();
        if lsn > last_record {
            return Err(TimelineError::LsnNotYetIngested { lsn, last_record });
        }
        // The snapshot first: the cutoff is checked against the very layers walked, so GC
        // cannot remove what this read needs between the check and the walk.
        let map = self.layer_map();
        if check_cutoff {
            refuse_below_cutoff(&map, lsn)?;
        }
        self.get_page_in(&map, key, lsn)
    }

    /// Pages of a batch, each `(key, lsn)` its own GetPage@LSN, answered in request order.
    ///
    /// The batch is checked whole before any page is read (every LSN ingested, none below the
    /// GC cutoff), then read from one layer map snapshot in key order: neighbouring keys walk
    /// the same index blocks one after another, while they are hot, and a run of adjacent
    /// pages reads a layer's value blocks in file order.
    pub fn get_pages(&self, batch: &[(Key, Lsn)]) -> Result<Vec<Option<Bytes>>, TimelineError> {
        let Some(highest) = batch.iter().map(|(_, lsn)| *lsn).max() else {
            return Ok(Vec::new());
        };
        let last_record = self.last_record_lsn();
        if highest > last_record {
            return Err(TimelineError::LsnNotYetIngested {
                lsn: highest,
                last_record,
            });
        }
        let map = self.layer_map();
        let lowest = batch.iter().map(|(_, lsn)| *lsn).min().unwrap_or(highest);
        refuse_below_cutoff(&map, lowest)?;
        if batch.len() > 1 && crate::io::cached_only::may_wait() {
            // Best effort: a failure here is met again, and reported, by the read itself.
            if let Err(e) = self.read_ahead(&map, batch) {
                tracing::debug!("reading a batch ahead failed: {e}");
            }
        }
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_unstable_by_key(|&i| batch[i]);
        let mut pages = vec![None; batch.len()];
        for i in order {
            let (key, lsn) = batch[i];
            pages[i] = self.get_page_in(&map, key, lsn)?;
        }
        Ok(pages)
    }

    /// Brings the values a batch will read into the page cache in as few reads as their blocks
    /// allow. For each LSN of the batch (compute asks for a batch at one LSN), the layers are
    /// asked newest first for the versions of the batch's keys whose point reads still need
    /// that layer ([`KeyHistory`]: no base found yet, no image layer answering for them), listed
    /// by [`Layer::versions_at_lsn`] over their key span from the index alone, and read ahead
    /// ([`Layer::prefetch_values`]). From the first layer where the keys are not neighbours
    /// (its span holds more than twice as many keys as are pending), or that is not on the
    /// local disk, the rest is left to the point reads: an older layer's values may not be
    /// needed at all.
    fn read_ahead(&self, map: &LayerMap, batch: &[(Key, Lsn)]) -> Result<(), TimelineError> {
        let mut by_lsn: BTreeMap<Lsn, BTreeSet<Key>> = BTreeMap::new();
        for (key, lsn) in batch {
            by_lsn.entry(*lsn).or_default().insert(*key);
        }
        for (lsn, mut pending) in by_lsn {
            for layer in map.newest_first() {
                let (Some(&first), Some(&last)) = (pending.first(), pending.last()) else {
                    break;
                };
                let span = first..last.next();
                if matches!(layer, Layer::InMemory(_)) || !layer.may_hold(&span, lsn) {
                    continue;
                }
                // Not downloaded just to read ahead (it may hold only keys between the
                // batch's); the point reads download it if they need it. What older layers
                // hold may not be needed either, so reading ahead stops here.
                if matches!(&layer, Layer::OnDemand(l) if !l.is_resident()) {
                    break;
                }
                // Room for the batch's keys and as many others between them.
                let room = 2 * pending.len();
                let chunk = layer.versions_at_lsn(span.start, span.end, lsn, room)?;
                if chunk.resume.is_some() {
                    break;
                }
                let listed: Vec<VersionRef> = chunk
                    .versions
                    .into_iter()
                    .filter(|v| pending.contains(&v.key))
                    .collect();
                // Each key's versions in this layer, as its point read will take them: a key
                // whose history this layer completes needs nothing from older layers.
                let mut wanted = Vec::with_capacity(listed.len());
                for versions in listed.chunk_by(|a, b| a.key == b.key) {
                    let mut history = KeyHistory::default();
                    let taken = history.take(&layer, versions[0].key, versions);
                    wanted.extend_from_slice(&versions[..taken]);
                    if history.is_complete() {
                        pending.remove(&versions[0].key);
                    }
                }
                // An image layer answers for the keys it does not hold, too.
                if layer.is_image() {
                    pending.retain(|key| !layer.is_authoritative_for(*key));
                }
                layer.prefetch_values(&wanted)?;
            }
        }
        Ok(())
    }

    /// GetPage@LSN on the layer map snapshot `map`, whose cutoff the caller has checked.
    fn get_page_in(
        &self,
        map: &LayerMap,
        key: Key,
        lsn: Lsn,
    ) -> Result<Option<Bytes>, TimelineError> {
        let mat_key = MaterializedPageKey {
            tenant_id: self.tenant_id,
            timeline_id: self.cache_scope,
            key,
        };
        let cached = self.cache.lookup_materialized(&mat_key, lsn);
        // Versions at or below the cached one are already in it.
        let floor = cached.as_ref().map(|(l, _)| *l);

        let mut records: Vec<(Lsn, Value)> = Vec::new();
        let keys = key..key.next();
        let mut history = KeyHistory::from_floor(floor);
        // A page made from a decompressed value is kept even when it took one version: the
        // next read then skips the decompression (as it skips the redo of a longer history).
        let mut decompressed = false;
        for layer in map.newest_first() {
            if !layer.may_hold(&keys, lsn) {
                // Nothing at or below lsn, or not this key: skipped without I/O.
                continue;
            }
            if history.ends_before(&layer) {
                break;
            }
            crate::io::read_cost::layer_visited();
            // Nothing at or below the materialized page is read (or decompressed) again.
            let found = layer.get_above(key, lsn, floor)?;
            decompressed |= found.decompressed;
            let taken = history.take_records(&layer, key, &found);
            records.extend(found.records.into_iter().take(taken));
            if history.is_complete() {
                break;
            }
        }
        // A branch whose own layers hold no base: the rest of the history is its ancestor's,
        // as of the branch point at the latest (a memorized page already includes it).
        let complete = history.is_complete();
        if let (false, None, Some(ancestor)) = (complete, &cached, self.ancestor_read(lsn)) {
            let base =
                ancestor
                    .timeline
                    .get_page_inner(key, ancestor.lsn, ancestor.check_cutoff)?;
            if let Some(base) = base {
                if records.is_empty() {
                    return Ok(Some(base));
                }
                records.push((ancestor.lsn, Value::Image(base)));
            }
        }
        if let Some((cached_lsn, lease)) = &cached {
            if records.is_empty() {
                return Ok(Some(Bytes::copy_from_slice(&lease[..])));
            }
            records.push((
                *cached_lsn,
                Value::Image(Bytes::copy_from_slice(&lease[..])),
            ));
        }
        drop(cached);
        let newest = records.first().map(|(l, _)| *l);
        let page = reconstruct_page_taking(&mut records, self.conf.max_value_size)
            .map_err(|source| TimelineError::of_redo(key, lsn, &records, source))?;
        if let (Some(page), Some(newest)) = (&page, newest) {
            // The page is the same for every LSN from its newest version up to `lsn`.
            if records.len() > 1 || decompressed {
                if let Ok(full) = <&[u8; PAGE_SZ]>::try_from(&page[..]) {
                    // Best effort: a full cache just means no memorized copy.
                    let _ = self.cache.memorize_materialized(&mat_key, newest, full);
                }
            }
        }
        Ok(page)
    }

    /// The next page of the key-range scan `cursor` describes: see [`crate::tenant::timeline::scan`].
    pub fn scan_page(
        &self,
        cursor: &mut ScanCursor,
        limit: usize,
    ) -> Result<ScanPage, TimelineError> {
        scan::next_page(self, cursor, limit)
    }

    /// What a scan at `lsn` merges, and the id of that layer set: every layer of this timeline,
    /// newest first, read at `lsn`; then, for a branch, every layer of its ancestor read at the
    /// branch LSN (or `lsn`, if lower), and so on up the chain. That is the order and the LSNs
    /// GetPage walks in, so a scan of a branch sees the keys and pages its point reads see.
    /// Refused below the GC cutoff of this timeline's set; an ancestor's is checked as GetPage
    /// checks it (not at a branch point, which GC retains).
    pub(crate) fn scan_layers(
        &self,
        lsn: Lsn,
    ) -> Result<(LayerSetId, Vec<ScanLayer>), TimelineError> {
        let mut id = LayerSetId {
            timelines: Vec::new(),
        };
        let mut layers = Vec::new();
        let (mut timeline, mut at, mut check_cutoff) = (self, lsn, true);
        loop {
            // Each snapshot before its cutoff check, as in GetPage.
            let map = timeline.layer_map();
            if check_cutoff {
                refuse_below_cutoff(&map, at)?;
            }
            id.timelines.push((timeline.cache_scope, map.version));
            layers.extend(map.newest_first().map(|layer| ScanLayer { layer, lsn: at }));
            drop(map);
            let Some(ancestor) = timeline.ancestor_read(at) else {
                break;
            };
            timeline = ancestor.timeline;
            at = ancestor.lsn;
            check_cutoff = ancestor.check_cutoff;
        }
        Ok((id, layers))
    }

    /// The GC cutoff: reads below it are refused.
    pub fn gc_cutoff_lsn(&self) -> Lsn {
        self.layer_map().gc_cutoff
    }
}

/// A read at `lsn` on `map` is refused below its GC cutoff: the layers it would need may be
/// gone, and a page from what is left could be wrong.
fn refuse_below_cutoff(map: &LayerMap, lsn: Lsn) -> Result<(), TimelineError> {
    if lsn < map.gc_cutoff {
        return Err(TimelineError::BelowGcCutoff {
            lsn,
            cutoff: map.gc_cutoff,
        });
    }
    Ok(())
}
