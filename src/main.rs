//! arc-rec binary.
fn main() {}
