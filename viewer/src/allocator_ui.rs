//! The Allocator view: the recorded reserved curve (what PyTorch's cudaMalloc/cudaFree
//! decisions gave) overlaid with the one `memsnap-simulate` replays under chosen
//! `PYTORCH_CUDA_ALLOC_CONF` settings and device memory, their numbers side by side, the
//! replay's fidelity, and the ranked suggestions. Simulations run in background jobs.

use std::sync::Arc;

use egui::{Color32, Pos2, RichText, Sense, Shape, Stroke};
use memsnap_format::Snapshot;
use memsnap_simulate::{CapacitySource, DeviceReport, Suggestions};

use crate::allocator::{self, AllocatorError, AllocatorRun, Request};
use crate::job::{Job, JobError};
use crate::palette;
use crate::units::format_size;

/// Height of the plot.
const PLOT_HEIGHT: f32 = 280.0;

/// What the panel reads: the file and the device shown.
pub struct AllocatorModel<'a> {
    pub snapshot: &'a Arc<Snapshot>,
    pub device: i64,
}

/// The view's state for one device.
#[derive(Default)]
pub struct AllocatorState {
    /// The settings field; `None` until first shown (then the file's own settings).
    pub conf: Option<String>,
    /// The memory-limit field (empty: what the file implies).
    pub limit: String,
    /// The file's own settings and where they came from.
    file_conf: Option<(String, &'static str)>,
    pub run: Option<AllocatorRun>,
    pub suggestions: Option<Suggestions>,
    /// Why the last simulation or suggestion gave no result.
    pub error: Option<JobError<AllocatorError>>,
    run_job: Option<Job<AllocatorRun, AllocatorError>>,
    suggest_job: Option<Job<Suggestions, AllocatorError>>,
}

impl AllocatorState {
    /// Whether a simulation or a suggestion is running.
    pub fn is_running(&self) -> bool {
        self.run_job.is_some() || self.suggest_job.is_some()
    }

    /// Blocks until the running work is done (tests).
    pub fn finish(&mut self) {
        if let Some(job) = self.run_job.take() {
            self.accept_run(job.wait());
        }
        if let Some(job) = self.suggest_job.take() {
            self.accept_suggestions(job.wait());
        }
    }

    fn accept_run(&mut self, result: Result<AllocatorRun, JobError<AllocatorError>>) {
        match result {
            Ok(run) => {
                self.run = Some(run);
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }

    fn accept_suggestions(&mut self, result: Result<Suggestions, JobError<AllocatorError>>) {
        match result {
            Ok(s) => {
                self.suggestions = Some(s);
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }

    fn poll(&mut self) {
        if let Some(result) = self.run_job.as_ref().and_then(Job::poll) {
            self.run_job = None;
            self.accept_run(result);
        }
        if let Some(result) = self.suggest_job.as_ref().and_then(Job::poll) {
            self.suggest_job = None;
            self.accept_suggestions(result);
        }
    }

    /// Starts simulating the fields' settings (replacing a simulation still running).
    pub fn start_run(&mut self, model: &AllocatorModel<'_>, ctx: &egui::Context) {
        let memory_limit = match allocator::parse_limit(&self.limit) {
            Ok(limit) => limit,
            Err(e) => {
                self.error = Some(JobError::Failed(e));
                return;
            }
        };
        let request = Request {
            device: model.device,
            alloc_conf: self.conf.clone().unwrap_or_default(),
            memory_limit,
        };
        let baseline = self.run.as_ref().map(|r| r.baseline.clone());
        let snapshot = model.snapshot.clone();
        if let Some(replaced) = &self.run_job {
            replaced.cancel();
        }
        self.run_job = Some(Job::spawn("the simulation", Some(ctx.clone()), move |_| {
            allocator::run(&snapshot, request, baseline)
        }));
    }

    fn start_suggest(&mut self, model: &AllocatorModel<'_>, ctx: &egui::Context) {
        let memory_limit = match allocator::parse_limit(&self.limit) {
            Ok(limit) => limit,
            Err(e) => {
                self.error = Some(JobError::Failed(e));
                return;
            }
        };
        let snapshot = model.snapshot.clone();
        let device = model.device;
        self.suggest_job = Some(Job::spawn(
            "the suggestions",
            Some(ctx.clone()),
            move |_| allocator::run_suggest(&snapshot, device, memory_limit),
        ));
    }
}

/// The view: settings, the table, the fidelity line, the plot and the suggestions.
pub fn allocator_ui(ui: &mut egui::Ui, model: &AllocatorModel<'_>, state: &mut AllocatorState) {
    state.poll();
    if state.conf.is_none() {
        // First time shown: the file's own settings, simulated at once.
        let own = allocator::file_conf(model.snapshot);
        state.conf = Some(own.0.clone());
        state.file_conf = Some(own);
        state.start_run(model, ui.ctx());
    }
    controls_ui(ui, model, state);
    if let Some(e) = &state.error {
        ui.label(RichText::new(format!("Error: {e}")).color(ui.visuals().error_fg_color));
    }
    if state.is_running() {
        // The worker wakes the UI when done; this keeps the spinner turning meanwhile.
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_millis(100));
    }
    let Some(run) = &state.run else {
        if !state.is_running() {
            ui.label("No simulation yet.");
        }
        return;
    };
    let mut apply = None;
    egui::Panel::right("allocator_suggestions")
        .resizable(true)
        .default_size(380.0)
        .max_size(460.0)
        .show(ui, |ui| {
            apply = suggestions_ui(ui, state.suggestions.as_ref(), run);
        });
    egui::CentralPanel::default().show(ui, |ui| {
        egui::ScrollArea::vertical().show(ui, |ui| {
            summary_ui(ui, run);
            ui.separator();
            plot_ui(ui, run);
        });
    });
    if let Some(conf) = apply {
        state.conf = Some(conf);
        state.start_run(model, ui.ctx());
    }
}

fn controls_ui(ui: &mut egui::Ui, model: &AllocatorModel<'_>, state: &mut AllocatorState) {
    let mut go = false;
    ui.horizontal_wrapped(|ui| {
        let label = ui.label("PYTORCH_CUDA_ALLOC_CONF");
        let conf = state.conf.get_or_insert_with(String::new);
        let response = ui
            .add(
                egui::TextEdit::singleline(conf)
                    .desired_width(360.0)
                    .hint_text("PyTorch defaults"),
            )
            .labelled_by(label.id)
            .on_hover_text(
                "The whole setting of the simulated run, e.g. expandable_segments:True,max_split_size_mb:128 (Enter simulates)",
            );
        go |= response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        let label = ui.label("memory limit");
        let response = ui
            .add(
                egui::TextEdit::singleline(&mut state.limit)
                    .desired_width(90.0)
                    .hint_text("from the file"),
            )
            .labelled_by(label.id)
            .on_hover_text(
                "Device memory for the simulated run (24GiB, 80GB); empty: what the file implies (its OOM entry), else 80 GiB",
            );
        go |= response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        go |= ui
            .button("Simulate")
            .on_hover_text("Replay the trace under these settings (in the background)")
            .clicked();
        if let Some((own, source)) = &state.file_conf {
            if ui
                .button("File's settings")
                .on_hover_text(format!(
                    "Back to the file's own settings: {} ({source})",
                    if own.is_empty() { "PyTorch defaults" } else { own }
                ))
                .clicked()
            {
                state.conf = Some(own.clone());
                state.limit.clear();
                go = true;
            }
        }
        if ui
            .add_enabled(state.suggest_job.is_none(), egui::Button::new("Suggest"))
            .on_hover_text(
                "Try the settings people use (expandable segments, max_split_size_mb, garbage collection, rounding) on top of the file's, and rank them",
            )
            .clicked()
        {
            state.start_suggest(model, ui.ctx());
        }
        if state.is_running() {
            ui.spinner().on_hover_text("Simulating in the background");
            ui.label(if state.suggest_job.is_some() {
                "trying settings…"
            } else {
                "simulating…"
            });
        }
    });
    if go {
        state.start_run(model, ui.ctx());
    }
}

fn recorded_color(ui: &egui::Ui) -> Color32 {
    palette::color32(palette::reserved(ui.visuals().dark_mode))
}

fn simulated_color() -> Color32 {
    palette::color32(palette::series_colour(1))
}

fn settings_label(conf: &str) -> &str {
    if conf.is_empty() {
        "PyTorch defaults"
    } else {
        conf
    }
}

fn summary_ui(ui: &mut egui::Ui, run: &AllocatorRun) {
    let s = &*run.simulated;
    let b = &*run.baseline;
    let limit = match s.capacity_source {
        CapacitySource::Limit => format!("{} (the limit given)", format_size(s.capacity_bytes)),
        CapacitySource::OomEntry => {
            format!("{} (the file's OOM entry)", format_size(s.capacity_bytes))
        }
        CapacitySource::Default => format!(
            "{} (nothing in the file says)",
            format_size(s.capacity_bytes)
        ),
    };
    ui.label(format!(
        "Simulated: {} on {limit}; {} of {} events replayed",
        settings_label(&run.alloc_conf),
        s.events_replayed,
        s.events
    ));
    let (rec, sim) = (b.recorded.reserved_peak_bytes, s.reserved_peak_bytes);
    let change = if rec > 0 {
        format!(" ({:+.1}%)", (sim as f64 - rec as f64) / rec as f64 * 100.0)
    } else {
        String::new()
    };
    ui.strong(format!(
        "Simulated reserved peak {} vs {} recorded{change}",
        format_size(sim),
        format_size(rec)
    ));
    egui::Grid::new("allocator_table")
        .striped(true)
        .num_columns(3)
        .show(ui, |ui| {
            ui.strong("");
            ui.strong("recorded")
                .on_hover_text("What the file shows: PyTorch's own decisions");
            ui.strong("simulated").on_hover_text(format!(
                "memsnap's allocator under {}",
                settings_label(&run.alloc_conf)
            ));
            ui.end_row();
            for row in allocator::comparison(run) {
                ui.label(row.label).on_hover_text(row.tooltip);
                ui.label(RichText::new(&row.recorded).color(recorded_color(ui)));
                ui.label(RichText::new(&row.simulated).color(simulated_color()));
                ui.end_row();
            }
        });
    let line = allocator::fidelity_line(&b.fidelity);
    let text = format!("Fidelity with the file's own settings: {line}");
    if b.fidelity.exact() {
        ui.label(text)
    } else {
        ui.label(RichText::new(text).color(palette::color32(palette::WARNING)))
    }
    .on_hover_text(
        "The replay with the file's settings compared with PyTorch's recorded cudaMalloc/cudaFree/map/unmap, step by step",
    );
    if b.anomaly_count > 0 || s.anomaly_count > 0 {
        let mut tip = String::new();
        for a in b.anomalies.iter().chain(&s.anomalies).take(10) {
            tip.push_str(a);
            tip.push('\n');
        }
        ui.label(format!(
            "{} inconsistencies of the file absorbed",
            b.anomaly_count.max(s.anomaly_count)
        ))
        .on_hover_text(tip);
    }
}

/// The two reserved curves over the trace, with their OOMs, the device memory, a legend and
/// a hover card with both values at the event.
fn plot_ui(ui: &mut egui::Ui, run: &AllocatorRun) {
    let recorded = &run.baseline.recorded_reserved_curve;
    let simulated = &run.simulated.reserved_curve;
    let (rc, sc) = (recorded_color(ui), simulated_color());
    ui.horizontal(|ui| {
        legend_item(ui, rc, "recorded reserved".into());
        legend_item(
            ui,
            sc,
            format!("simulated reserved ({})", settings_label(&run.alloc_conf)),
        );
        legend_item(
            ui,
            palette::color32(palette::WARNING),
            "out of memory".into(),
        );
    });
    let events = recorded.len().max(simulated.len()).max(1);
    let capacity = match run.simulated.capacity_source {
        CapacitySource::Default => None,
        _ => Some(run.simulated.capacity_bytes),
    };
    // The curves' highest values from their tables: O(log n) a frame, not a scan of both.
    let highest = |curve: &[u64], table: &memsnap_analysis::curve::RangeMinMax| {
        table.query(curve, 0, curve.len()).map_or(0, |(_, max)| max)
    };
    let y_max = highest(recorded, &run.recorded_table)
        .max(highest(simulated, &run.simulated_table))
        .max(capacity.unwrap_or(0))
        .max(1) as f64
        * 1.08;
    let width = ui.available_width().max(100.0);
    let (rect, response) = ui.allocate_exact_size(egui::vec2(width, PLOT_HEIGHT), Sense::hover());
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 0.0, ui.visuals().extreme_bg_color);
    let to_x = |x: f64| rect.left() + (x / events as f64) as f32 * rect.width();
    let to_y = |v: u64| rect.bottom() - (v as f64 / y_max) as f32 * rect.height();
    let text_color = ui.visuals().weak_text_color();
    let font = egui::FontId::proportional(11.0);
    // Horizontal guides at quarters of the scale.
    for k in 1..=4 {
        let v = (y_max / 1.08 * f64::from(k) / 4.0) as u64;
        let y = to_y(v);
        painter.hline(
            rect.x_range(),
            y,
            Stroke::new(0.5, ui.visuals().widgets.noninteractive.bg_stroke.color),
        );
        painter.text(
            Pos2::new(rect.left() + 3.0, y),
            egui::Align2::LEFT_BOTTOM,
            format_size(v),
            font.clone(),
            text_color,
        );
    }
    if let Some(c) = capacity {
        let y = to_y(c);
        painter.add(Shape::dashed_line(
            &[Pos2::new(rect.left(), y), Pos2::new(rect.right(), y)],
            Stroke::new(1.0, text_color),
            6.0,
            4.0,
        ));
        painter.text(
            Pos2::new(rect.right() - 3.0, y),
            egui::Align2::RIGHT_BOTTOM,
            format!("device memory {}", format_size(c)),
            font.clone(),
            text_color,
        );
    }
    let columns = width.round() as usize;
    // The recorded line is wider and underneath: where the curves agree it edges the other.
    for (curve, table, color, stroke) in [
        (recorded, &run.recorded_table, rc, 3.5),
        (simulated, &run.simulated_table, sc, 1.5),
    ] {
        let points: Vec<Pos2> = allocator::step_points(curve, table, columns)
            .into_iter()
            .map(|(x, v)| Pos2::new(to_x(x), to_y(v)))
            .collect();
        if points.len() >= 2 {
            painter.add(Shape::line(points, Stroke::new(stroke, color)));
        }
    }
    let ooms = [
        (run.baseline.recorded.oom_event, rc, "OOM (recorded)"),
        (
            run.simulated.oom.as_ref().map(|o| o.event),
            sc,
            "OOM (simulated)",
        ),
    ];
    for (k, (event, color, label)) in ooms.into_iter().enumerate() {
        let Some(event) = event else { continue };
        let x = to_x(event as f64 + 0.5);
        painter.add(Shape::dashed_line(
            &[Pos2::new(x, rect.top()), Pos2::new(x, rect.bottom())],
            Stroke::new(1.5, palette::color32(palette::WARNING)),
            4.0,
            3.0,
        ));
        painter.text(
            Pos2::new(x - 3.0, rect.bottom() - 20.0 - 14.0 * k as f32),
            egui::Align2::RIGHT_BOTTOM,
            format!("{label} @ {event}"),
            font.clone(),
            color,
        );
    }
    painter.text(
        rect.right_bottom() + egui::vec2(-3.0, -2.0),
        egui::Align2::RIGHT_BOTTOM,
        format!("trace event (0 – {})", events.saturating_sub(1)),
        font,
        text_color,
    );
    let response = response.on_hover_ui_at_pointer(|ui| {
        if let Some(pos) = ui.ctx().pointer_latest_pos() {
            let event = (((pos.x - rect.left()) / rect.width()) as f64 * events as f64)
                .floor()
                .clamp(0.0, (events - 1) as f64) as usize;
            hover_card_ui(ui, run, event);
        }
    });
    if let Some(pos) = response.hover_pos() {
        painter.vline(
            pos.x,
            rect.y_range(),
            Stroke::new(1.0, ui.visuals().weak_text_color()),
        );
    }
    response.widget_info(|| {
        egui::WidgetInfo::labeled(
            egui::Role::Image,
            true,
            format!(
                "Reserved memory, recorded (peak {}) and simulated (peak {})",
                format_size(run.baseline.recorded.reserved_peak_bytes),
                format_size(run.simulated.reserved_peak_bytes)
            ),
        )
    });
}

/// A colour swatch and its label.
fn legend_item(ui: &mut egui::Ui, color: Color32, label: String) {
    let (rect, _) = ui.allocate_exact_size(egui::vec2(18.0, 10.0), Sense::hover());
    ui.painter()
        .rect_filled(rect.shrink2(egui::vec2(0.0, 3.0)), 1.0, color);
    ui.label(label);
}

fn hover_card_ui(ui: &mut egui::Ui, run: &AllocatorRun, event: usize) {
    let value = |report: &DeviceReport, curve: &[u64]| match allocator::value_at(curve, event) {
        Some(v) => format_size(v),
        None if report.oom.is_some() => "– (stopped at the OOM)".into(),
        None => "–".into(),
    };
    ui.strong(format!("event {event}"));
    ui.colored_label(
        recorded_color(ui),
        format!(
            "recorded reserved: {}",
            value(&run.baseline, &run.baseline.recorded_reserved_curve)
        ),
    );
    ui.colored_label(
        simulated_color(),
        format!(
            "simulated reserved: {}",
            value(&run.simulated, &run.simulated.reserved_curve)
        ),
    );
}

/// The ranked suggestions; returns the settings clicked.
fn suggestions_ui(
    ui: &mut egui::Ui,
    suggestions: Option<&Suggestions>,
    run: &AllocatorRun,
) -> Option<String> {
    ui.strong("Suggestions");
    let Some(s) = suggestions else {
        ui.label("Press Suggest to try the common settings on top of the file's and rank them: runs without an OOM first, then the latest OOM, then the lowest reserved peak.");
        return None;
    };
    let mut clicked = None;
    if let Some(best) = s.candidates.first() {
        ui.label(format!("{}.", best.verdict));
    }
    ui.add_space(4.0);
    egui::ScrollArea::vertical()
        .id_salt("allocator_suggestions_scroll")
        .show(ui, |ui| {
            egui::Grid::new("allocator_suggestions_table")
                .striped(true)
                .num_columns(3)
                .show(ui, |ui| {
                    ui.strong("settings");
                    ui.strong("reserved");
                    ui.strong("OOM");
                    ui.end_row();
                    let rows = std::iter::once((&s.baseline, "(the file's own)"))
                        .chain(s.candidates.iter().map(|c| (c, c.change.as_str())));
                    for (c, label) in rows {
                        let current = c.alloc_conf == run.alloc_conf;
                        if ui
                            .selectable_label(current, label)
                            .on_hover_text(format!(
                                "{}\nClick to simulate: {}",
                                if c.verdict.is_empty() {
                                    "The file's own settings"
                                } else {
                                    &c.verdict
                                },
                                settings_label(&c.alloc_conf)
                            ))
                            .clicked()
                        {
                            clicked = Some(c.alloc_conf.clone());
                        }
                        ui.label(format_size(c.reserved_peak_bytes));
                        ui.label(c.oom.map_or("no".into(), |(_, e)| format!("event {e}")));
                        ui.end_row();
                    }
                });
        });
    clicked
}
