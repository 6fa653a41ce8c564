//! The deletion model's integration test, in the one test binary of the crate.

mod check;
