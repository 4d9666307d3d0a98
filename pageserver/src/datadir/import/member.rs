//! What an archive member's header may say: its type and its mode.
//!
//! **Types.** Only regular files (and contiguous files, which are regular files to every tar
//! reader) and directories are imported, as PostgreSQL's data directory holds nothing else of
//! its own: `pg_basebackup` skips anything else with a warning, and `tar -c` of a stopped
//! cluster finds nothing else. A symbolic or hard link is a tablespace (in `pg_tblspc/`) or a
//! directory kept elsewhere (`pg_wal` after `initdb -X`), neither of which is supported; a
//! device, a FIFO, a GNU sparse file or any other type is refused by its name.
//!
//! **Modes.** The permission bits (0777) are stored and given back as they came. The three bits
//! above them are not, because PostgreSQL never sets them on what it writes (files 0600 or 0640,
//! directories 0700 or 0750) and a basebackup restored as root would give them back on files
//! owned by root:
//!
//! - setuid or sticky on any member, setgid on a file: the import is refused, naming the member
//!   and the bit. Such a member was changed by hand or made to do harm; storing it quietly
//!   without the bit would hide that.
//! - setgid on a directory: dropped. Linux gives a new directory the setgid bit of the
//!   directory it is made in, so a cluster created under a setgid directory has it on every
//!   directory, and `pg_basebackup` sends it; it only makes new files take the directory's
//!   group, and PostgreSQL neither needs nor checks it.
//!
//! The data directory itself (`./`) is not stored, so its mode is not looked at.

use tar::EntryType;

/// What an imported member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    File,
    Directory,
}

const SETUID: u32 = 0o4000;
const SETGID: u32 = 0o2000;
const STICKY: u32 = 0o1000;

/// Why a member's header cannot be imported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error(
        "archive member {0:?} is a link: tablespaces outside the data directory are not supported"
    )]
    Tablespace(String),
    #[error(
        "archive member {path:?} is a {kind}: links are not supported (a pg_wal elsewhere, \
         initdb -X, is not importable)"
    )]
    Link { path: String, kind: &'static str },
    #[error(
        "archive member {path:?} is a {kind}: only regular files and directories are imported"
    )]
    NotFileOrDirectory { path: String, kind: String },
    #[error(
        "archive member {path:?} has the {bit} bit (mode 0{mode:04o}): PostgreSQL sets none of \
         setuid, setgid and sticky on what it writes, so an import refuses them (a basebackup \
         restored as root would give them back)"
    )]
    SpecialBit {
        path: String,
        mode: u32,
        bit: &'static str,
    },
}

/// What the member at `path` (normalized) of type `entry_type` is, if it can be imported.
pub fn member_kind(path: &str, entry_type: EntryType) -> Result<MemberKind, MemberError> {
    let kind = match entry_type {
        EntryType::Regular | EntryType::Continuous => return Ok(MemberKind::File),
        EntryType::Directory => return Ok(MemberKind::Directory),
        EntryType::Symlink | EntryType::Link if path.starts_with("pg_tblspc/") => {
            return Err(MemberError::Tablespace(path.to_string()))
        }
        EntryType::Symlink => {
            return Err(MemberError::Link {
                path: path.to_string(),
                kind: "symbolic link",
            })
        }
        EntryType::Link => {
            return Err(MemberError::Link {
                path: path.to_string(),
                kind: "hard link",
            })
        }
        EntryType::Char => "character device".to_string(),
        EntryType::Block => "block device".to_string(),
        EntryType::Fifo => "FIFO".to_string(),
        EntryType::GNUSparse => "GNU sparse file".to_string(),
        other => format!("member of tar type {:?}", char::from(other.as_byte())),
    };
    Err(MemberError::NotFileOrDirectory {
        path: path.to_string(),
        kind,
    })
}

/// The mode a member of `kind` whose header says `mode` is stored with (see the module
/// documentation), if it can be imported.
pub fn stored_mode(path: &str, kind: MemberKind, mode: u32) -> Result<u32, MemberError> {
    let mode = mode & 0o7777;
    let refused = match kind {
        MemberKind::File => SETUID | SETGID | STICKY,
        MemberKind::Directory => SETUID | STICKY,
    };
    let bit = [(SETUID, "setuid"), (SETGID, "setgid"), (STICKY, "sticky")]
        .into_iter()
        .find(|(bit, _)| mode & refused & bit != 0);
    if let Some((_, bit)) = bit {
        return Err(MemberError::SpecialBit {
            path: path.to_string(),
            mode,
            bit,
        });
    }
    Ok(mode & 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_bits_are_kept_and_special_bits_refused_or_dropped() {
        use MemberKind::{Directory, File};
        assert_eq!(stored_mode("a", File, 0o100640), Ok(0o640));
        assert_eq!(stored_mode("a", Directory, 0o750), Ok(0o750));
        // Inherited from the directory the cluster was created in: dropped.
        assert_eq!(stored_mode("a", Directory, 0o2700), Ok(0o700));
        for (kind, mode, bit) in [
            (File, 0o4755, "setuid"),
            (File, 0o2755, "setgid"),
            (File, 0o1600, "sticky"),
            (File, 0o7777, "setuid"),
            (Directory, 0o4700, "setuid"),
            (Directory, 0o1777, "sticky"),
            (Directory, 0o3700, "sticky"),
        ] {
            let error = stored_mode("m", kind, mode).unwrap_err();
            assert_eq!(
                error,
                MemberError::SpecialBit {
                    path: "m".to_string(),
                    mode,
                    bit
                }
            );
            let text = error.to_string();
            assert!(
                text.contains(&format!("{bit} bit (mode 0{mode:04o})")),
                "{text}"
            );
        }
    }

    #[test]
    fn only_files_and_directories_are_members() {
        assert_eq!(member_kind("a", EntryType::Regular), Ok(MemberKind::File));
        assert_eq!(
            member_kind("a", EntryType::Continuous),
            Ok(MemberKind::File)
        );
        assert_eq!(
            member_kind("a", EntryType::Directory),
            Ok(MemberKind::Directory)
        );
        for (entry_type, expect) in [
            (EntryType::Symlink, "is a link: tablespaces"),
            (EntryType::Link, "is a link: tablespaces"),
        ] {
            let text = member_kind("pg_tblspc/16400", entry_type)
                .unwrap_err()
                .to_string();
            assert!(text.contains(expect), "{text}");
        }
        for (entry_type, expect) in [
            (EntryType::Symlink, "is a symbolic link: links"),
            (EntryType::Link, "is a hard link: links"),
            (EntryType::Char, "is a character device: only regular"),
            (EntryType::Block, "is a block device"),
            (EntryType::Fifo, "is a FIFO"),
            (EntryType::GNUSparse, "is a GNU sparse file"),
            (EntryType::new(b'V'), "is a member of tar type 'V'"),
        ] {
            let text = member_kind("pg_wal", entry_type).unwrap_err().to_string();
            assert!(text.contains(expect), "{text}");
        }
    }
}
