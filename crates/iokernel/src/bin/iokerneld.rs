//! `iokerneld`: see `iokerneld --help` and the crate README.

use std::process::ExitCode;

use clap::Parser;
use ginza_iokernel::{Cli, Config, Iokerneld, LinuxActuator};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let cfg = match Config::from_cli(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("iokerneld: {e}");
            return ExitCode::from(2);
        }
    };
    let actuator = match LinuxActuator::for_config(&cfg) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("iokerneld: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut d = match Iokerneld::bind(cfg, actuator) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("iokerneld: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = d.stop_on_signals() {
        eprintln!("iokerneld: cannot install the SIGINT/SIGTERM handler: {e}");
        return ExitCode::FAILURE;
    }
    match d.run() {
        Ok(report) => {
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iokerneld: {e}");
            ExitCode::FAILURE
        }
    }
}
