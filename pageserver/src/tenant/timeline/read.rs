//! GetPage@LSN: the walk from the newest layer to the oldest, on top of a materialized page when
//! the page cache has one (see "Layer map" in the `timeline` module documentation), and the
//! layers a paged scan merges.

use super::*;

impl Timeline {
    /// Page `key` as of `lsn`; `None` if it has no version at or below `lsn`.
    pub fn get_page(&self, key: Key, lsn: Lsn) -> Result<Option<Bytes>, TimelineError> {
        let last_record = self.last_record_lsn();
        if lsn > last_record {
            return Err(TimelineError::LsnNotYetIngested { lsn, last_record });
        }
        let mat_key = MaterializedPageKey {
            tenant_id: self.tenant_id,
            timeline_id: self.cache_scope,
            key,
        };
        let cached = self.cache.lookup_materialized(&mat_key, lsn);
        // Versions at or below the cached one are already in it.
        let floor = cached.as_ref().map(|(l, _)| *l);

        let mut records: Vec<(Lsn, Value)> = Vec::new();
        {
            let map = self.map();
            // A layer whose newest version is at or below the cached page's LSN has nothing
            // to add, and neither has any older layer.
            let below_floor = |newest: Lsn| floor.is_some_and(|f| newest <= f);
            // Called once per layer asked for the key's versions.
            let mut take = |layer_records: LayerRecords| -> bool {
                crate::io::read_cost::layer_visited();
                for (version, value) in layer_records.records {
                    if below_floor(version) {
                        return true;
                    }
                    records.push((version, value));
                }
                layer_records.complete
            };
            let mut complete = false;
            if let Some(open) = map.open.as_ref().filter(|l| !l.is_empty()) {
                complete = below_floor(open.last_lsn()) || take(open.get(key, lsn)?);
            }
            for frozen in map.frozen.iter().rev() {
                if complete {
                    break;
                }
                complete = below_floor(frozen.last_lsn()) || take(frozen.get(key, lsn)?);
            }
            for delta in map.deltas.iter().rev() {
                if complete {
                    break;
                }
                let summary = delta.summary();
                if summary.lsn_start > lsn {
                    continue;
                }
                complete = below_floor(Lsn(summary.lsn_end.0 - 1)) || take(delta.get(key, lsn)?);
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
        let page = reconstruct_page(&records, self.conf.max_value_size)
            .map_err(|source| TimelineError::Redo { key, lsn, source })?;
        if let (Some(page), Some(newest)) = (&page, newest) {
            // The page is the same for every LSN from its newest version up to `lsn`.
            if records.len() > 1 {
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

    /// Runs `read` under the layer map's read lock with every layer, newest first, and the id
    /// of that layer set.
    pub(crate) fn with_scan_layers<T>(
        &self,
        read: impl FnOnce(LayerSetId, &[ScanLayer<'_>]) -> T,
    ) -> T {
        let map = self.map();
        let mut layers = Vec::with_capacity(1 + map.frozen.len() + map.deltas.len());
        layers.extend(map.open.iter().map(ScanLayer::InMemory));
        layers.extend(map.frozen.iter().rev().map(|l| ScanLayer::InMemory(l)));
        layers.extend(map.deltas.iter().rev().map(|l| ScanLayer::Delta(l)));
        let id = LayerSetId {
            incarnation: self.cache_scope,
            generation: map.generation,
        };
        read(id, &layers)
    }
}
