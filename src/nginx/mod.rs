//! nginx module glue (being written).
