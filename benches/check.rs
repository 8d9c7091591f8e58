//! Check-path benchmarks (being written).
fn main() {}
