//! Paths in a data directory archive: which are relation segments, which are plain files, and
//! which cannot be imported at all.

use pageserver_api::datadir::{
    fork_number, RelTag, DEFAULTTABLESPACE_OID, GLOBALTABLESPACE_OID, MAX_PATH_LEN,
};

/// What an archive member is, by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatadirPath {
    /// The data directory itself (`./`): nothing to store, its mode is PostgreSQL's to check.
    Root,
    /// Segment `segno` of a relation fork: stored block by block.
    Relation { rel: RelTag, segno: u32 },
    /// Anything else: stored byte for byte under its path.
    Other(String),
}

/// Why a path cannot be imported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("archive member {0:?}: its path is not UTF-8")]
    NotUtf8(String),
    #[error("archive member {0:?}: an absolute path, or one with `..` or empty components")]
    Escapes(String),
    #[error("archive member {0:?}: a path longer than {MAX_PATH_LEN} bytes")]
    TooLong(String),
    #[error(
        "archive member {0:?}: tablespaces outside the data directory are not supported (only \
         pg_default and pg_global)"
    )]
    Tablespace(String),
}

/// The member's path relative to the data directory: `./` prefixes and a trailing `/` removed,
/// checked to stay inside it.
pub fn normalize(raw: &[u8]) -> Result<String, PathError> {
    let text = std::str::from_utf8(raw)
        .map_err(|_| PathError::NotUtf8(String::from_utf8_lossy(raw).into_owned()))?;
    let mut rest = text;
    while let Some(stripped) = rest.strip_prefix("./") {
        rest = stripped;
    }
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest == "." {
        return Ok(String::new());
    }
    if rest.starts_with('/')
        || rest
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(PathError::Escapes(text.to_string()));
    }
    if rest.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong(text.to_string()));
    }
    Ok(rest.to_string())
}

/// What a normalized path names; `is_file` tells a regular file from a directory.
pub fn classify(path: &str, is_file: bool) -> Result<DatadirPath, PathError> {
    if path.is_empty() {
        return Ok(DatadirPath::Root);
    }
    let parts: Vec<&str> = path.split('/').collect();
    // pg_tblspc holds one symlink per tablespace; anything in it is a tablespace.
    if parts[0] == "pg_tblspc" && parts.len() > 1 {
        return Err(PathError::Tablespace(path.to_string()));
    }
    if is_file {
        let rel = match parts.as_slice() {
            ["global", name] => relation_file(GLOBALTABLESPACE_OID, 0, name),
            ["base", db, name] => {
                canonical_number(db).and_then(|db| relation_file(DEFAULTTABLESPACE_OID, db, name))
            }
            _ => None,
        };
        if let Some((rel, segno)) = rel {
            return Ok(DatadirPath::Relation { rel, segno });
        }
    }
    Ok(DatadirPath::Other(path.to_string()))
}

/// The path of a database's directory: `global` or `base/<dbnode>`.
pub fn database_dir(spcnode: u32, dbnode: u32) -> String {
    if spcnode == GLOBALTABLESPACE_OID {
        "global".to_string()
    } else {
        format!("base/{dbnode}")
    }
}

/// The database a directory path is, if it is one.
pub fn database_of_dir(path: &str) -> Option<(u32, u32)> {
    match path.split('/').collect::<Vec<_>>().as_slice() {
        ["global"] => Some((GLOBALTABLESPACE_OID, 0)),
        ["base", db] => canonical_number(db).map(|db| (DEFAULTTABLESPACE_OID, db)),
        _ => None,
    }
}

/// `<relnode>[_fsm|_vm|_init][.<segno>]`, in the exact form PostgreSQL writes it (no leading
/// zeros, relnode not 0, segno not 0): any other name is kept as a plain file, so that its name
/// comes back unchanged.
fn relation_file(spcnode: u32, dbnode: u32, name: &str) -> Option<(RelTag, u32)> {
    let (stem, segno) = match name.split_once('.') {
        Some((stem, seg)) => (stem, canonical_number(seg).filter(|s| *s != 0)?),
        None => (name, 0),
    };
    let digits = stem
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(stem.len());
    let relnode = canonical_number(&stem[..digits]).filter(|r| *r != 0)?;
    let forknum = fork_number(&stem[digits..])?;
    // Blocks of segment `segno` are numbered from segno × RELSEG_BLOCKS: it must fit a u32.
    let first_block = u64::from(segno) * u64::from(pageserver_api::datadir::RELSEG_BLOCKS);
    if first_block > u64::from(u32::MAX) {
        return None;
    }
    Some((
        RelTag {
            spcnode,
            dbnode,
            relnode,
            forknum,
        },
        segno,
    ))
}

/// A decimal u32 with no sign and no leading zero (but "0" itself).
fn canonical_number(text: &str) -> Option<u32> {
    if text.is_empty()
        || !text.bytes().all(|b| b.is_ascii_digit())
        || (text.len() > 1 && text.starts_with('0'))
    {
        return None;
    }
    text.parse().ok()
}

/// A path as an error message shows it: whole up to 200 bytes, else its start and its length
/// (a 4,000-byte name repeated in a message helps no one).
pub fn abbreviated(path: &str) -> String {
    const SHOWN: usize = 200;
    if path.len() <= SHOWN {
        return path.to_string();
    }
    let mut end = SHOWN;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &path[..end], path.len())
}
