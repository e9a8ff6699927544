//! sandbox-libkrun
fn main() {}
