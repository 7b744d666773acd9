//! Pictures of a run's curves as SVG (plotters, no font or bitmap dependencies): reward and
//! mismatch KL per step for RL runs, train and validation loss for SFT (and with data groups each
//! group's share and held-out loss). Written atomically.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use rl_run::RunDir;
use rl_run::{MetricsRow, SftRow, TrainerRow, read_jsonl, write_atomic};

/// One named line.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

/// One chart: a title, a y-axis label and its lines (x is the step).
#[derive(Debug, Clone)]
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) y_label: String,
    pub(crate) series: Vec<Series>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// `(step, value)` points, finite values only.
pub(crate) fn points(rows: impl IntoIterator<Item = (u64, f64)>, map: fn(f64) -> f64) -> Vec<(f64, f64)> {
    rows.into_iter().map(|(s, v)| (s as f64, map(v))).filter(|(_, y)| y.is_finite()).collect()
}

fn bounds(panel: &Panel) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let pts = || panel.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        return (0.0..1.0, 0.0..1.0);
    }
    if x1 - x0 < 1.0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-3);
    (x0..x1, (y0 - pad)..(y1 + pad))
}

/// Renders `panels` stacked vertically into an SVG document.
pub(crate) fn render(title: &str, panels: &[Panel]) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let height = 40 + 320 * panels.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(|e| anyhow::anyhow!("{e}"))?;
        for (area, panel) in root.split_evenly((panels.len().max(1), 1)).iter().zip(panels) {
            let (xr, yr) = bounds(panel);
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(70)
                .build_cartesian_2d(xr, yr)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            chart
                .configure_mesh()
                .x_desc("step")
                .y_desc(panel.y_label.as_str())
                .draw()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            for (i, s) in panel.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(svg)
}

/// Renders and writes `path` atomically.
pub(crate) fn write(path: &Path, title: &str, panels: &[Panel]) -> anyhow::Result<PathBuf> {
    let svg = render(title, panels)?;
    write_atomic(path, svg.as_bytes())?;
    Ok(path.to_owned())
}

/// `<run>/curves.svg` of an RL run: reward (train mean, best of group and greedy, eval means), log10
/// mismatch KL and the policy's entropy.
pub(crate) fn rl_curves(run: &RunDir) -> anyhow::Result<PathBuf> {
    let orch: Vec<MetricsRow> = read_jsonl(&run.metrics())?;
    let trainer: Vec<TrainerRow> = read_jsonl(&run.trainer_metrics())?;
    let train = orch.iter().filter_map(|r| Some((r.step, r.rollouts.as_ref()?.reward_mean)));
    // The best of each group next to the mean: the gap is what the groups can still teach.
    let best = orch.iter().filter_map(|r| Some((r.step, r.rollouts.as_ref()?.reward_group_best?)));
    let mut reward = vec![
        Series { name: String::from("train reward (mean)"), points: points(train, |v| v) },
        Series { name: String::from("train reward (best of group)"), points: points(best, |v| v) },
    ];
    // With a greedy baseline: how the policy's mode does on the training tasks, per env.
    let mut greedy_keys: Vec<&String> =
        orch.iter().flat_map(|r| r.keyed.keys().filter(|k| k.ends_with("/reward_greedy"))).collect();
    greedy_keys.sort();
    greedy_keys.dedup();
    for k in greedy_keys {
        let greedy = orch.iter().filter_map(|r| Some((r.step, r.keyed.get(k)?.as_f64()?)));
        let env = k.trim_start_matches("env/").trim_end_matches("/reward_greedy");
        reward.push(Series { name: format!("train reward (greedy, {env})"), points: points(greedy, |v| v) });
    }
    let mut eval_keys: Vec<&String> = orch
        .iter()
        .flat_map(|r| r.keyed.keys().filter(|k| k.starts_with("eval/") && k.ends_with("/reward/mean")))
        .collect();
    eval_keys.sort();
    eval_keys.dedup();
    for k in eval_keys {
        let eval = orch.iter().filter_map(|r| Some((r.step, r.keyed.get(k)?.as_f64()?)));
        reward.push(Series { name: k.trim_end_matches("/reward/mean").to_owned(), points: points(eval, |v| v) });
    }
    let kl = Series {
        name: String::from("log10 mismatch KL"),
        points: points(trainer.iter().map(|r| (r.step, r.mismatch_kl)), |v| v.max(1e-16).log10()),
    };
    let entropy = Series {
        name: String::from("entropy (nats/token)"),
        points: points(trainer.iter().map(|r| (r.step, r.entropy)), |v| v),
    };
    let mut panels = vec![Panel { title: String::from("reward"), y_label: String::from("reward"), series: reward }];
    // Multi-agent runs: each member's reward next to its RAE baseline, and the env's accuracy
    // metrics (per member) and decided episodes, in training and in evals.
    let members = keyed_series(&orch, |k| {
        k.starts_with("reward/member/") || (k.starts_with("algorithm/") && k.contains("/baseline/"))
    });
    if !members.is_empty() {
        panels.push(Panel { title: String::from("per member"), y_label: String::from("reward"), series: members });
        let accuracy = keyed_series(&orch, |k| k.contains("/metric/accuracy/") || k.ends_with("/metric/decided"));
        if !accuracy.is_empty() {
            panels.push(Panel { title: String::from("accuracy"), y_label: String::from("fraction"), series: accuracy });
        }
    }
    panels.extend([
        Panel {
            title: String::from("trainer vs inference mismatch KL"),
            y_label: String::from("log10 KL"),
            series: vec![kl],
        },
        Panel {
            title: String::from("policy entropy of the trained tokens"),
            y_label: String::from("nats/token"),
            series: vec![entropy],
        },
    ]);
    write(&run.curves(), &format!("{}: RL", run_name(run)), &panels)
}

/// A series per keyed metric whose name matches, named by its key.
fn keyed_series(rows: &[MetricsRow], wanted: impl Fn(&str) -> bool) -> Vec<Series> {
    let mut keys: Vec<&String> = rows.iter().flat_map(|r| r.keyed.keys().filter(|k| wanted(k))).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|k| Series {
            name: k.clone(),
            points: points(rows.iter().filter_map(|r| Some((r.step, r.keyed.get(k)?.as_f64()?))), |v| v),
        })
        .collect()
}

/// `<run>/curves.svg` of an SFT run: train and validation loss.
pub(crate) fn sft_curves(run: &RunDir) -> anyhow::Result<PathBuf> {
    let rows: Vec<SftRow> = read_jsonl(&run.metrics())?;
    write(&run.curves(), &format!("{}: SFT", run_name(run)), &sft_panels(&rows))
}

/// The SFT run's loss panel, and with groups of data (`data.groups`) a panel of each group's
/// share of the examples and held-out loss.
fn sft_panels(rows: &[SftRow]) -> Vec<Panel> {
    let mut panels = vec![Panel {
        title: String::from("loss"),
        y_label: String::from("cross-entropy (nats/token)"),
        series: vec![
            Series { name: String::from("train loss"), points: points(rows.iter().map(|r| (r.step, r.loss)), |v| v) },
            Series {
                name: String::from("validation loss"),
                points: points(rows.iter().filter_map(|r| Some((r.step, r.val_loss?))), |v| v),
            },
        ],
    }];
    let groups: std::collections::BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.groups.keys())
        .filter_map(|k| k.strip_prefix("group/")?.strip_suffix("/share"))
        .collect();
    if !groups.is_empty() {
        let series = |g: &str, key: String, label: &str| Series {
            name: format!("{g} {label}"),
            points: points(rows.iter().filter_map(|r| Some((r.step, *r.groups.get(&key)?))), |v| v),
        };
        panels.push(Panel {
            title: String::from("data groups"),
            y_label: String::from("share of examples; held-out loss; greedy exact"),
            series: groups
                .iter()
                .flat_map(|g| {
                    [
                        series(g, rl_run::group_share_key(g), "share"),
                        series(g, rl_run::group_val_loss_key(g), "loss"),
                        series(g, rl_run::group_exact_key(g), "exact"),
                    ]
                })
                .filter(|s| !s.points.is_empty())
                .collect(),
        });
    }
    panels
}

fn run_name(run: &RunDir) -> &str {
    run.root().file_name().and_then(|n| n.to_str()).unwrap_or("run")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_as_a_path_with_its_legend() {
        let rows: Vec<(u64, f64)> = (1..=5).map(|s| (s, 0.1 * s as f64)).chain([(6, f64::NAN)]).collect();
        let reward = points(rows.iter().copied(), |v| v);
        assert_eq!(reward.len(), 5, "non-finite values are skipped");
        let kl = points([(1, 1e-12)], |v| v.max(1e-16).log10());
        assert!((kl[0].1 + 12.0).abs() < 1e-9);
        let panels = [
            Panel {
                title: String::from("reward"),
                y_label: String::from("r"),
                series: vec![Series { name: String::from("train"), points: reward }],
            },
            Panel {
                title: String::from("kl"),
                y_label: String::from("k"),
                series: vec![Series { name: String::from("kl"), points: kl }],
            },
        ];
        let svg = render("t", &panels).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        let lines: Vec<&str> = svg
            .lines()
            .filter(|l| l.contains("<polyline") && l.contains("stroke=\"#1F77B4\" stroke-width=\"2\""))
            .collect();
        assert_eq!(lines.len(), 2 + 2, "one line per series plus one legend mark each: {lines:?}");
        assert!(lines.iter().any(|l| l.matches(',').count() == 5), "the reward line has its 5 points: {lines:?}");
        assert!(svg.contains(">\ntrain\n</text>") && svg.contains(">\nkl\n</text>"), "legend labels: {svg}");
    }

    #[test]
    fn sft_runs_with_data_groups_draw_their_shares_and_losses() {
        let row = |step: u64, groups: &[(&str, f64)]| SftRow {
            step,
            loss: 1.0,
            groups: groups.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            ..SftRow::default()
        };
        assert_eq!(sft_panels(&[row(1, &[])]).len(), 1, "no groups, no group panel");
        let rows = [
            row(
                1,
                &[
                    ("group/a/share", 0.6),
                    ("group/a/val_loss", 1.2),
                    ("group/a/exact", 0.25),
                    ("group/b/share", 0.4),
                    ("group/b/val_loss", 0.9),
                ],
            ),
            row(2, &[("group/a/share", 0.6), ("group/b/share", 0.4)]),
        ];
        let panels = sft_panels(&rows);
        assert_eq!(panels.len(), 2);
        let named: Vec<(&str, usize)> = panels[1].series.iter().map(|s| (s.name.as_str(), s.points.len())).collect();
        // A measure no row has (b's exact rate) draws no empty line.
        assert_eq!(named, [("a share", 2), ("a loss", 1), ("a exact", 1), ("b share", 2), ("b loss", 1)]);
    }

    #[test]
    fn empty_and_flat_series_still_render() {
        let flat = Series { name: String::from("flat"), points: vec![(1.0, 0.5)] };
        let panels = [
            Panel { title: String::from("empty"), y_label: String::from("y"), series: vec![] },
            Panel { title: String::from("flat"), y_label: String::from("y"), series: vec![flat] },
        ];
        assert!(render("t", &panels).is_ok());
    }
}
