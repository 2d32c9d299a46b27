//! A side-by-side diff of two snapshots: both totals on one memory scale, per-step peaks, and
//! the call sites whose memory at the peak grew or shrank most (from `compare::diff`).

use egui::{Pos2, Sense, Shape, Stroke};
use memsnap_analysis::compare::diff;
use memsnap_analysis::{LayoutRequest, Lifetime};

use crate::document::Shown;
use crate::palette;
use crate::units::{format_delta, format_size};

/// Sites listed in each direction.
const TOP_SITES: usize = 15;

/// The diff page; `pair` holds the indices of the two documents compared.
pub fn diff_ui(ui: &mut egui::Ui, documents: &[Shown<'_>], pair: &mut (usize, usize)) {
    if documents.len() < 2 {
        ui.label("Open two snapshots to compare them.");
        return;
    }
    pair.0 = pair.0.min(documents.len() - 1);
    pair.1 = pair.1.min(documents.len() - 1);
    ui.horizontal(|ui| {
        for (label, index, id) in [
            ("before", &mut pair.0, "diff_before"),
            ("after", &mut pair.1, "diff_after"),
        ] {
            ui.label(label);
            egui::ComboBox::from_id_salt(id)
                .selected_text(documents[*index].document.name.clone())
                .show_ui(ui, |ui| {
                    for (i, d) in documents.iter().enumerate() {
                        ui.selectable_value(index, i, d.document.name.clone());
                    }
                })
                .response
                .on_hover_text("Which file to compare");
        }
    });
    let (a, b) = (&documents[pair.0], &documents[pair.1]);
    if let Some(e) = a.device.profile_error().or(b.device.profile_error()) {
        ui.label(format!("Cannot summarise these files: {e}"));
        return;
    }
    let (Some(before), Some(after)) = (a.device.profile(), b.device.profile()) else {
        // The profiles are computed after the files open; a repaint picks them up.
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label("Summarising both files…");
        });
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_millis(100));
        return;
    };
    let (before, mut after) = (before.clone(), after.clone());
    // Compare the shown device of each file even when their numbers differ (rank 0 vs 1).
    after.summary.device = before.summary.device;
    let Some(d) = diff(&[before], &[after], TOP_SITES).into_iter().next() else {
        ui.label("Nothing to compare.");
        return;
    };
    ui.label(format!(
        "peak {} to {} ({}{})",
        format_size(d.before_peak_bytes),
        format_size(d.after_peak_bytes),
        format_delta(d.delta_peak_bytes),
        d.delta_peak_percent
            .map(|p| format!(", {p:+.1}%"))
            .unwrap_or_default()
    ));
    let y_max = d.before_peak_bytes.max(d.after_peak_bytes).max(1) as f64 * 1.1;
    let half = (ui.available_width() - 8.0) / 2.0;
    ui.horizontal(|ui| {
        for doc in [a, b] {
            total_plot_ui(ui, doc, half, y_max);
        }
    });
    ui.separator();
    ui.columns(2, |cols| {
        sites_table(&mut cols[0], "Grew most at the peak", &d.grew, "diff_grew");
        sites_table(
            &mut cols[1],
            "Shrank most at the peak",
            &d.shrank,
            "diff_shrank",
        );
    });
    if !d.steps.is_empty() {
        ui.separator();
        ui.strong(format!(
            "Steps: {} before, {} after",
            d.before_steps, d.after_steps
        ));
        egui::Grid::new("diff_steps").striped(true).show(ui, |ui| {
            for t in [
                "step",
                "peak before",
                "peak after",
                "change",
                "start change",
            ] {
                ui.strong(t);
            }
            ui.end_row();
            for s in &d.steps {
                ui.label(s.index.to_string());
                ui.label(format_size(s.before_peak_bytes));
                ui.label(format_size(s.after_peak_bytes));
                ui.label(format_delta(s.delta_peak_bytes));
                ui.label(format_delta(s.delta_start_bytes));
                ui.end_row();
            }
        });
    }
}

fn total_plot_ui(ui: &mut egui::Ui, doc: &Shown<'_>, width: f32, y_max: f64) {
    ui.vertical(|ui| {
        ui.label(&doc.document.name);
        let (rect, response) = ui.allocate_exact_size(egui::vec2(width, 150.0), Sense::hover());
        let painter = ui.painter_at(rect);
        painter.rect_filled(rect, 0.0, ui.visuals().extreme_bg_color);
        let timeline = &doc.device.timeline;
        let mut request = LayoutRequest::whole(timeline, rect.width().round().max(1.0) as u32);
        request.max_bands = 0;
        request.min_size = u64::MAX;
        request.lifetime = Lifetime::Active;
        if let Ok(layout) = timeline.layout(&request) {
            let points: Vec<Pos2> = layout
                .columns
                .iter()
                .enumerate()
                .map(|(c, col)| {
                    Pos2::new(
                        rect.left() + c as f32,
                        rect.bottom() - (col.total_max as f64 / y_max) as f32 * rect.height(),
                    )
                })
                .collect();
            painter.add(Shape::line(
                points,
                Stroke::new(1.5, palette::color32(palette::FORWARD_SLOPE)),
            ));
        }
        response.widget_info(|| {
            egui::WidgetInfo::labeled(
                egui::Role::Image,
                true,
                format!("Total memory of {}", doc.document.name),
            )
        });
    });
}

fn sites_table(
    ui: &mut egui::Ui,
    title: &str,
    sites: &[memsnap_analysis::compare::SiteDelta],
    id: &str,
) {
    ui.strong(title);
    if sites.is_empty() {
        ui.weak("none");
        return;
    }
    egui::Grid::new(id)
        .striped(true)
        .num_columns(3)
        .show(ui, |ui| {
            for s in sites {
                ui.add(egui::Label::new(egui::RichText::new(&s.site).monospace()).truncate())
                    .on_hover_text(format!(
                        "{}\nat the peak: {} before, {} after\nallocated in total: {}",
                        s.site,
                        format_size(s.before_bytes_at_peak),
                        format_size(s.after_bytes_at_peak),
                        format_delta(s.delta_total_bytes)
                    ));
                ui.label(format_delta(s.delta_bytes_at_peak));
                ui.end_row();
            }
        });
}
