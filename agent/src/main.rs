//! sandbox-agent
fn main() {}
