//! `ginza bench <experiment>` (being written).
#[derive(clap::Args, Debug)]
pub struct BenchArgs {}
pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("ginza bench is not built yet")
}
