//! What every experiment's SVG plot shares: the series colours, the legend's style and the
//! plotting error. Used by the experiments' commands (`exp`), `gpuvm soak` and `gpuvm demo`.

/// The series colours, in order (matplotlib's "tab10").
pub(crate) const COLORS: [plotters::style::RGBColor; 8] = [
    plotters::style::RGBColor(0x1f, 0x77, 0xb4),
    plotters::style::RGBColor(0xd6, 0x27, 0x28),
    plotters::style::RGBColor(0x2c, 0xa0, 0x2c),
    plotters::style::RGBColor(0xff, 0x7f, 0x0e),
    plotters::style::RGBColor(0x94, 0x67, 0xbd),
    plotters::style::RGBColor(0x8c, 0x56, 0x4b),
    plotters::style::RGBColor(0xe3, 0x77, 0xc2),
    plotters::style::RGBColor(0x17, 0xbe, 0xcf),
];

/// Prints report `r` (as JSON with `json`, else as `render` lays it out) and writes its plot to
/// `svg` if one is asked for (saying where, unless the output is JSON).
pub(crate) fn emit<R: serde::Serialize>(
    r: &R,
    json: bool,
    render: impl Fn(&R) -> String,
    svg: Option<&std::path::Path>,
    write_svg: impl Fn(&R, &std::path::Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        println!("{}", render(r));
    }
    if let Some(p) = svg {
        write_svg(r, p)?;
        if !json {
            println!("plot: {}", p.display());
        }
    }
    Ok(())
}

/// A plotting backend's error as this command's error.
pub(crate) fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e:?}")
}

/// Draws a chart's series legend at `pos` in the style every experiment plot uses (white box,
/// grey border).
pub(crate) fn draw_legend<'a, DB, CT>(
    chart: &mut plotters::chart::ChartContext<'a, DB, CT>,
    pos: plotters::chart::SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB: plotters::prelude::DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    use plotters::style::{Color, BLACK, WHITE};
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(plot_err)
}
