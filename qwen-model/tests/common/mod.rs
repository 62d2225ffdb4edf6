//! The model tests' own helper: the delegating CPU wrapper backend. Data paths, oracle readers
//! and logit comparisons come from the shared kit (`pn_tests`).
#![allow(dead_code)]

mod wrapped;
#[allow(unused_imports)] // not every test binary uses it
pub use wrapped::{Rot, Wrapped};
