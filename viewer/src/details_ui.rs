//! Details of one allocation (its user-code site, category and the phase that allocated it): a
//! hover card with the top frames, and the side panel with the pinned allocation's full,
//! copyable stack.

use memsnap_analysis::sites::is_filtered_frame;
use memsnap_analysis::{AllocId, CurveKind, Origin};
use memsnap_format::{Snapshot, StackId};

use crate::document::TimelineModel;
use crate::steps_ui::phase_label;
use crate::units::{format_duration_us, format_size, format_size_exact};
use crate::view::Selection;

/// Frames shown in the hover card.
const HOVER_FRAMES: usize = 6;

/// The stack as text, innermost frame first, one `file:line:function` per line. Frames
/// PyTorch's viewer hides are left out unless `all_frames`.
pub fn stack_text(snapshot: &Snapshot, stack: Option<StackId>, all_frames: bool) -> String {
    let Some(stack) = stack else {
        return "(no stack recorded)".to_owned();
    };
    let mut out = String::new();
    let mut hidden = 0;
    for frame in snapshot.stack_frames(stack) {
        if !all_frames && is_filtered_frame(frame) {
            hidden += 1;
            continue;
        }
        out.push_str(&format!(
            "{}:{}:{}\n",
            frame.filename, frame.line, frame.name
        ));
    }
    if out.is_empty() && hidden == 0 {
        return "(empty stack)".to_owned();
    }
    if hidden > 0 {
        out.push_str(&format!(
            "({hidden} interpreter and dispatcher frames hidden)\n"
        ));
    }
    out
}

/// Label/value lines describing an allocation.
pub fn allocation_facts(model: &TimelineModel<'_>, id: AllocId) -> Vec<(&'static str, String)> {
    let timeline = model.timeline;
    let Some(a) = timeline.replay().get(id) else {
        return vec![("allocation", "not in this device's history".into())];
    };
    let time = |event: Option<u32>| -> String {
        match event {
            None => "–".into(),
            Some(e) => {
                let since = timeline
                    .time()
                    .time_of(e)
                    .zip(timeline.time().time_of(0))
                    .map(|(t, t0)| format!(" ({} after start)", format_duration_us(t - t0)))
                    .unwrap_or_default();
                format!("event {e}{since}")
            }
        }
    };
    let category = model
        .steps
        .categories
        .get(id.0 as usize)
        .map_or("–".to_owned(), |c| c.label().to_owned());
    let phase = match a.alloc_event() {
        None => "before the recorded window".to_owned(),
        Some(event) => match model.steps.phase_at(event) {
            Some((Some(step), p)) => format!("step {step}, {}", phase_label(p.kind)),
            Some((None, p)) => phase_label(p.kind).to_owned(),
            None => "– (no phases found)".to_owned(),
        },
    };
    let mut facts = vec![
        ("size", format_size_exact(a.size)),
        ("site", model.sites.label(model.snapshot, a.stack)),
        ("category", category),
        ("allocated in", phase),
        ("address", format!("{:#x}", a.addr)),
        ("stream", a.stream.to_string()),
        (
            "allocated",
            match a.origin {
                Origin::Traced => time(a.alloc_event()),
                Origin::FreedBeforeAlloc => {
                    "before the recorded window (its free is traced)".into()
                }
                Origin::LiveInSegments => {
                    "before the recorded window (still live at the end)".into()
                }
                Origin::Unattributed => match a.alloc_event() {
                    None => "before the profile (counted by the source, unattributed)".into(),
                    Some(_) => format!(
                        "{} (the source's unattributed memory rose here)",
                        time(a.alloc_event())
                    ),
                },
            },
        ),
        (
            "free requested",
            a.free_requested()
                .map_or("never (live at the end)".into(), |e| time(Some(e))),
        ),
        (
            "free completed",
            a.free_completed().map_or("–".into(), |e| time(Some(e))),
        ),
    ];
    if let (Some(start), Some(end)) = (a.alloc_event(), a.free_completed().or(a.free_requested())) {
        facts.push(("lived", format!("{} events", end.saturating_sub(start))));
    }
    facts
}

/// The card shown while hovering an allocation band.
pub fn hover_card_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>, id: AllocId) {
    facts_grid_ui(ui, model, id, "hover_facts");
    if let Some(a) = model.timeline.replay().get(id) {
        ui.separator();
        let text = stack_text(model.snapshot, a.stack, false);
        let mut lines = text.lines();
        for line in lines.by_ref().take(HOVER_FRAMES) {
            ui.monospace(line);
        }
        if lines.next().is_some() {
            ui.weak("… click to pin and see the full stack");
        }
    }
}

fn facts_grid_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>, id: AllocId, grid_id: &str) {
    egui::Grid::new(grid_id).num_columns(2).show(ui, |ui| {
        for (label, value) in allocation_facts(model, id) {
            ui.weak(label);
            ui.label(value);
            ui.end_row();
        }
    });
}

/// The details side panel: the pinned (or hovered) allocation, else a summary of the device.
pub fn details_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>, selection: &mut Selection) {
    egui::ScrollArea::vertical().show(ui, |ui| {
        let shown = selection.pinned.or(match selection.hovered {
            Some(memsnap_analysis::Hit::Band(id)) => Some(id),
            _ => None,
        });
        match shown {
            Some(id) => allocation_panel_ui(ui, model, selection, id),
            None => device_summary_ui(ui, model),
        }
    });
}

fn allocation_panel_ui(
    ui: &mut egui::Ui,
    model: &TimelineModel<'_>,
    selection: &mut Selection,
    id: AllocId,
) {
    let pinned = selection.pinned == Some(id);
    ui.horizontal(|ui| {
        ui.heading(if pinned {
            "Pinned allocation"
        } else {
            "Allocation"
        });
        if pinned
            && ui
                .small_button("Unpin")
                .on_hover_text("Forget this allocation (Esc)")
                .clicked()
        {
            selection.pinned = None;
        }
    });
    facts_grid_ui(ui, model, id, "pinned_facts");
    let Some(a) = model.timeline.replay().get(id) else {
        return;
    };
    ui.separator();
    ui.horizontal(|ui| {
        ui.strong("Stack");
        if ui
            .small_button("Copy")
            .on_hover_text("Copy the full stack, every frame, to the clipboard")
            .clicked()
        {
            ui.ctx()
                .copy_text(stack_text(model.snapshot, a.stack, true));
        }
    });
    if !pinned {
        ui.weak("Click the band to pin it.");
    }
    let mut text = stack_text(model.snapshot, a.stack, false);
    ui.add(
        egui::TextEdit::multiline(&mut text)
            .font(egui::TextStyle::Monospace)
            .desired_width(f32::INFINITY)
            .interactive(true),
    )
    .on_hover_text("Innermost frame first; select to copy part of it");
}

fn device_summary_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>) {
    let timeline = model.timeline;
    let replay = timeline.replay();
    ui.heading(format!("cuda:{}", timeline.device()));
    egui::Grid::new("device_summary")
        .num_columns(2)
        .show(ui, |ui| {
            let peak = timeline.peak(CurveKind::Allocated);
            let rows = [
                ("trace entries", replay.trace_len.to_string()),
                ("allocations", replay.allocations.len().to_string()),
                (
                    "peak allocated",
                    if replay.allocated_known {
                        format!("{} at event {}", format_size(peak.bytes), peak.event)
                    } else {
                        "unknown: the source records the driver's allocations only (reserved)"
                            .to_owned()
                    },
                ),
                (
                    "peak active",
                    format_size(timeline.peak(CurveKind::Active).bytes),
                ),
                (
                    "peak reserved",
                    if replay.reserved_known() {
                        format_size(timeline.peak(CurveKind::Reserved).bytes)
                    } else {
                        "unknown: the source records no reserved memory".to_owned()
                    },
                ),
                (
                    "before the window",
                    format!(
                        "{} in {} allocations",
                        format_size(replay.before_window_bytes),
                        replay.before_window_allocations
                    ),
                ),
                ("OOM events", replay.oom_events.len().to_string()),
            ];
            for (label, value) in rows {
                ui.weak(label);
                ui.label(value);
                ui.end_row();
            }
        });
    ui.add_space(8.0);
    ui.weak("Hover a band for its size, times and top frames; click to pin it.");
}
