//! The figures, drawn with `plotters` as PNG (bitmap backend) and SVG: Table 1 as a bar chart
//! (log cycles), Fig. 4 as stacked histograms (share of instructions by length, one bar per set),
//! Fig. 5 as cost-vs-distance curves with the coverage below, and issue 13's goals beside the
//! peers as bars of each goal's margin (log; right of 1 is met).
//!
//! Text needs a TrueType font: the first of [`FONT_PATHS`] that exists (Debian's
//! `fonts-dejavu-core`) is registered with plotters once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};
use thiserror::Error;

use crate::cost::CostTable;
use crate::coverage::{Coverage, HitCosts};
use crate::peers::Goal;
use crate::sizes::{SizesRow, MAX_LEN};

/// Fonts tried, in order.
pub const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

#[derive(Debug, Error)]
pub enum PlotError {
    #[error("no TrueType font for the plots (tried {tried}); install fonts-dejavu-core")]
    NoFont { tried: String },
    #[error("drawing {file}: {reason}")]
    Draw { file: PathBuf, reason: String },
}

fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        for p in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(p) {
                // plotters keeps fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    log::debug!("plot font: {p}");
                    return Ok(());
                }
            }
        }
        Err(FONT_PATHS.join(", "))
    })
    .clone()
    .map_err(|tried| PlotError::NoFont { tried })
}

fn draw_err(file: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |reason| PlotError::Draw {
        file: file.to_path_buf(),
        reason,
    }
}

/// Draw `f` into `stem.png` and `stem.svg`; returns both paths.
fn both(
    stem: &Path,
    size: (u32, u32),
    f: impl Fn(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String> + Copy,
    g: impl Fn(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<[PathBuf; 2], PlotError> {
    ensure_font()?;
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| draw_err(&png)(e.to_string()))?;
        f(&root).map_err(draw_err(&png))?;
        root.present().map_err(|e| draw_err(&png)(e.to_string()))?;
    }
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| draw_err(&svg)(e.to_string()))?;
        g(&root).map_err(draw_err(&svg))?;
        root.present().map_err(|e| draw_err(&svg)(e.to_string()))?;
    }
    Ok([png, svg])
}

/// The fifteen length colours of Fig. 4 (1 byte … 15 bytes).
fn length_colour(n: usize) -> RGBColor {
    const C: [RGBColor; 15] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x7f, 0x7f, 0x7f),
        RGBColor(0xbc, 0xbd, 0x22),
        RGBColor(0x17, 0xbe, 0xcf),
        RGBColor(0x39, 0x3b, 0x79),
        RGBColor(0x63, 0x79, 0x39),
        RGBColor(0x8c, 0x6d, 0x31),
        RGBColor(0x84, 0x3c, 0x39),
        RGBColor(0x7b, 0x41, 0x73),
    ];
    C[(n.max(1) - 1) % C.len()]
}

fn table1<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, t: &CostTable) -> Result<(), String> {
    let rows: Vec<_> = t.rows.iter().filter(|r| r.median > 0.0).collect();
    let max = rows.iter().map(|r| r.p90.max(r.median)).fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!(
                "Table 1 today: cycles per call ({:.2} GHz TSC, medians, p10-p90 bars)",
                t.tsc_ghz
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (0..rows.len().saturating_sub(1)).into_segmented(),
            (1.0..max).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = rows
        .iter()
        .map(|r| short_name(&r.key).to_string())
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("cycles (log)")
        .x_labels(rows.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_label_style(("sans-serif", 11))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let colour = if r.key.starts_with("jmp") {
                RGBColor(0x2c, 0xa0, 0x2c)
            } else if r.key == "trap" {
                RGBColor(0xd6, 0x27, 0x28)
            } else {
                RGBColor(0x7f, 0x7f, 0x7f)
            };
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 1.0),
                    (SegmentValue::Exact(i + 1), r.median.max(1.0)),
                ],
                colour.filled(),
            );
            bar.set_margin(0, 0, 8, 8);
            bar
        }))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            PathElement::new(
                vec![
                    (SegmentValue::CenterOf(i), r.p10.max(1.0)),
                    (SegmentValue::CenterOf(i), r.p90.max(1.0)),
                ],
                BLACK.stroke_width(2),
            )
        }))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            Text::new(
                format!("{:.0}", r.median),
                (SegmentValue::CenterOf(i), r.median.max(1.0) * 1.08),
                TextStyle::from(("sans-serif", 13).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The bar label of a Table 1 row.
fn short_name(key: &str) -> &str {
    match key {
        "unpatched" => "unpatched",
        "jmp_rel32" => "jmp rel32",
        "short_unpatched" => "unpatched (3 B fn)",
        "jmp_springboard" => "jmp rel8+springbd",
        "trap" => "trap (int 0xf5)",
        "floor_sigsegv" => "C SIGSEGV floor",
        "floor_int3" => "int3 floor",
        "floor_int3_cd03" => "int $3 (CD 03) floor",
        "uprobe" => "uprobe",
        other => other,
    }
}

/// An axis label for a byte distance: the nearest binary unit, no decimals.
fn approx_bytes(d: f64) -> String {
    const UNITS: [(f64, &str); 5] = [
        (1_099_511_627_776.0, "TiB"),
        (1_073_741_824.0, "GiB"),
        (1_048_576.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "B"),
    ];
    let (u, name) = UNITS
        .iter()
        .find(|(u, _)| d >= *u)
        .copied()
        .unwrap_or((1.0, "B"));
    format!("{:.0} {name}", d / u)
}

fn fig4<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    rows: &[SizesRow],
) -> Result<(), String> {
    let (plot, legend) = root.split_horizontally(root.dim_in_pixel().0.saturating_sub(140));
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "Fig. 4 today: instruction lengths in kernel code",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0..rows.len().saturating_sub(1)).into_segmented(),
            0.0..100.0,
        )
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = rows.iter().map(|r| r.set.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("% of instructions")
        .x_labels(rows.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| e.to_string())?;
    for n in 1..=MAX_LEN {
        chart
            .draw_series(rows.iter().enumerate().map(|(i, r)| {
                let below: f64 = (1..n).map(|k| 100.0 * r.histogram.share(k)).sum();
                let top = below + 100.0 * r.histogram.share(n);
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), below),
                        (SegmentValue::Exact(i + 1), top),
                    ],
                    length_colour(n).filled(),
                );
                bar.set_margin(0, 0, 10, 10);
                bar
            }))
            .map_err(|e| e.to_string())?;
    }
    // The legend: one swatch per length, top = 1 byte.
    let mut y = 40;
    legend
        .draw(&Text::new("length", (10, 20), ("sans-serif", 14)))
        .map_err(|e| e.to_string())?;
    for n in 1..=MAX_LEN {
        legend
            .draw(&Rectangle::new(
                [(10, y), (26, y + 14)],
                length_colour(n).filled(),
            ))
            .map_err(|e| e.to_string())?;
        legend
            .draw(&Text::new(
                format!("{n} byte{}", if n == 1 { "" } else { "s" }),
                (32, y),
                ("sans-serif", 13),
            ))
            .map_err(|e| e.to_string())?;
        y += 20;
    }
    legend
        .draw(&Text::new(
            "5-byte jmp needs",
            (10, y + 10),
            ("sans-serif", 12),
        ))
        .map_err(|e| e.to_string())?;
    legend
        .draw(&Text::new(
            "a 5+ byte window",
            (10, y + 26),
            ("sans-serif", 12),
        ))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Sum the coverage of several sets, distance by distance (they share [`crate::coverage::DISTANCES`]).
pub fn total(all: &[Coverage]) -> Coverage {
    let mut out = Coverage {
        set: "all planned sets".into(),
        ..Default::default()
    };
    for c in all {
        if out.at.is_empty() {
            out.at =
                c.at.iter()
                    .map(|a| crate::coverage::AtDistance {
                        distance: a.distance,
                        ..Default::default()
                    })
                    .collect();
            out.trap_rescues = vec![0; c.at.len()];
        }
        out.functions += c.functions;
        out.undecodable_functions += c.undecodable_functions;
        for (o, a) in out.at.iter_mut().zip(&c.at) {
            o.merge(a);
        }
        for (o, r) in out.trap_rescues.iter_mut().zip(&c.trap_rescues) {
            *o += r;
        }
    }
    out
}

fn fig5<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    all: &[Coverage],
    costs: &HitCosts,
) -> Result<(), String> {
    let tot = total(all);
    let curve = tot.curve(costs);
    if curve.is_empty() {
        return Err("no planned points".into());
    }
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 * 62 / 100);
    let (lo, hi) = (
        curve[0].distance as f64,
        curve[curve.len() - 1].distance as f64,
    );
    let ymax = [costs.trap, costs.jmp_rel32, costs.jmp_springboard]
        .into_iter()
        .fold(10.0, f64::max)
        * 3.0;
    let label = |d: &f64| approx_bytes(*d);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "Fig. 5 today: expected cycles per hit vs distance to the patch buffer ({} points; hit costs: the process backend's)",
                tot.at[0].points
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi).log_scale(), (1.0..ymax).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_label_formatter(&label)
        .y_desc("cycles per hit (log)")
        .draw()
        .map_err(|e| e.to_string())?;
    let series = [
        (
            "trap only",
            RGBColor(0xd6, 0x27, 0x28),
            curve
                .iter()
                .filter_map(|p| Some((p.distance as f64, p.trap_cycles?)))
                .collect::<Vec<_>>(),
        ),
        (
            "jmp only (rel32 or rel8+springboard)",
            RGBColor(0x2c, 0xa0, 0x2c),
            curve
                .iter()
                .filter_map(|p| Some((p.distance as f64, p.jmp_cycles?)))
                .collect(),
        ),
        (
            "jmp where possible, else trap",
            RGBColor(0x1f, 0x77, 0xb4),
            curve
                .iter()
                .filter_map(|p| Some((p.distance as f64, p.hybrid_cycles?)))
                .collect(),
        ),
    ];
    for (name, colour, pts) in series {
        chart
            .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;

    let mut cov = ChartBuilder::on(&bottom)
        .caption(
            "share of instruction boundaries each mechanism can splice",
            ("sans-serif", 15),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)
        .map_err(|e| e.to_string())?;
    cov.configure_mesh()
        .x_label_formatter(&label)
        .x_desc("distance between point and patch buffer (log; rel32 reaches ±2 GiB)")
        .y_desc("% of points")
        .draw()
        .map_err(|e| e.to_string())?;
    let cseries = [
        (
            "trap",
            RGBColor(0xd6, 0x27, 0x28),
            curve
                .iter()
                .map(|p| (p.distance as f64, 100.0 * p.trap_coverage))
                .collect::<Vec<_>>(),
        ),
        (
            "jmp",
            RGBColor(0x2c, 0xa0, 0x2c),
            curve
                .iter()
                .map(|p| (p.distance as f64, 100.0 * p.jmp_coverage))
                .collect(),
        ),
    ];
    for (name, colour, pts) in cseries {
        cov.draw_series(LineSeries::new(pts, colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    cov.configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Table 1 as `stem.png` and `stem.svg`.
pub fn draw_table1(stem: &Path, t: &CostTable) -> Result<[PathBuf; 2], PlotError> {
    both(stem, (1000, 620), |r| table1(r, t), |r| table1(r, t))
}

/// Fig. 4 as `stem.png` and `stem.svg`.
pub fn draw_fig4(stem: &Path, rows: &[SizesRow]) -> Result<[PathBuf; 2], PlotError> {
    both(stem, (1000, 600), |r| fig4(r, rows), |r| fig4(r, rows))
}

/// Fig. 5 as `stem.png` and `stem.svg`.
pub fn draw_fig5(
    stem: &Path,
    all: &[Coverage],
    costs: &HitCosts,
) -> Result<[PathBuf; 2], PlotError> {
    both(
        stem,
        (1000, 760),
        |r| fig5(r, all, costs),
        |r| fig5(r, all, costs),
    )
}

/// A goal's bar label: its text (at most 100 characters) with the N it was measured at, if not
/// the goal's, and the ratio.
fn goal_label(g: &Goal) -> String {
    let end = g.goal.find(" (measured").unwrap_or(g.goal.len());
    let mut label: String = g.goal[..end].trim().chars().take(100).collect();
    // Where the goal was measured at a smaller N, say which.
    if let Some(n) = g.goal[end..]
        .strip_prefix(" (measured at N = ")
        .and_then(|r| r.split([';', ')']).next())
    {
        label.push_str(&format!(" [measured at N = {n}]"));
    }
    label.push_str(&format!(": {}", g.measured));
    label
}

fn peers_goals<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    goals: &[Goal],
) -> Result<(), String> {
    let rows: Vec<(&Goal, f64)> = goals.iter().filter_map(|g| Some((g, g.margin?))).collect();
    let lo = rows.iter().map(|r| r.1).fold(1.0, f64::min) / 2.0;
    let hi = rows.iter().map(|r| r.1).fold(1.0, f64::max) * 2.0;
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Issue 13: trapvec beside its peers (margin over each goal; right of 1 is met)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..n as f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("goal margin (log): target / measured for an upper bound, measured / target for a lower one")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, (_, m))| {
            let y = (n - 1 - i) as f64;
            let colour = if *m >= 1.0 {
                RGBColor(0x2c, 0xa0, 0x2c)
            } else {
                RGBColor(0xd6, 0x27, 0x28)
            };
            Rectangle::new([(lo, y + 0.15), (*m, y + 0.85)], colour.mix(0.6).filled())
        }))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(1.0, 0.0), (1.0, n as f64)],
            BLACK.stroke_width(2),
        )))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, (g, _))| {
            Text::new(
                goal_label(g),
                (lo * 1.05, (n - 1 - i) as f64 + 0.5),
                TextStyle::from(("sans-serif", 13).into_font())
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            )
        }))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Issue 13's goals (those measured) as `stem.png` and `stem.svg`.
pub fn draw_peers(stem: &Path, goals: &[Goal]) -> Result<[PathBuf; 2], PlotError> {
    both(
        stem,
        (1000, 560),
        |r| peers_goals(r, goals),
        |r| peers_goals(r, goals),
    )
}
