//! A paged scan's reads of a delta layer: the versions a range needs at an LSN, from the index
//! alone, and then their values one by one, through the page cache as point reads read them.

use super::*;

/// The versions of one key being walked, oldest first.
struct KeyWalk {
    key: Key,
    /// The index entries of its versions at or below the scan's LSN, from the newest that needs
    /// no older history on: (lsn, entry).
    needed: Vec<(Lsn, u64)>,
    /// Where the newest of them ends: the offset of the entry after it, once seen.
    newest_end: Option<u64>,
    /// Versions above the scan's LSN passed over so far.
    passed: usize,
}

impl KeyWalk {
    fn new(key: Key) -> KeyWalk {
        KeyWalk {
            key,
            needed: Vec::new(),
            newest_end: None,
            passed: 0,
        }
    }

    /// Adds the key's versions to `chunk`, newest first; returns whether it had any.
    fn finish(self, chunk: &mut VersionChunk, next_offset: u64) -> bool {
        let newest_end = self.newest_end.unwrap_or(next_offset);
        let n = self.needed.len();
        for i in (0..n).rev() {
            let (lsn, entry) = self.needed[i];
            // Values lie in index order: a version's value ends where the next one's begins.
            let end = match self.needed.get(i + 1) {
                Some((_, next)) => next >> 1,
                None => newest_end,
            };
            chunk.versions.push(VersionRef {
                key: self.key,
                lsn,
                will_init: entry & WILL_INIT_BIT != 0,
                at: ValueAt::Delta { entry, end },
            });
        }
        n > 0
    }
}

impl DeltaLayer {
    /// The versions of the keys in `[from, end)` at or below `lsn` that reconstruction needs, in
    /// key order, a chunk of at most `max_keys` keys (at least one is asked for), read from the
    /// index alone (see [`VersionChunk`]). Index blocks are read through the page cache as point
    /// reads read them. Versions above `lsn` are walked past, and past a leaf's worth of them
    /// the index is descended again to the next key; each version's value is not read, but
    /// where it ends is noted (the next entry's offset), so that [`Self::read_version`] reads
    /// exactly its bytes without another index lookup.
    pub fn versions_at_lsn(
        &self,
        from: Key,
        end: Key,
        lsn: Lsn,
        max_keys: usize,
    ) -> Result<VersionChunk, LayerFileError> {
        let max_keys = max_keys.max(1);
        let from = from.max(self.summary.key_start);
        let end = end.min(self.summary.key_end);
        let mut chunk = VersionChunk::default();
        if from >= end || lsn < self.summary.lsn_start {
            return Ok(chunk);
        }
        let values_end = self.summary.values_end;
        self.with_index(Access::Point, |tree, _| {
            let mut keys = 0usize;
            let mut seek = from;
            'seek: loop {
                let mut walk: Option<KeyWalk> = None;
                for entry in tree.iter_from(&index_key(seek, Lsn(0))) {
                    let (found, value) = entry.map_err(|e: BtreeReadError| self.corrupt(e))?;
                    let (key, version) = split_index_key(&found);
                    let offset = value >> 1;
                    if let Some(w) = walk.as_mut().filter(|w| w.key == key) {
                        if version <= lsn {
                            // Versions come oldest first: a base makes the older ones useless.
                            if value & WILL_INIT_BIT != 0 {
                                w.needed.clear();
                            }
                            w.needed.push((version, value));
                            continue;
                        }
                        w.newest_end.get_or_insert(offset);
                        w.passed += 1;
                        // More versions than a leaf holds: a descent to the next key reads
                        // fewer blocks than walking the rest of them.
                        if w.passed >= PASS_OVER_BEFORE_SEEK {
                            let w = walk.take().expect("matched above");
                            keys += usize::from(w.finish(&mut chunk, offset));
                            // `key` < `end` <= Key::MAX, so it has a successor.
                            seek = key.next();
                            if chunk.is_full(keys, max_keys) {
                                chunk.resume = (seek < end).then_some(seek);
                                return Ok(chunk);
                            }
                            continue 'seek;
                        }
                        continue;
                    }
                    // A new key: the one before it is complete.
                    if let Some(w) = walk.take() {
                        keys += usize::from(w.finish(&mut chunk, offset));
                    }
                    if key >= end {
                        return Ok(chunk);
                    }
                    if chunk.is_full(keys, max_keys) {
                        chunk.resume = Some(key);
                        return Ok(chunk);
                    }
                    let mut w = KeyWalk::new(key);
                    if version <= lsn {
                        w.needed.push((version, value));
                    } else {
                        w.passed = 1;
                        w.newest_end = Some(offset);
                    }
                    walk = Some(w);
                }
                if let Some(w) = walk.take() {
                    w.finish(&mut chunk, values_end);
                }
                return Ok(chunk);
            }
        })
    }

    /// The value of a version [`Self::versions_at_lsn`] listed, from its entry and where it
    /// ends, checked as [`Self::get`] checks it.
    pub fn read_version(
        &self,
        key: Key,
        lsn: Lsn,
        entry: u64,
        end: u64,
    ) -> Result<Value, LayerFileError> {
        self.read_value_range(key, lsn, entry, end)
            .map(|(value, _)| value)
    }
}
