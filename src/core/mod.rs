//! Pure limiter logic (being written).
