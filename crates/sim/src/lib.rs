//! Discrete-event simulator over `ginza-policy`.
pub mod cli;
