//! The C ABI (being written).
