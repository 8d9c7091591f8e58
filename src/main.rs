//! The `sluice` binary (being written).
fn main() {
    eprintln!("sluice: the root server is not built yet");
    std::process::exit(2);
}
