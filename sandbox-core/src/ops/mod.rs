//! One module per operation of SPEC.md section 2.

pub mod info;
