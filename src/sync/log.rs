//! What the sync thread says: the severity of a log line, and the line a
//! part of the engine hands back for its caller (the sync thread, the
//! simulator) to write where its configuration says.

/// Severity of a sync log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Routine state changes (a root came back).
    Info,
    /// Degraded service (a root or all roots down).
    Warn,
    /// Something is wrong with sluice itself or its config.
    Error,
}

/// A log line the engine wants written.
pub type LogLine = (LogLevel, String);
