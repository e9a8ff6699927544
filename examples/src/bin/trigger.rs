//! examples
fn main() {}
