//! vm-runner
fn main() {}
