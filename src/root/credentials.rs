//! Who may sync as which limiter: the shared sync token and per-limiter
//! tokens.
//!
//! A sync request names its limiter in its body, so with one token shared
//! by the fleet any holder can write as any limiter (and as many invented
//! ones as it likes). A root given a **limiter tokens file**
//! (`limiter_tokens_file`) knows a token per limiter:
//!
//! ```text
//! # limiter_id token
//! web-1.dc1  4f0c1e0b9d2a...
//! web-2.dc1  9b77aa3410fe...
//! ```
//!
//! One limiter a line, its id (as it sends it: `sluice_host_id`, or the
//! host name) and its token separated by blanks; `#` starts a comment
//! line. Every id and every token appears once. Then:
//!
//! - a limiter's own token syncs only as that limiter: a body naming
//!   another id is refused with 403 (named counters, keys and window
//!   deltas alike: the whole request);
//! - the shared `sync_token`, if the root still has one, syncs only as
//!   ids the file does not list, so a fleet can move host by host; a
//!   listed id sent with the shared token is refused with 403. Drop the
//!   shared token once every host has its own, and an unknown id cannot
//!   sync at all.
//!
//! Without the file the shared token admits any id, as before: fine for a
//! fleet that trusts every holder of the token, but one leaked token (or
//! one compromised host) can write as every limiter. The level cap and
//! the allowances ([`super::trust`]) bound what each id can add; only
//! per-limiter tokens stop one host from adding under many ids.
//!
//! The file is read when the root starts (a missing or malformed file
//! fails the start, naming `file:line`) and reread when it changes, every
//! reload tick; a reread that fails is logged with `file:line` and the
//! tokens in force are kept. A token is looked up by a keyed hash of it
//! and then compared in constant time, so a wrong guess tells nothing of
//! any token.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::wire::validate_limiter_id;

use super::auth::Token;

/// Tokens of the limiters listed in a limiter tokens file.
#[derive(Debug)]
pub struct LimiterTokens {
    /// Limiter id and token, in file order.
    entries: Vec<(Box<str>, Token)>,
    /// Keyed hash of a token to the entries holding it (one, unless two
    /// hashes collide).
    by_hash: HashMap<u64, Vec<u32>>,
    /// Listed limiter ids.
    by_id: HashMap<Box<str>, u32>,
    /// The hash's random key, new for every load.
    hasher: RandomState,
}

/// Why a limiter tokens file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("limiter tokens file {0}")]
pub struct TokensFileError(String);

impl LimiterTokens {
    /// Reads and checks a limiter tokens file.
    pub fn read(path: &Path) -> Result<Self, TokensFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TokensFileError(format!("{}: {e}", path.display())))?;
        Self::parse(&text).map_err(|(line, message)| {
            TokensFileError(format!("{}:{line}: {message}", path.display()))
        })
    }

    /// Parses the file's text; an error says its line (from 1).
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut tokens = Self {
            entries: Vec::new(),
            by_hash: HashMap::new(),
            by_id: HashMap::new(),
            hasher: RandomState::new(),
        };
        let mut lines_of: Vec<usize> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let number = n + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, token] = fields[..] else {
                return Err((
                    number,
                    format!(
                        "expected `limiter_id token`, found {} field(s)",
                        fields.len()
                    ),
                ));
            };
            validate_limiter_id(id)
                .map_err(|e| (number, format!("limiter id {id:?} {}", e.message)))?;
            let token = Token::new(token).map_err(|e| (number, e.to_string()))?;
            if let Some(&first) = tokens.by_id.get(id) {
                return Err((
                    number,
                    format!(
                        "limiter {id:?} is listed twice (first at line {})",
                        lines_of[first as usize]
                    ),
                ));
            }
            if let Some(other) = tokens.find(token.as_str().as_bytes()) {
                let other_line = lines_of[tokens.by_id[other] as usize];
                return Err((
                    number,
                    format!(
                        "limiter {id:?} has the same token as {other:?} (line {other_line}): \
                         every limiter needs its own"
                    ),
                ));
            }
            let index = tokens.entries.len() as u32;
            let hash = tokens.hasher.hash_one(token.as_str().as_bytes());
            tokens.by_hash.entry(hash).or_default().push(index);
            tokens.by_id.insert(id.into(), index);
            tokens.entries.push((id.into(), token));
            lines_of.push(number);
        }
        Ok(tokens)
    }

    /// An empty set (no file).
    pub fn empty() -> Self {
        Self {
            entries: Vec::new(),
            by_hash: HashMap::new(),
            by_id: HashMap::new(),
            hasher: RandomState::new(),
        }
    }

    /// The limiter whose token `presented` is.
    pub fn find(&self, presented: &[u8]) -> Option<&str> {
        let candidates = self.by_hash.get(&self.hasher.hash_one(presented))?;
        candidates
            .iter()
            .map(|&i| &self.entries[i as usize])
            .find(|(_, token)| token.matches(presented))
            .map(|(id, _)| &**id)
    }

    /// True when `id` has a token of its own.
    pub fn lists(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// Number of limiters listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when one of the tokens is `token`.
    pub fn holds(&self, token: &Token) -> bool {
        self.find(token.as_str().as_bytes()).is_some()
    }
}

/// Who sent a sync, by its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The root asks for no sync token: anyone, as any limiter.
    Anyone,
    /// The shared sync token: any limiter the tokens file does not list.
    Shared,
    /// A limiter's own token: that limiter only.
    Limiter(Arc<str>),
}

/// Why a sync may not write as the limiter it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forbidden {
    /// Another limiter's token.
    OtherLimiter {
        /// Whose token it was.
        token_of: Arc<str>,
    },
    /// The shared token, for a limiter with a token of its own.
    SharedForListed,
}

/// The root's sync credentials: the shared token, the limiter tokens and
/// their file.
#[derive(Debug)]
pub struct Credentials {
    shared: Option<Token>,
    file: Option<PathBuf>,
    tokens: RwLock<Arc<LimiterTokens>>,
    /// What the file looked like when last read.
    stamp: Mutex<Option<FileStamp>>,
    reloads_ok: std::sync::atomic::AtomicU64,
    reloads_failed: std::sync::atomic::AtomicU64,
}

/// Enough of a file's metadata to notice it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp_of(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

impl Credentials {
    /// The credentials of a root: `shared` and the tokens in `file`, read
    /// now (an error fails the start).
    pub fn load(shared: Option<Token>, file: Option<PathBuf>) -> Result<Self, TokensFileError> {
        let stamp = file.as_deref().and_then(stamp_of);
        let tokens = match &file {
            Some(path) => LimiterTokens::read(path)?,
            None => LimiterTokens::empty(),
        };
        if let (Some(shared), Some(path)) = (&shared, &file) {
            if tokens.holds(shared) {
                return Err(TokensFileError(format!(
                    "{}: a limiter's token is the shared sync token, which syncs as any \
                     unlisted limiter: give it a token of its own",
                    path.display()
                )));
            }
        }
        Ok(Self {
            shared,
            file,
            tokens: RwLock::new(Arc::new(tokens)),
            stamp: Mutex::new(stamp),
            reloads_ok: Default::default(),
            reloads_failed: Default::default(),
        })
    }

    /// Credentials that ask for no token.
    pub fn open() -> Self {
        Self {
            shared: None,
            file: None,
            tokens: RwLock::new(Arc::new(LimiterTokens::empty())),
            stamp: Mutex::new(None),
            reloads_ok: Default::default(),
            reloads_failed: Default::default(),
        }
    }

    /// True when syncs need a token.
    pub fn required(&self) -> bool {
        self.shared.is_some() || self.file.is_some()
    }

    fn current(&self) -> Arc<LimiterTokens> {
        Arc::clone(&self.tokens.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Who presents `authorization` (a header value), or `None` when its
    /// token is no sync token (401).
    pub fn identify(&self, authorization: Option<&[u8]>) -> Option<Caller> {
        if !self.required() {
            return Some(Caller::Anyone);
        }
        let presented = super::auth::bearer(authorization?)?;
        if self.shared.as_ref().is_some_and(|t| t.matches(presented)) {
            return Some(Caller::Shared);
        }
        let tokens = self.current();
        tokens.find(presented).map(|id| Caller::Limiter(id.into()))
    }

    /// Whether `caller` may sync as limiter `id`.
    pub fn permits(&self, caller: &Caller, id: &str) -> Result<(), Forbidden> {
        match caller {
            Caller::Anyone => Ok(()),
            Caller::Limiter(own) if **own == *id => Ok(()),
            Caller::Limiter(own) => Err(Forbidden::OtherLimiter {
                token_of: Arc::clone(own),
            }),
            Caller::Shared if self.current().lists(id) => Err(Forbidden::SharedForListed),
            Caller::Shared => Ok(()),
        }
    }

    /// Rereads the tokens file if it changed since it was last read;
    /// keeps the tokens in force when it cannot be read or is malformed
    /// (and says why, once per change).
    pub fn reload_if_changed(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(path) = &self.file else {
            return;
        };
        let now = stamp_of(path);
        {
            let mut stamp = self.stamp.lock().unwrap_or_else(|p| p.into_inner());
            if *stamp == now {
                return;
            }
            *stamp = now;
        }
        match LimiterTokens::read(path) {
            Ok(tokens) if self.shared.as_ref().is_some_and(|t| tokens.holds(t)) => {
                self.reloads_failed.fetch_add(1, Relaxed);
                tracing::error!(
                    file = %path.display(),
                    "limiter tokens not reloaded: a limiter's token is the shared sync token; \
                     keeping the tokens in force"
                );
            }
            Ok(tokens) => {
                self.reloads_ok.fetch_add(1, Relaxed);
                tracing::info!(limiters = tokens.len(), file = %path.display(), "limiter tokens reloaded");
                *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
            }
            Err(error) => {
                self.reloads_failed.fetch_add(1, Relaxed);
                tracing::error!("{error}; keeping the limiter tokens in force");
            }
        }
    }

    /// Limiters with a token of their own.
    pub fn limiters(&self) -> usize {
        self.current().len()
    }

    /// Rereads of the tokens file that took / that failed.
    pub fn reloads(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.reloads_ok.load(Relaxed),
            self.reloads_failed.load(Relaxed),
        )
    }
}

/// How often one subject (a limiter id) is logged about at most.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// Most subjects a [`LogGate`] remembers; past it, old ones are dropped
/// and new ones wait for room.
const LOG_SUBJECTS: usize = 10_000;

/// Lets a log line about one subject through at most once per
/// [`LOG_EVERY`], and says how many were held back meanwhile.
#[derive(Debug, Default)]
pub struct LogGate {
    /// Subject to when it was last logged and what was held back since.
    subjects: Mutex<HashMap<Box<str>, (Instant, u64)>>,
}

impl LogGate {
    /// `Some(held back)` when a line about `subject` may be logged now.
    pub fn pass(&self, subject: &str) -> Option<u64> {
        let now = Instant::now();
        let mut subjects = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((last, held)) = subjects.get_mut(subject) {
            if now.duration_since(*last) < LOG_EVERY {
                *held += 1;
                return None;
            }
            let skipped = *held;
            *last = now;
            *held = 0;
            return Some(skipped);
        }
        if subjects.len() >= LOG_SUBJECTS {
            subjects.retain(|_, (last, _)| now.duration_since(*last) < LOG_EVERY);
            if subjects.len() >= LOG_SUBJECTS {
                return None;
            }
        }
        subjects.insert(subject.into(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_file_maps_each_token_to_its_limiter() {
        let tokens = LimiterTokens::parse("# fleet\n\nweb-1 aaa\n  web-2\tbbb  \n").unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.find(b"aaa"), Some("web-1"));
        assert_eq!(tokens.find(b"bbb"), Some("web-2"));
        assert_eq!(tokens.find(b"aa"), None);
        assert!(tokens.lists("web-2") && !tokens.lists("web-3"));
    }

    #[test]
    fn a_malformed_tokens_file_names_the_line() {
        for (text, line, says) in [
            ("web-1 aaa\nweb-2\n", 2, "found 1 field"),
            ("web-1 aaa extra\n", 1, "found 3 field"),
            (
                "# c\nweb-1 aaa\nweb-1 bbb\n",
                3,
                "listed twice (first at line 2)",
            ),
            (
                "web-1 aaa\nweb-2 aaa\n",
                2,
                "same token as \"web-1\" (line 1)",
            ),
            (&format!("{} aaa\n", "x".repeat(300)), 1, "limiter id"),
            ("web-1 a\u{e9}\n", 1, "printable ASCII"),
        ] {
            let (at, message) = LimiterTokens::parse(text).unwrap_err();
            assert_eq!(at, line, "{text:?}: {message}");
            assert!(message.contains(says), "{text:?}: {message}");
        }
    }

    #[test]
    fn own_tokens_sync_as_their_limiter_and_the_shared_one_as_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiters");
        std::fs::write(&path, "web-1 aaa\n").unwrap();
        let shared = Token::new("shared").unwrap();
        let c = Credentials::load(Some(shared), Some(path.clone())).unwrap();
        let own = c.identify(Some(b"Bearer aaa")).unwrap();
        assert_eq!(own, Caller::Limiter("web-1".into()));
        assert!(c.permits(&own, "web-1").is_ok());
        assert!(matches!(
            c.permits(&own, "web-2"),
            Err(Forbidden::OtherLimiter { .. })
        ));
        let shared = c.identify(Some(b"Bearer shared")).unwrap();
        assert!(c.permits(&shared, "web-2").is_ok());
        assert_eq!(c.permits(&shared, "web-1"), Err(Forbidden::SharedForListed));
        assert_eq!(c.identify(Some(b"Bearer nope")), None);
        assert_eq!(c.identify(None), None);
        // A changed file takes over; a broken one keeps the old tokens.
        std::fs::write(&path, "web-1 ccc\nweb-2 ddd\n").unwrap();
        c.reload_if_changed();
        assert_eq!(c.identify(Some(b"Bearer aaa")), None);
        assert_eq!(c.limiters(), 2);
        std::fs::write(&path, "web-1 ccc\nweb-2\n").unwrap();
        c.reload_if_changed();
        assert_eq!(c.limiters(), 2);
        assert_eq!(c.reloads(), (1, 1));
        // The shared token may not be a limiter's.
        std::fs::write(&path, "web-1 shared\n").unwrap();
        let error = Credentials::load(Some(Token::new("shared").unwrap()), Some(path)).unwrap_err();
        assert!(error.to_string().contains("shared sync token"), "{error}");
    }

    #[test]
    fn a_log_gate_passes_once_per_interval_per_subject() {
        let gate = LogGate::default();
        assert_eq!(gate.pass("a"), Some(0));
        assert_eq!(gate.pass("a"), None);
        assert_eq!(gate.pass("a"), None);
        assert_eq!(gate.pass("b"), Some(0));
    }
}
