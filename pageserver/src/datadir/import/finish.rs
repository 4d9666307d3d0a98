//! The end of an import: the checks that need the whole archive, the metadata values that list
//! what it holds, and the commit.

use super::listing::Fork;
use super::*;

impl Importer<'_> {
    /// The checks that need the whole archive, the metadata values, and the commit.
    pub(super) fn finish(mut self, lsn: Option<Lsn>) -> Result<ImportReport, ImportError> {
        let control = self.control.ok_or_else(|| {
            ImportError::Invalid(
                "the archive has no global/pg_control: it is not a PostgreSQL data directory"
                    .to_string(),
            )
        })?;
        if let Some(old) = &self.old_snapshots {
            if old.system_identifier != control.system_identifier {
                return Err(ImportError::Conflict(format!(
                    "the archive is of another cluster: system identifier {}, the timeline's \
                     snapshots are of {}",
                    control.system_identifier, old.system_identifier
                )));
            }
        }
        let kind = if self.backup_label {
            SnapshotKind::Backup
        } else {
            if !control.is_shut_down() {
                return Err(ImportError::Invalid(format!(
                    "the cluster was not stopped cleanly (pg_control says \"{}\"): stop it with \
                     pg_ctl stop, or import a pg_basebackup of it",
                    control.state_name()
                )));
            }
            SnapshotKind::Stopped
        };
        let lsn = match (lsn, kind) {
            (Some(lsn), _) => lsn,
            (None, SnapshotKind::Stopped) => control.stopped_at(),
            (None, SnapshotKind::Backup) => {
                let recycled = self.report.wal_segments_recycled;
                let (_, name, bytes) = self.newest_wal.take().ok_or_else(|| {
                    let recycled = match recycled {
                        0 => String::new(),
                        n => format!(
                            "; {n} segments there are recycled ones, whose pages are of \
                             another segment"
                        ),
                    };
                    ImportError::Invalid(format!(
                        "the backup has no WAL segment of at most 64 MiB in pg_wal/ to find its \
                         end in (take it with pg_basebackup -X fetch, or give lsn=){recycled}"
                    ))
                })?;
                wal_end(&name, &bytes)?
            }
        };
        if lsn <= self.import.base_lsn() {
            return Err(ImportError::Conflict(format!(
                "the snapshot's LSN {lsn} is not above the timeline's last record LSN {}",
                self.import.base_lsn()
            )));
        }
        // Every segment before a fork's last one must be whole: a missing or short one would
        // leave blocks that the size covers but the archive never gave.
        for Fork { rel, size, blocks } in self.listing.forks() {
            if blocks != u64::from(size) {
                return Err(ImportError::Invalid(format!(
                    "relation {}/{}/{} fork {} has {blocks} blocks in its segment files, but its \
                     last segment ends at block {size}: a segment is missing or short",
                    rel.spcnode, rel.dbnode, rel.relnode, rel.forknum
                )));
            }
        }
        self.store_relations()?;
        self.store_file_directory()?;
        // The counters page ingest follows from here: exact only for a stopped primary taken
        // at its shutdown checkpoint (a backup's are of the checkpoint it started from).
        let exact = kind == SnapshotKind::Stopped
            && control.is_primary_shutdown()
            && lsn == control.checkpoint;
        let counters = self
            .counters
            .unwrap_or_else(|| control.checkpoint_copy.counters(exact));
        self.import.put(
            counters_key(),
            &Value::Image(Bytes::from(counters.encode())),
        )?;
        let mut snapshots = self.old_snapshots.take().unwrap_or(SnapshotList {
            system_identifier: control.system_identifier,
            snapshots: Vec::new(),
        });
        let wal_from = match self.wal_from {
            Some(from) if from > lsn || kind != SnapshotKind::Stopped => {
                return Err(ImportError::Invalid(format!(
                    "a replayed directory at {lsn} whose WAL would begin at {from}: it must be \
                     a stopped cluster's, with its WAL from at or below its LSN"
                )));
            }
            Some(from) => from,
            None => lsn,
        };
        snapshots.snapshots.push(Snapshot {
            lsn,
            kind,
            wal_from,
        });
        self.import.put(
            snapshot_list_key(),
            &Value::Image(Bytes::from(snapshots.encode())),
        )?;
        self.report.lsn = lsn.to_string();
        self.report.kind = kind.to_string();
        self.report.bytes_stored = self.import.bytes_written();
        let report = self.report;
        self.import.commit(lsn)?;
        Ok(report)
    }

    /// Sizes of new or resized forks, and the relation directory of every database whose set
    /// of forks changed (an emptied one for each database that is gone).
    fn store_relations(&mut self) -> Result<(), ImportError> {
        let mut by_db: BTreeMap<(u32, u32), Vec<(u32, u8)>> = BTreeMap::new();
        for Fork { rel, size, .. } in self.listing.forks() {
            by_db
                .entry((rel.spcnode, rel.dbnode))
                .or_default()
                .push((rel.relnode, rel.forknum));
            let old = self
                .old_rels
                .get(&(rel.spcnode, rel.dbnode))
                .and_then(|forks| forks.get(&(rel.relnode, rel.forknum)));
            match old {
                None => self.report.relations_new += 1,
                Some(old) if *old != size => self.report.relations_resized += 1,
                Some(_) => continue,
            }
            self.import.put(
                rel.size_key(),
                &Value::Image(Bytes::from(encode_rel_size(size))),
            )?;
        }
        self.report.relations = self.listing.forks().count() as u64;
        // Databases that have a directory now, or had one.
        let mut databases: BTreeSet<(u32, u32)> = self.old_rels.keys().copied().collect();
        databases.extend(self.listing.paths().filter_map(database_of_dir));
        for db in databases {
            let new = by_db.remove(&db).unwrap_or_default();
            let old: Vec<(u32, u8)> = self
                .old_rels
                .get(&db)
                .map(|forks| forks.keys().copied().collect())
                .unwrap_or_default();
            self.report.relations_dropped +=
                old.iter().filter(|r| new.binary_search(r).is_err()).count() as u64;
            let known = self.old_rels.contains_key(&db);
            if new != old || !known {
                self.import.put(
                    rel_dir_key(db.0, db.1),
                    &Value::Image(Bytes::from(encode_rel_dir(&new))),
                )?;
            }
        }
        Ok(())
    }

    fn store_file_directory(&mut self) -> Result<(), ImportError> {
        let entries = self.listing.take_entries();
        self.report.files = entries.iter().filter(|e| e.kind == EntryKind::File).count() as u64;
        self.report.directories = entries.len() as u64 - self.report.files;
        self.report.files_removed = self
            .old_files
            .entries
            .iter()
            .filter(|e| {
                e.kind == EntryKind::File
                    && entries
                        .binary_search_by(|n| n.path.as_str().cmp(&e.path))
                        .is_err()
            })
            .count() as u64;
        let dir = FileDirectory {
            next_id: self.next_id,
            entries,
        };
        if dir != self.old_files {
            let encoded = dir.encode();
            debug_assert_eq!(encoded.len(), self.listing.file_directory_len());
            self.import
                .put(file_dir_key(), &Value::Image(Bytes::from(encoded)))?;
        }
        Ok(())
    }
}
