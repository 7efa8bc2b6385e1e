//! `iokerneld`: see `iokerneld --help` and the crate README. The same
//! daemon runs as `ginza iokernel`; the body is [`ginza_iokernel::cli`].

use std::process::ExitCode;

use clap::Parser;
use ginza_iokernel::Cli;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    ginza_iokernel::cli::main_with(&Cli::parse())
}
