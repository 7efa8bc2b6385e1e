//! `ginza sim` subcommands (being written).
#[derive(clap::Args, Debug)]
pub struct SimArgs {}
pub fn run(_args: SimArgs) -> anyhow::Result<()> {
    anyhow::bail!("ginza sim is not built yet")
}
