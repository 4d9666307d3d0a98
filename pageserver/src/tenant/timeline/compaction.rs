//! L0 → L1 compaction: the oldest L0 delta layers merged into L1 delta layers, each a part of
//! the key space, so that a read visits one L1 per compacted LSN range instead of every L0.
//!
//! ```text
//!   L0 [a,b)  L0 [b,c)  L0 [c,d)         (each over the whole key space it was written with)
//!        \        |        /
//!         MergeIter of DeltaStreams      (one version pending per input, ~1 MiB buffer each)
//!                 |
//!   L1 [a,d) keys k0..k1 | L1 [a,d) keys k1..k2 | ...   (cut at compaction_target_size,
//!                                                        never inside one key's versions)
//! ```
//!
//! # Steps, and what a crash after each leaves
//!
//! 1. The outputs are written, each durable under its final name (`StagedFile`). An error
//!    from here to the commit removes them; a crash leaves unlisted files spanning listed L0s
//!    exactly, which the next load removes, and the timeline reads the L0s as before.
//! 2. One manifest lists the outputs as L1 and names the inputs as retired: the commit point
//!    (failpoint `compaction-before-manifest` just before it).
//! 3. The layer map swaps the inputs for the outputs (failpoint `compaction-after-manifest`
//!    just before it). A crash here: the next load opens the L1s and removes the retired L0s.
//! 4. The inputs are marked retired; each file is removed when the last reader of an older
//!    layer map snapshot lets go of it.
//!
//! Reads never wait for any of it: they go on against the snapshot they took.
//!
//! # Invariants
//!
//! - Only the oldest L0s are compacted, of at least two distinct LSN ranges and never part of
//!   an import's group (`layer_set/map.rs`), so the outputs' LSN range starts where the L1s end
//!   and is never any single L0's (an output never takes an input's name).
//! - An output holds every version of each of its keys in the inputs: a key's versions are
//!   never split between two outputs, so a read visits exactly one of them.
//! - Memory: the inputs' stream buffers, one pending version each, and the index of the output
//!   being written (at most about 34 bytes per version of one output).

use super::*;
use crate::tenant::storage_layer::delta_layer::DeltaLayerWriter;
use crate::tenant::storage_layer::merge_iter::{MergeError, MergeIter};

/// A key's delta chain since a base in the compacted range that reaches this length is ended
/// by a materialized image: the version at its newest delta is written as the page itself, so
/// no read replays more than this many deltas of one run.
pub const MATERIALIZE_AFTER_DELTAS: usize = 16;

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionOutcome {
    /// L0 layers merged (0: there was nothing to do).
    pub inputs: usize,
    /// L1 layers written.
    pub outputs: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Versions written as materialized images instead of their delta.
    pub materialized: u64,
    /// Nothing was compacted because the L1 layers above the images already stack to
    /// [`policy::l1_stack_limit`]: image creation must catch up first.
    pub waiting_for_images: bool,
}

impl Timeline {
    /// Merges the oldest L0 layers into L1 layers if there are at least `min_inputs` (and at
    /// least two) of them. One compaction runs at a time per timeline; flushes and reads go on.
    pub fn compact_l0(&self, min_inputs: usize) -> Result<CompactionOutcome, TimelineError> {
        let _compacting = self
            .compaction_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.is_stopped() {
            return Err(TimelineError::ShuttingDown);
        }
        self.check_layer_set_known()?;
        let input_layers = match policy::choose_compaction(
            &self.layer_map(),
            min_inputs,
            &self.conf,
        ) {
            CompactionChoice::Nothing => return Ok(CompactionOutcome::default()),
            CompactionChoice::WaitForImages { stack, limit } => {
                tracing::info!(
                    tenant = %self.tenant_id,
                    timeline = %self.timeline_id,
                    "compaction waits for image creation: {stack} L1 layers stack above the images (limit {limit})"
                );
                return Ok(CompactionOutcome {
                    waiting_for_images: true,
                    ..CompactionOutcome::default()
                });
            }
            CompactionChoice::Merge(inputs) => inputs,
        };
        if let Some(other) = input_layers.iter().find(|l| !l.is_delta_file()) {
            return Err(TimelineError::LayerSet {
                file: other.file_name().unwrap_or_default(),
                reason: "an L0 layer that is not a delta layer file".to_owned(),
            });
        }
        // An L0 an attach left on demand is downloaded to be merged.
        let inputs = input_layers
            .iter()
            .map(Layer::resident)
            .collect::<Result<Vec<Layer>, _>>()?;
        let started = Instant::now();
        let lsn_start = inputs[0].lsn_range().start;
        let lsn_end = inputs.last().expect("two or more").lsn_range().end;
        let (written, materialized) = self.write_l1(&inputs, lsn_start, lsn_end)?;
        let mut change = LayerChange::new(ChangeKind::Compaction);
        change.remove = input_layers.clone();
        change.add = written
            .iter()
            .map(|w| NewLayerFile::delta(w, LayerLevel::L1))
            .collect();
        self.commit(change)?;
        let outcome = CompactionOutcome {
            inputs: inputs.len(),
            outputs: written.len(),
            bytes_read: inputs.iter().map(|l| l.file_size()).sum(),
            bytes_written: written.iter().map(|w| w.size).sum(),
            materialized,
            waiting_for_images: false,
        };
        crate::metrics::COMPACTION_BYTES_READ.inc_by(outcome.bytes_read);
        crate::metrics::COMPACTION_BYTES_WRITTEN.inc_by(outcome.bytes_written);
        crate::metrics::COMPACTIONS.inc();
        tracing::info!(
            tenant = %self.tenant_id,
            timeline = %self.timeline_id,
            inputs = outcome.inputs,
            outputs = outcome.outputs,
            bytes_read = outcome.bytes_read,
            bytes_written = outcome.bytes_written,
            materialized = outcome.materialized,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compacted L0 layers {lsn_start}..{lsn_end} into L1 layers"
        );
        Ok(outcome)
    }

    /// Streams the inputs' versions in (key, LSN) order into L1 files of about
    /// `compaction_target_size` bytes each, cut only between keys, ending long delta chains
    /// with materialized images ([`MATERIALIZE_AFTER_DELTAS`]). Files written before an error
    /// are removed. Returns the files and how many versions were materialized.
    fn write_l1(
        &self,
        inputs: &[Layer],
        lsn_start: Lsn,
        lsn_end: Lsn,
    ) -> Result<(Vec<WrittenLayer>, u64), TimelineError> {
        let mut done: Vec<WrittenLayer> = Vec::new();
        let mut chain = Chain::default();
        let result = (|| {
            let streams = inputs
                .iter()
                .map(Layer::versions)
                .collect::<Result<Vec<_>, _>>()?;
            let merge = MergeIter::new(streams);
            let mut writer: Option<DeltaLayerWriter> = None;
            let mut last_key = None;
            for (n, version) in merge.enumerate() {
                if n % 4096 == 0 && self.is_shutting_down() {
                    return Err(TimelineError::ShuttingDown);
                }
                let (key, lsn, value) = version.map_err(|e| match e {
                    MergeError::Input(e) => TimelineError::from(e),
                    e @ MergeError::OutOfOrder { .. } => TimelineError::LayerSet {
                        file: "the L0 layers being compacted".to_owned(),
                        reason: e.to_string(),
                    },
                })?;
                if last_key != Some(key) {
                    if let Some(full) =
                        writer.take_if(|w| w.values_bytes() >= self.conf.compaction_target_size)
                    {
                        done.push(full.finish()?);
                    }
                }
                let w = match &mut writer {
                    Some(w) => w,
                    None => writer.insert(
                        DeltaLayerWriter::new(
                            &self.dir,
                            self.tenant_id,
                            self.timeline_id,
                            lsn_start,
                            lsn_end,
                        )?
                        .with_compression(self.conf.layer_compression)?,
                    ),
                };
                let value = chain.next(key, lsn, value, self.conf.max_value_size);
                w.put_value(key, lsn, &value)?;
                last_key = Some(key);
            }
            if let Some(w) = writer {
                done.push(w.finish()?);
            }
            Ok::<_, TimelineError>(())
        })();
        if let Err(e) = result {
            // Not listed anywhere yet: nothing else knows these files.
            for w in &done {
                let _ = std::fs::remove_file(&w.path);
            }
            return Err(e);
        }
        Ok((done, chain.materialized))
    }
}

/// One key's versions since its last base in the merge, oldest first: what ends a long delta
/// chain with the page it makes. Holds at most [`MATERIALIZE_AFTER_DELTAS`] deltas and a base.
#[derive(Default)]
struct Chain {
    key: Option<Key>,
    /// Empty while the key's base lies in an older layer (its chain cannot be redone here).
    since_base: Vec<(Lsn, Value)>,
    materialized: u64,
}

impl Chain {
    /// The value to write for this version: itself, or the page as of it when it is the
    /// delta that makes the chain too long.
    fn next(&mut self, key: Key, lsn: Lsn, value: Value, max_value_size: usize) -> Value {
        if self.key != Some(key) {
            self.key = Some(key);
            self.since_base.clear();
        }
        if value.will_init() {
            self.since_base.clear();
            self.since_base.push((lsn, value.clone()));
            return value;
        }
        if self.since_base.is_empty() {
            return value;
        }
        self.since_base.push((lsn, value.clone()));
        if self.since_base.len() <= MATERIALIZE_AFTER_DELTAS {
            return value;
        }
        match reconstruct_page(self.since_base.iter().rev(), max_value_size) {
            Ok(Some(page)) => {
                let image = Value::Image(page);
                self.since_base.clear();
                self.since_base.push((lsn, image.clone()));
                self.materialized += 1;
                image
            }
            // A chain that does not redo is written as it came: the reads that need it will
            // report the problem, as they would have.
            _ => {
                self.since_base.clear();
                value
            }
        }
    }
}

#[cfg(test)]
mod tests;
