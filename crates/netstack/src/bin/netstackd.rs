//! `netstackd`: the protected-mode netstack (docs/protected.md); the same
//! as `ginza netstack`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "netstackd",
    version,
    about = "Ginza's protected-mode netstack (DLibOS) under iokerneld"
)]
struct Cli {
    #[command(flatten)]
    args: ginza_netstack::cli::NetstackArgs,
}

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    ginza_netstack::cli::run(Cli::parse().args)
}
