//! The picture is built from the analysis layout: one path per drawn band, a residual band
//! when a threshold folds allocations, and a PNG of the requested size.

use memsnap_analysis::{Category, PhaseKind, StepOptions};
use memsnap_analysis::{DeviceTimeline, LayoutRequest};
use memsnap_plot::{category_colour, phase_colour, render_svg, ColourBy, PlotError, PlotOptions};
use memsnap_workload::{generate, TrainingRun};

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
    for phase in ["set-up", "forward", "backward", "optimizer"] {
        assert!(
            svg.contains(&format!(">{phase}</text>")),
            "{phase} in the legend"
        );
    }
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
    assert!(folded.contains(">smaller than 4.0 MiB</text>"));
    assert!(!all.contains("smaller than"));
}

#[cfg(feature = "png")]
#[test]
fn png_has_the_requested_size() {
    let png = memsnap_plot::render_png(
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

/// Every phase of every step is shaded behind the bands, and its slope drawn with its rate.
#[test]
fn phases_are_shaded_and_their_slopes_drawn() {
    let snapshot = run();
    let svg = render_svg(&snapshot, &PlotOptions::default()).unwrap();
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let analysis = timeline.steps(&StepOptions::default());
    let phases = analysis.phases().count();
    assert_eq!(
        phases,
        1 + 3 * 3,
        "set-up, then forward/backward/optimizer per step"
    );
    // The shading is the first group clipped to the plot, under everything else.
    let shading = |svg: &str| {
        let start = svg.find(r#"<g clip-path="#).expect("shading group");
        let end = start + svg[start..].find("</g>").expect("end of shading group");
        svg[start..end]
            .lines()
            .filter(|l| l.starts_with("<rect") && l.contains("fill-opacity"))
            .count()
    };
    let shades = shading(&svg);
    assert_eq!(shades, phases);
    for kind in [PhaseKind::Setup, PhaseKind::Optimizer] {
        assert!(svg.contains(&phase_colour(kind).to_string()), "{kind}");
    }
    assert!(svg.contains("/s</text>"), "rates are written");
    let plain = render_svg(
        &snapshot,
        &PlotOptions {
            show_steps: false,
            ..PlotOptions::default()
        },
    )
    .unwrap();
    assert_eq!(shading(&plain), 0);
    assert!(!plain.contains("/s</text>"));
}

/// `ColourBy::Category` paints each band with its allocation's category colour.
#[test]
fn bands_take_their_category_phase_or_module_colour() {
    let snapshot = run();
    let by_category = render_svg(
        &snapshot,
        &PlotOptions {
            colour_by: ColourBy::Category,
            ..PlotOptions::default()
        },
    )
    .unwrap();
    for c in [
        Category::Parameter,
        Category::OptimizerState,
        Category::Gradient,
        Category::Activation,
        Category::Temporary,
    ] {
        let fill = format!("fill=\"{}\"", category_colour(c));
        assert!(by_category.contains(&fill), "{c} bands");
        assert!(
            by_category.contains(&format!(">{}</text>", c.label())),
            "{c} legend"
        );
    }
    let by_phase = render_svg(
        &snapshot,
        &PlotOptions {
            colour_by: ColourBy::Phase,
            ..PlotOptions::default()
        },
    )
    .unwrap();
    let band_fills = |svg: &str| {
        let start = svg.find(r#"<g stroke="none">"#).unwrap();
        let end = start + svg[start..].find("</g>").unwrap();
        let mut fills: Vec<String> = svg[start..end]
            .split("fill=\"")
            .skip(1)
            .map(|s| s.split('"').next().unwrap().to_string())
            .collect();
        fills.sort();
        fills.dedup();
        fills
    };
    let mut want: Vec<String> = [
        PhaseKind::Setup,
        PhaseKind::Forward,
        PhaseKind::Backward,
        PhaseKind::Optimizer,
    ]
    .iter()
    .map(|k| phase_colour(*k).to_string())
    .collect();
    want.sort();
    assert_eq!(band_fills(&by_phase), want);

    // By module: each band its module path's colour (found for the picture), grey outside
    // every module, the same colours as the sites' module keys give.
    let by_module = render_svg(
        &snapshot,
        &PlotOptions {
            colour_by: ColourBy::Module,
            ..PlotOptions::default()
        },
    )
    .unwrap();
    assert!(by_module.contains(">allocations (colour = module path)</text>"));
    let sites = memsnap_plot::sites::StackSites::new(&snapshot);
    sites.find_modules(&snapshot);
    let mut want: Vec<String> = (0..snapshot.stacks.len())
        .map(|i| {
            let stack = memsnap_format::StackId::from_index(i);
            memsnap_plot::palette::module_colour(sites.module(Some(stack))).to_string()
        })
        .collect();
    want.sort();
    want.dedup();
    let fills = band_fills(&by_module);
    assert!(fills.len() >= 3, "{fills:?}");
    assert!(fills.contains(&memsnap_plot::palette::NO_SITE.to_string()));
    assert!(
        fills.iter().all(|f| want.contains(f)),
        "{fills:?} of {want:?}"
    );
}

/// The viewer's overlay thins steps to two per half-point column; what it drops must be
/// slivers of that column, and wide steps must all stay.
#[test]
fn thinned_step_marks_keep_the_first_and_last_of_each_column_and_every_wide_step() {
    use memsnap_analysis::Axis;
    use memsnap_plot::scene::{self, Mapping, Rect, SceneModel, StepDetail, Theme};
    let snapshot = generate(&TrainingRun {
        steps: 60,
        ..TrainingRun::default()
    })
    .0;
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let steps = timeline.steps(&StepOptions::default());
    assert!(steps.steps.len() >= 50, "{} steps", steps.steps.len());
    let sites = memsnap_plot::sites::StackSites::new(&snapshot);
    let model = SceneModel {
        timeline: &timeline,
        steps: &steps,
        sites: &sites,
    };
    let events = timeline.replay().axis_len() as f64;
    let marks = |width: f32, detail| {
        let map = Mapping {
            plot: Rect::from_x_y(0.0, width, 0.0, 100.0),
            start: 0.0,
            end: events,
            y_max: 1e9,
            axis: Axis::Event,
        };
        scene::overlay(&model, &map, 0.0, &Theme::LIGHT, detail)
            .step_marks
            .iter()
            .map(|m| (m.index, m.line.points[0].x))
            .collect::<Vec<_>>()
    };
    // Wide: every step is more than a column apart, nothing is dropped.
    assert_eq!(
        marks(20_000.0, StepDetail::Thinned),
        marks(20_000.0, StepDetail::All)
    );
    // Narrow: a few columns for 60 steps.
    let all = marks(8.0, StepDetail::All);
    let thinned = marks(8.0, StepDetail::Thinned);
    assert!(
        thinned.len() < all.len(),
        "{} of {}",
        thinned.len(),
        all.len()
    );
    let column = |x: f32| (x / 0.5).floor() as i64;
    let mut columns: Vec<i64> = all.iter().map(|&(_, x)| column(x)).collect();
    columns.dedup();
    for c in columns {
        let in_column: Vec<usize> = all
            .iter()
            .filter(|&&(_, x)| column(x) == c)
            .map(|&(i, _)| i)
            .collect();
        let kept: Vec<usize> = thinned
            .iter()
            .filter(|&&(_, x)| column(x) == c)
            .map(|&(i, _)| i)
            .collect();
        let (first, last) = (in_column[0], *in_column.last().unwrap());
        let expected = if first == last {
            vec![first]
        } else {
            vec![first, last]
        };
        assert_eq!(kept, expected, "column {c}");
    }
}

/// A run recorded with `memsnap.torch.enable(modules=True)`: colour by module takes each
/// allocation's named path (its innermost `memsnap.module:` range), the same colour for the
/// same path in any file, grey outside every module; it used the stack's chain of forwards
/// even when the run named its modules.
#[test]
fn colour_by_module_uses_the_named_module_paths_of_a_run_that_records_them() {
    use memsnap_analysis::modules::MODULE_RANGE_PREFIX;
    use memsnap_analysis::AllocId;
    use memsnap_format::{Action, Annotation, Snapshot, TraceEntry};
    use memsnap_plot::palette::{module_colour, NO_SITE};
    use memsnap_plot::scene::{band_colour, SceneModel};
    use memsnap_plot::sites::{module_path_key, StackSites};
    let mut snapshot = Snapshot::new(1);
    let times = [10, 20, 30, 40, 47];
    for (i, &time) in times.iter().enumerate() {
        let mut e = TraceEntry::new(Action::Alloc, 0x10000 * (i as u64 + 1), 512, 0);
        e.set_time_us(Some(time));
        snapshot.device_traces.as_mut().unwrap()[0].push(e);
    }
    let mark = |end: bool, path: &str, time_us: i64| {
        Annotation::record(end, format!("{MODULE_RANGE_PREFIX}{path}"), 0, time_us)
    };
    snapshot.external_annotations = Some(vec![
        mark(false, "GPT", 15),
        mark(false, "blocks.0.attn", 25),
        mark(true, "blocks.0.attn", 35),
        mark(false, "blocks.1.attn", 45),
        mark(true, "blocks.1.attn", 48),
        mark(true, "GPT", 50),
    ]);
    let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
    let steps = timeline.steps(&StepOptions::default());
    let sites = StackSites::new(&snapshot);
    let model = SceneModel {
        timeline: &timeline,
        steps: &steps,
        sites: &sites,
    };
    let colours: Vec<_> = timeline
        .replay()
        .allocations
        .iter()
        .enumerate()
        .map(|(i, a)| band_colour(&model, AllocId(i as u32), a, ColourBy::Module, false))
        .collect();
    let path = |p: &str| module_colour(Some(module_path_key(p)));
    assert_eq!(
        colours,
        [
            NO_SITE,
            path("GPT"),
            path("blocks.0.attn"),
            path("GPT"),
            path("blocks.1.attn"),
        ]
    );
    assert_ne!(path("blocks.0.attn"), path("GPT"));
}
