//! Clock (being written).
