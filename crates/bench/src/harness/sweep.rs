//! The one sweep loop every load sweep goes through (`bench run`, `ginza
//! demo`): points in the order given (the caller interleaves systems within
//! a round), a progress bar with an ETA, the first failure named by its
//! point.

use indicatif::{ProgressBar, ProgressStyle};

/// Runs `run` on each point in order; stops at the first error, with the
/// point's label as its context.
pub(crate) fn sweep<P, R>(
    points: &[P],
    label: impl Fn(&P) -> String,
    run: impl FnMut(usize, &P) -> anyhow::Result<R>,
) -> anyhow::Result<Vec<R>> {
    sweep_weighted(points, label, |_| 1, run)
}

/// [`sweep`] with each point's expected cost (any unit, e.g. ms): the bar
/// advances by it, so that its ETA holds when points differ in length
/// (systems of different start-up costs in one experiment).
pub(crate) fn sweep_weighted<P, R>(
    points: &[P],
    label: impl Fn(&P) -> String,
    weight: impl Fn(&P) -> u64,
    mut run: impl FnMut(usize, &P) -> anyhow::Result<R>,
) -> anyhow::Result<Vec<R>> {
    let weights: Vec<u64> = points.iter().map(|p| weight(p).max(1)).collect();
    let pb = ProgressBar::new(weights.iter().sum());
    pb.set_style(
        ProgressStyle::with_template("{msg:>40} [{bar:30}] {percent:>3}% {elapsed}<{eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut out = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        let name = label(p);
        pb.set_message(format!("{name} ({}/{})", i + 1, points.len()));
        match run(i, p) {
            Ok(r) => out.push(r),
            Err(e) => {
                pb.abandon();
                return Err(e.context(name));
            }
        }
        pb.inc(weights[i]);
    }
    pb.finish_and_clear();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_in_order_and_names_the_failing_point() {
        let got = sweep(&[1, 2, 3], |p| format!("p{p}"), |i, p| Ok((i, *p * 10))).unwrap();
        assert_eq!(got, vec![(0, 10), (1, 20), (2, 30)]);
        let mut seen = Vec::new();
        let e = sweep(
            &[1, 2, 3],
            |p| format!("point {p}"),
            |_, p| {
                seen.push(*p);
                if *p == 2 {
                    anyhow::bail!("broke")
                }
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(seen, vec![1, 2], "stops at the first failure");
        assert_eq!(format!("{e:#}"), "point 2: broke");
    }
}
