//! The picture is built from the analysis layout: one path per drawn band, a residual band
//! when a threshold folds allocations, and a PNG of the requested size.

use memsnap_analysis::{DeviceTimeline, LayoutRequest};
use memsnap_format::synth::{generate, TrainingRun};
use memsnap_plot::{render_png, render_svg, PlotError, PlotOptions};

fn run() -> memsnap_format::Snapshot {
    generate(&TrainingRun {
        steps: 3,
        ..TrainingRun::default()
    })
    .0
}

fn band_paths(svg: &str) -> usize {
    // Bands are the filled paths inside the bands group.
    let start = svg.find(r#"<g stroke="none">"#).expect("bands group");
    let end = start + svg[start..].find("</g>").expect("end of bands group");
    svg[start..end].matches("<path ").count()
}

#[test]
fn svg_has_one_path_per_layout_band() {
    let snapshot = run();
    let options = PlotOptions::default();
    let svg = render_svg(&snapshot, &options).unwrap();
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let plot_width = options.width - 90 - 24;
    let mut request = LayoutRequest::whole(&timeline, plot_width);
    request.max_bands = options.max_bands;
    let layout = timeline.layout(&request).unwrap();
    assert!(!layout.bands.is_empty());
    assert_eq!(band_paths(&svg), layout.bands.len());
    assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("forward (growth)"), "steps are marked");
}

#[test]
fn min_size_folds_small_allocations_into_the_legend_band() {
    let snapshot = run();
    let all = render_svg(&snapshot, &PlotOptions::default()).unwrap();
    let folded = render_svg(
        &snapshot,
        &PlotOptions {
            min_size: 4 << 20,
            ..PlotOptions::default()
        },
    )
    .unwrap();
    assert!(band_paths(&folded) < band_paths(&all));
    assert!(folded.contains("allocations smaller than 4.0 MiB"));
    assert!(!all.contains("allocations smaller than"));
}

#[test]
fn png_has_the_requested_size() {
    let png = render_png(
        &run(),
        &PlotOptions {
            width: 640,
            height: 360,
            ..PlotOptions::default()
        },
    )
    .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (640, 360));
}

#[test]
fn unknown_device_and_bad_sizes_are_errors_not_panics() {
    let snapshot = run();
    let err = render_svg(
        &snapshot,
        &PlotOptions {
            device: Some(7),
            ..PlotOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, PlotError::NoSuchDevice { device: 7, .. }),
        "{err}"
    );
    let err = render_svg(
        &snapshot,
        &PlotOptions {
            width: 10,
            ..PlotOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, PlotError::InvalidOptions { .. }), "{err}");
    let empty = memsnap_format::Snapshot::new(1);
    assert!(render_svg(&empty, &PlotOptions::default()).is_err());
}

#[test]
fn range_outside_the_trace_is_clamped() {
    let svg = render_svg(
        &run(),
        &PlotOptions {
            range: Some((10.0, 1e12)),
            ..PlotOptions::default()
        },
    )
    .unwrap();
    assert!(band_paths(&svg) > 0);
}
