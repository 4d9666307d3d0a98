//! The values of the PostgreSQL data directory key space (relation sizes, relation
//! directories, the file directory, the snapshot list) and a control file: never panic.

use pageserver::datadir::pg_control;
use pageserver_api::datadir::{decode_rel_dir, decode_rel_size, FileDirectory, SnapshotList};

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    let [which, bytes @ ..] = input else {
        return;
    };
    match which % 5 {
        0 => drop(decode_rel_size(bytes)),
        1 => drop(decode_rel_dir(bytes)),
        2 => drop(FileDirectory::decode(bytes)),
        3 => drop(SnapshotList::decode(bytes)),
        _ => drop(pg_control::parse(bytes)),
    }
}
