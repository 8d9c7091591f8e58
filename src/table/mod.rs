//! The quota table (being written).
