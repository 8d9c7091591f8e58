//! Whether the database is still the one the root loaded, and whether it
//! takes writes.
//!
//! A root must never acknowledge a write that will not be there when it
//! (or another root) reads the database again. Two things can break that
//! without any error from the driver:
//!
//! - **An SQLite file deleted or replaced under the root.** Its open
//!   connections keep writing happily into the unlinked file, which
//!   vanishes with the process. So the root adopts the file it first
//!   loaded from (device and inode), never creates one once it has
//!   (the pool opens with `mode=rw`), and looks at the path every reload,
//!   before every write and after every commit: a missing or different
//!   file, or one of its own descriptors on a deleted copy of the
//!   database or its write-ahead log, means **lost**, and a write
//!   committed meanwhile is answered 503, not acknowledged.
//! - **A database whose epoch went back** (restored from an older copy, a
//!   new empty one at the same URL, a promoted replica that missed the
//!   last commits): writes would take epochs limiters have already passed,
//!   and never reach them. Every reload compares the database's epoch with
//!   the highest this root has seen, and every write transaction checks
//!   the epoch it takes: a database behind is **lost** too.
//!
//! A lost database is not read either: the root keeps serving the quotas
//! it holds, read-only, until the very same file is back at its path (or
//! the epoch has caught up). It never adopts another file while running:
//! an empty or older file must not become the fleet's truth (limiters
//! drop seed quotas a root does not know) unless an operator restarts the
//! root on it.
//!
//! A database that is merely **read-only** is still read: an SQLite file
//! (or its `-wal`/`-shm`) this process may not write, or a PostgreSQL that
//! refuses writes (`default_transaction_read_only`, a hot standby, a
//! revoked privilege), found by a statement that writes nothing
//! (`UPDATE ... WHERE false` is checked for read-only and privileges like
//! any write). Writes are refused until it takes them again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::StoreError;
use crate::root::health::lock;

/// What a look at the database found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbState {
    /// It takes writes.
    Writable,
    /// It can be read but takes no writes; the reason.
    ReadOnly(String),
    /// It is not the database this root loaded (or not any more); the
    /// reason. Neither read nor written.
    Lost(String),
}

impl DbState {
    /// The reason writes are refused, if they are.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Self::Writable => None,
            Self::ReadOnly(reason) | Self::Lost(reason) => Some(reason),
        }
    }

    /// As the error of a write it refuses (none when writable).
    pub(super) fn into_error(self) -> Result<(), StoreError> {
        match self {
            Self::Writable => Ok(()),
            Self::ReadOnly(reason) | Self::Lost(reason) => Err(StoreError::ReadOnly(reason)),
        }
    }
}

/// Identity of a file: device and inode.
type FileId = (u64, u64);

/// The file the root adopted.
#[derive(Clone, Debug)]
struct Adopted {
    id: FileId,
    /// Its absolute path, as `/proc/self/fd` names it.
    canonical: PathBuf,
}

/// An SQLite database file under watch.
#[derive(Debug)]
pub(super) struct SqliteFile {
    /// The path in the URL.
    path: PathBuf,
    /// Create the file when it is missing, until one is adopted (the URL
    /// chose no `mode` of its own).
    create: bool,
    /// The adopted file; `None` until the first load.
    adopted: Mutex<Option<Adopted>>,
    /// This process's descriptors on the database or its log (as
    /// `/proc/self/fd/N`), as the last scan of them all found them.
    descriptors: Mutex<Vec<PathBuf>>,
    /// A connection opened since that scan: scan them all again.
    rescan: AtomicBool,
}

impl SqliteFile {
    /// A watch on the file of an SQLite URL; `None` for an in-memory
    /// database. `creates` says whether the root creates a missing file
    /// itself (the URL chose no mode).
    pub(super) fn of_url(url: &str, creates: bool) -> Option<Self> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let memory = path.is_empty()
            || path == ":memory:"
            || query.split('&').any(|pair| pair == "mode=memory");
        if memory {
            return None;
        }
        // Decoded as the driver decodes it.
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().ok()?;
        let path = options.get_filename().to_path_buf();
        Some(Self {
            path,
            create: creates,
            adopted: Mutex::new(None),
            descriptors: Mutex::new(Vec::new()),
            rescan: AtomicBool::new(true),
        })
    }

    /// Before the first load: creates the file if the root may and it is
    /// missing (an empty file is an empty SQLite database), and adopts
    /// whatever file is at the path now.
    pub(super) fn prepare(&self) -> Result<(), StoreError> {
        if self.create {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&self.path)
            {
                Ok(_) => tracing::warn!(
                    path = %self.path.display(),
                    "created a new, empty quota database"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot create the database file {}: {e}",
                        self.path.display()
                    )))
                }
            }
        }
        let adopted = match (file_id(&self.path), std::fs::canonicalize(&self.path)) {
            (Ok(id), Ok(canonical)) => Some(Adopted { id, canonical }),
            // SQLite says why when it opens it.
            _ => None,
        };
        *lock(&self.adopted) = adopted;
        Ok(())
    }

    /// Called for every new connection: its descriptors are found by the
    /// next look.
    pub(super) fn connected(&self) {
        self.rescan.store(true, Ordering::Release);
    }

    /// [`Self::glance`], then this process's descriptors: none may be on
    /// a deleted copy of the database or its log. Done once a reload and
    /// after each commit, where a write is acknowledged. Only the
    /// descriptors found before are read again, unless a connection was
    /// opened since: reading every link in `/proc/self/fd` costs about 3
    /// µs each, which a root with thousands of connections would pay on
    /// every write (`BENCHMARKS.md`, "Admin writes and the database
    /// watch").
    pub(super) fn look(&self) -> DbState {
        let state = self.glance();
        if state != DbState::Writable {
            return state;
        }
        let Some(adopted) = lock(&self.adopted).clone() else {
            return state;
        };
        let mut known = lock(&self.descriptors);
        if self.rescan.swap(false, Ordering::AcqRel) {
            *known = descriptors_of(&adopted.canonical);
        }
        if let Some(open) = deleted_among(&known, &adopted.canonical) {
            return DbState::Lost(format!(
                "{open} was deleted while the root had it open: what was written to it since \
                 the last checkpoint is not in the database any more; restart the root"
            ));
        }
        state
    }

    /// The file at the path against the adopted one, and whether it may
    /// be written: two system calls a file.
    pub(super) fn glance(&self) -> DbState {
        let Some(adopted) = lock(&self.adopted).clone() else {
            return DbState::Writable;
        };
        let shown = self.path.display();
        match file_id(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return DbState::Lost(format!(
                    "the database file {shown} was deleted while the root had it open; put the \
                     same file back, or restart the root to open whatever is there then"
                ));
            }
            Err(e) => {
                return DbState::Lost(format!("cannot look at the database file {shown}: {e}"));
            }
            Ok(id) if id != adopted.id => {
                return DbState::Lost(format!(
                    "the database file {shown} was replaced by another file; put the file the \
                     root opened back, or restart the root to adopt the new one"
                ));
            }
            Ok(_) => {}
        }
        for suffix in ["", "-wal", "-shm"] {
            let mut name = self.path.clone().into_os_string();
            name.push(suffix);
            let file = PathBuf::from(name);
            if let Err(why) = writable(&file) {
                return DbState::ReadOnly(format!(
                    "the database file {} is read-only ({why})",
                    file.display()
                ));
            }
        }
        DbState::Writable
    }
}

fn file_id(path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// Whether this process may write `path` (a missing file passes: SQLite
/// creates its `-wal` and `-shm` as needed). `access(2)` rather than an
/// open: closing any descriptor of an SQLite file would drop the locks
/// the process holds on it through its connections.
fn writable(path: &Path) -> Result<(), std::io::Error> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Ok(());
    };
    // SAFETY: `name` is a NUL-terminated string that outlives the call;
    // access only reads it.
    if unsafe { libc::access(name.as_ptr(), libc::W_OK) } == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.kind() == std::io::ErrorKind::NotFound {
        return Ok(());
    }
    Err(error)
}

/// This process's descriptors (`/proc/self/fd/N`) on `database` or its
/// write-ahead log, deleted or not.
fn descriptors_of(database: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let names = link_names(database);
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|fd| {
            std::fs::read_link(fd)
                .is_ok_and(|target| names.iter().any(|n| target.as_os_str() == n.as_str()))
        })
        .collect()
}

/// The database or its log by the name it had, if one of `descriptors`
/// is on a deleted copy of it. A descriptor closed since, or reused for
/// another file, names something else and passes.
fn deleted_among(descriptors: &[PathBuf], database: &Path) -> Option<String> {
    let names = link_names(database);
    descriptors.iter().find_map(|fd| {
        let target = std::fs::read_link(fd).ok()?;
        let target = target.to_str()?;
        names
            .iter()
            .find(|n| n.as_str() == target && target.ends_with(DELETED))
            .map(|n| n.trim_end_matches(DELETED).to_string())
    })
}

/// What Linux appends to the link of a descriptor whose file was deleted.
const DELETED: &str = " (deleted)";

/// The links of descriptors on `database` or its log, live or deleted.
fn link_names(database: &Path) -> [String; 4] {
    let base = database.as_os_str().to_string_lossy();
    [
        base.to_string(),
        format!("{base}{DELETED}"),
        format!("{base}-wal"),
        format!("{base}-wal{DELETED}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sqlite_files_are_watched() {
        let file = SqliteFile::of_url("sqlite:///var/lib/sluice/q%20a.db?cache=shared", true);
        assert_eq!(
            file.map(|f| f.path),
            Some(PathBuf::from("/var/lib/sluice/q a.db"))
        );
        assert_eq!(
            SqliteFile::of_url("sqlite:q.db", true).map(|f| f.path),
            Some(PathBuf::from("q.db"))
        );
        for memory in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://x?mode=memory",
        ] {
            assert!(SqliteFile::of_url(memory, true).is_none(), "{memory}");
        }
        assert!(SqliteFile::of_url("postgres://h/db", true).is_none());
    }

    #[test]
    fn a_deleted_replaced_or_restored_file_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.db");
        let url = format!("sqlite://{}", path.display());
        let file = SqliteFile::of_url(&url, true).unwrap();
        file.prepare().unwrap();
        assert!(
            path.exists(),
            "a missing file is created before the first load"
        );
        assert_eq!(file.look(), DbState::Writable);
        let aside = dir.path().join("aside.db");
        std::fs::rename(&path, &aside).unwrap();
        assert!(matches!(file.look(), DbState::Lost(r) if r.contains("deleted")));
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(file.look(), DbState::Lost(r) if r.contains("replaced")));
        std::fs::rename(&aside, &path).unwrap();
        assert_eq!(file.look(), DbState::Writable, "the same file is back");
    }

    #[test]
    fn an_open_descriptor_on_a_deleted_log_is_seen() {
        if !Path::new("/proc/self/fd").exists() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap().join("q.db");
        let url = format!("sqlite://{}", path.display());
        let file = SqliteFile::of_url(&url, true).unwrap();
        file.prepare().unwrap();
        let _db = std::fs::File::open(&path).unwrap();
        let wal = dir.path().join("q.db-wal");
        let _log = std::fs::File::create(&wal).unwrap();
        assert_eq!(file.look(), DbState::Writable);
        assert_eq!(lock(&file.descriptors).len(), 2, "both found");
        std::fs::remove_file(&wal).unwrap();
        let expected = format!("{}-wal was deleted", path.display());
        assert!(matches!(file.look(), DbState::Lost(r) if r.starts_with(&expected)));
        // Found again without a new scan, and by one after a connection.
        assert!(matches!(file.look(), DbState::Lost(_)));
        file.connected();
        assert!(matches!(file.look(), DbState::Lost(_)));
        drop(_log);
        assert_eq!(
            file.look(),
            DbState::Writable,
            "closed: nothing lost any more"
        );
    }
}
