//! A streaming k-way merge of sorted version streams: every (key, LSN, value) of its inputs in
//! (key, LSN) order, holding one pending version per input and nothing else. Compaction reads
//! its input layers through it, so its memory is the inputs' own buffers (a
//! `delta_layer::DeltaStream` holds about 1 MiB) plus one value each, never the whole input.
//!
//! The inputs must each be sorted by (key, LSN) and must not share a (key, LSN) pair (layers
//! of one timeline never do: their LSN ranges are disjoint). A version out of order, or one
//! seen twice, is reported as an error rather than merged into a file that would break the
//! layer format's order; so is any input's error, after which the merge ends.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pageserver_api::{Key, Value};
use utils::Lsn;

/// Why a merge stopped early.
#[derive(Debug, thiserror::Error)]
pub enum MergeError<E> {
    #[error(transparent)]
    Input(E),
    #[error("input {input} is out of order: ({key}, {lsn}) after ({prev_key}, {prev_lsn})")]
    OutOfOrder {
        input: usize,
        key: Key,
        lsn: Lsn,
        prev_key: Key,
        prev_lsn: Lsn,
    },
}

/// See the module documentation.
pub struct MergeIter<I> {
    inputs: Vec<I>,
    /// The smallest pending (key, LSN) of each input that has one, and the input's index.
    heads: BinaryHeap<Reverse<(Key, Lsn, usize)>>,
    /// The pending value of each input, beside its entry in `heads`.
    pending: Vec<Option<Value>>,
    last: Option<(Key, Lsn)>,
    started: bool,
    failed: bool,
}

impl<I, E> MergeIter<I>
where
    I: Iterator<Item = Result<(Key, Lsn, Value), E>>,
{
    pub fn new(inputs: Vec<I>) -> MergeIter<I> {
        let n = inputs.len();
        MergeIter {
            inputs,
            heads: BinaryHeap::with_capacity(n),
            pending: (0..n).map(|_| None).collect(),
            last: None,
            started: false,
            failed: false,
        }
    }

    /// Takes the next version of input `i` into the heap.
    fn advance(&mut self, i: usize) -> Result<(), MergeError<E>> {
        match self.inputs[i].next() {
            None => Ok(()),
            Some(Err(e)) => Err(MergeError::Input(e)),
            Some(Ok((key, lsn, value))) => {
                self.heads.push(Reverse((key, lsn, i)));
                self.pending[i] = Some(value);
                Ok(())
            }
        }
    }

    fn next_version(&mut self) -> Result<Option<(Key, Lsn, Value)>, MergeError<E>> {
        if !self.started {
            self.started = true;
            for i in 0..self.inputs.len() {
                self.advance(i)?;
            }
        }
        let Some(Reverse((key, lsn, i))) = self.heads.pop() else {
            return Ok(None);
        };
        let value = self.pending[i].take().expect("a head has its value");
        if let Some((prev_key, prev_lsn)) = self.last {
            if (key, lsn) <= (prev_key, prev_lsn) {
                return Err(MergeError::OutOfOrder {
                    input: i,
                    key,
                    lsn,
                    prev_key,
                    prev_lsn,
                });
            }
        }
        self.last = Some((key, lsn));
        self.advance(i)?;
        Ok(Some((key, lsn, value)))
    }
}

impl<I, E> Iterator for MergeIter<I>
where
    I: Iterator<Item = Result<(Key, Lsn, Value), E>>,
{
    type Item = Result<(Key, Lsn, Value), MergeError<E>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.next_version().transpose();
        if matches!(next, Some(Err(_))) {
            self.failed = true;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    type Version = Result<(Key, Lsn, Value), String>;

    fn key(n: u32) -> Key {
        Key::rel_block(1663, 5, 16384, 0, n)
    }

    fn image(n: u64) -> Value {
        Value::Image(Bytes::from(n.to_be_bytes().to_vec()))
    }

    proptest! {
        /// Inputs with disjoint LSN sets merge into exactly the model's order.
        #[test]
        fn merges_in_key_then_lsn_order(
            versions in proptest::collection::btree_set((0u32..50, 0u64..400), 0..300),
            inputs in 1usize..6,
        ) {
            let mut split: Vec<Vec<Version>> = vec![Vec::new(); inputs];
            let mut model = BTreeMap::new();
            for (k, l) in versions {
                // Like layers: each input owns a band of LSNs.
                let input = (l as usize * inputs) / 400;
                split[input].push(Ok((key(k), Lsn(l), image(l))));
                model.insert((key(k), Lsn(l)), image(l));
            }
            let merged: Vec<_> = MergeIter::new(split.into_iter().map(|v| v.into_iter()).collect())
                .collect::<Result<_, _>>()
                .unwrap();
            let want: Vec<_> = model.into_iter().map(|((k, l), v)| (k, l, v)).collect();
            prop_assert_eq!(merged, want);
        }
    }

    #[test]
    fn a_duplicate_or_an_unsorted_input_is_an_error_not_a_bad_order() {
        let dup: Vec<std::vec::IntoIter<Version>> = vec![
            vec![Ok((key(1), Lsn(5), image(1)))].into_iter(),
            vec![Ok((key(1), Lsn(5), image(2)))].into_iter(),
        ];
        let out: Vec<_> = MergeIter::new(dup).collect();
        assert!(
            matches!(out.last(), Some(Err(MergeError::OutOfOrder { .. }))),
            "{out:?}"
        );
        let unsorted: Vec<std::vec::IntoIter<Version>> = vec![vec![
            Ok((key(2), Lsn(5), image(1))),
            Ok((key(1), Lsn(6), image(2))),
        ]
        .into_iter()];
        let out: Vec<_> = MergeIter::new(unsorted).collect();
        assert_eq!(out.len(), 2);
        assert!(matches!(out[1], Err(MergeError::OutOfOrder { .. })));
    }

    #[test]
    fn an_input_error_ends_the_merge() {
        let inputs: Vec<std::vec::IntoIter<Version>> = vec![
            vec![Ok((key(1), Lsn(5), image(1))), Err("torn".to_owned())].into_iter(),
            vec![Ok((key(2), Lsn(6), image(2)))].into_iter(),
        ];
        let out: Vec<_> = MergeIter::new(inputs).collect();
        assert!(
            matches!(out.last(), Some(Err(MergeError::Input(e))) if e == "torn"),
            "{out:?}"
        );
        assert!(out.len() <= 2);
    }
}
