//! "At an instant": the live set at the cursor (or the peak) grouped by stack, frame or file,
//! as a table and a flame graph, or by module path as a collapsible tree; and the segments
//! with their blocks and fragmentation.

use egui::{Color32, Pos2, Rect, Sense, Stroke};
use egui_extras::{Column, TableBuilder};
use memsnap_analysis::{DeviceTimeline, GroupBy, Instant, Lifetime, LiveGroup, SegmentUsage};
use memsnap_format::Snapshot;

use memsnap_plot::sites::StackSites;

use crate::palette;
use crate::units::{format_duration_us, format_size};
use memsnap_analysis::live::{
    flame_tree, segment_blocks, BlockKind, BlockSpan, FlameNode, SegmentBlocks,
};
use memsnap_analysis::modules::{module_tree_at, ModuleNode};

/// What the page reads.
pub struct InstantModel<'a> {
    pub snapshot: &'a Snapshot,
    /// The user-code site of each stack, so blocks have their timeline band's colour.
    pub sites: &'a StackSites,
    pub timeline: &'a DeviceTimeline,
    pub at: Instant,
    /// The size filter of the timeline: smaller allocations are left out of the live set.
    pub min_size: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LiveSetTab {
    #[default]
    Table,
    FlameGraph,
    /// The live set by module path, as a collapsible tree.
    Modules,
}

/// The page's state, with the derived data cached for the instant it was computed at.
#[derive(Default)]
pub struct InstantState {
    pub group_by: GroupBy,
    pub tab: LiveSetTab,
    cache: Option<InstantCache>,
}

struct InstantCache {
    key: (u32, GroupBy, u64),
    groups: Vec<LiveGroup>,
    flame: FlameNode,
    /// [`flame_depth`] of `flame`, found once (it walked the whole tree every frame).
    flame_depth: usize,
    segments: Vec<SegmentBlocks>,
    usage: Vec<SegmentUsage>,
    /// The module tree, found the first time the tab shows it at this instant.
    modules: Option<Vec<ModuleNode>>,
}

impl InstantState {
    fn data(&mut self, model: &InstantModel<'_>) -> &InstantCache {
        let event = model.timeline.resolve(model.at);
        let key = (event, self.group_by, model.min_size);
        if self.cache.as_ref().is_none_or(|c| c.key != key) {
            let at = Instant::Event(event);
            let flame = flame_tree(
                model.snapshot,
                model.timeline,
                at,
                Lifetime::Active,
                model.min_size,
            );
            self.cache = Some(InstantCache {
                key,
                flame_depth: flame_depth(&flame),
                flame,
                groups: model.timeline.live_groups(
                    model.snapshot,
                    at,
                    Lifetime::Active,
                    self.group_by,
                    model.min_size,
                ),
                segments: segment_blocks(model.timeline, at),
                usage: model.timeline.fragmentation(at),
                modules: None,
            });
        }
        if self.tab == LiveSetTab::Modules {
            if let Some(cache) = self.cache.as_mut().filter(|c| c.modules.is_none()) {
                cache.modules = Some(module_tree_at(
                    model.snapshot,
                    model.timeline,
                    event,
                    Lifetime::Active,
                    model.min_size,
                ));
            }
        }
        self.cache.as_ref().expect("filled above")
    }
}

/// The whole page.
pub fn instant_ui(ui: &mut egui::Ui, model: &InstantModel<'_>, state: &mut InstantState) {
    let event = model.timeline.resolve(model.at);
    let when = match model
        .timeline
        .time()
        .time_of(event)
        .zip(model.timeline.time().time_of(0))
    {
        Some((t, t0)) => format!("event {event}, {} after start", format_duration_us(t - t0)),
        None => format!("event {event}"),
    };
    let what = if matches!(model.at, Instant::Peak) {
        "At the peak"
    } else {
        "At the cursor"
    };
    ui.horizontal(|ui| {
        ui.heading(format!("{what}: {when}"));
        ui.weak("(click the timeline to move the cursor, P for the peak)");
    });
    let group_by_before = state.group_by;
    let tab_before = state.tab;
    ui.horizontal(|ui| {
        ui.label("Group by");
        for (g, label, tip) in [
            (GroupBy::Stack, "stack", "One row per distinct stack"),
            (
                GroupBy::Frame,
                "frame",
                "One row per allocating frame (the innermost user frame)",
            ),
            (
                GroupBy::File,
                "file",
                "One row per source file of the allocating frame",
            ),
        ] {
            ui.selectable_value(&mut state.group_by, g, label)
                .on_hover_text(tip);
        }
        ui.separator();
        ui.selectable_value(&mut state.tab, LiveSetTab::Table, "table")
            .on_hover_text("The live set as a table, biggest group first");
        ui.selectable_value(&mut state.tab, LiveSetTab::FlameGraph, "flame graph")
            .on_hover_text(
                "The live set as a flame graph: outermost frame at the top, width = bytes",
            );
        ui.selectable_value(&mut state.tab, LiveSetTab::Modules, "module tree")
            .on_hover_text(
                "The live set by module path (the forwards nn.Module calls entered, by file:line), largest first; expand a module for the calls inside it",
            );
    });
    let _ = (group_by_before, tab_before);
    let tab = state.tab;
    let data = state.data(model);
    let total: u64 = data.groups.iter().map(|g| g.bytes).sum();
    egui::Panel::right("segments_panel")
        .resizable(true)
        .default_size(ui.available_width() * 0.45)
        .show(ui, |ui| segments_ui(ui, model, &data.segments, &data.usage));
    egui::CentralPanel::default().show(ui, |ui| {
        ui.label(format!(
            "{} live in {} groups{}",
            format_size(total),
            data.groups.len(),
            if model.min_size > 0 {
                format!(
                    " (allocations smaller than {} left out)",
                    format_size(model.min_size)
                )
            } else {
                String::new()
            }
        ));
        match tab {
            LiveSetTab::Table => live_table_ui(ui, model, &data.groups, total),
            LiveSetTab::FlameGraph => {
                flame_graph_ui(ui, model.snapshot, &data.flame, data.flame_depth)
            }
            LiveSetTab::Modules => {
                let nodes = data.modules.as_deref().unwrap_or_default();
                egui::ScrollArea::vertical()
                    .id_salt("module_tree")
                    .show(ui, |ui| module_tree_ui(ui, nodes, total));
            }
        }
    });
}

fn live_table_ui(ui: &mut egui::Ui, model: &InstantModel<'_>, groups: &[LiveGroup], total: u64) {
    let row_height = ui.text_style_height(&egui::TextStyle::Body) + 4.0;
    TableBuilder::new(ui)
        .id_salt("live_set_table")
        .striped(true)
        .column(Column::remainder().at_least(200.0).clip(true))
        .column(Column::auto().at_least(80.0))
        .column(Column::auto().at_least(50.0))
        .column(Column::auto().at_least(80.0))
        .column(Column::auto().at_least(50.0))
        .header(row_height, |mut header| {
            for (title, tip) in [
                ("site", "Where the allocations were made"),
                ("bytes", "Bytes live at this instant"),
                ("count", "Allocations live at this instant"),
                ("largest", "The largest of them"),
                ("share", "Share of the live bytes"),
            ] {
                header.col(|ui| {
                    ui.strong(title).on_hover_text(tip);
                });
            }
        })
        .body(|body| {
            body.rows(row_height, groups.len(), |mut row| {
                let g = &groups[row.index()];
                row.col(|ui| {
                    let label = g.key.label(model.snapshot);
                    let response = ui
                        .add(egui::Label::new(egui::RichText::new(&label).monospace()).truncate());
                    if let memsnap_analysis::SiteKey::Stack(stack) = g.key {
                        response.on_hover_ui(|ui| {
                            ui.monospace(crate::details_ui::stack_text(
                                model.snapshot,
                                Some(stack),
                                false,
                            ));
                        });
                    } else {
                        response.on_hover_text(label);
                    }
                });
                row.col(|ui| {
                    ui.label(format_size(g.bytes));
                });
                row.col(|ui| {
                    ui.label(g.count.to_string());
                });
                row.col(|ui| {
                    ui.label(format_size(g.largest));
                });
                row.col(|ui| {
                    ui.label(format!(
                        "{:.1}%",
                        g.bytes as f64 * 100.0 / total.max(1) as f64
                    ));
                });
            });
        });
}

/// Rows drawn for one level of the module tree; the rest are summed in one line.
const MODULE_ROWS: usize = 50;

/// The module tree: one collapsible row per module path (bytes, share of the live bytes,
/// allocations), its calls inside it, largest first. Only expanded nodes are drawn.
fn module_tree_ui(ui: &mut egui::Ui, nodes: &[ModuleNode], total: u64) {
    if nodes.is_empty() {
        ui.label("Nothing live at this instant.");
        return;
    }
    for node in nodes.iter().take(MODULE_ROWS) {
        let text = format!(
            "{}  {}  ({:.1}%, {} allocations)",
            format_size(node.bytes),
            node.label,
            node.bytes as f64 * 100.0 / total.max(1) as f64,
            node.count
        );
        if node.children.is_empty() {
            ui.horizontal(|ui| {
                ui.add_space(ui.spacing().indent);
                ui.monospace(text).on_hover_text(&node.path);
            });
        } else {
            egui::CollapsingHeader::new(egui::RichText::new(text).monospace())
                .id_salt(&node.path)
                .show(ui, |ui| {
                    if node.own_bytes > 0 {
                        ui.weak(format!(
                            "{} made in {} itself",
                            format_size(node.own_bytes),
                            node.label
                        ));
                    }
                    module_tree_ui(ui, &node.children, total);
                })
                .header_response
                .on_hover_text(&node.path);
        }
    }
    if nodes.len() > MODULE_ROWS {
        let rest: u64 = nodes[MODULE_ROWS..].iter().map(|n| n.bytes).sum();
        ui.weak(format!(
            "{} more, {}",
            nodes.len() - MODULE_ROWS,
            format_size(rest)
        ));
    }
}

/// An icicle-style flame graph: the root on top, children below, width proportional to bytes.
/// `depth`: `flame_depth` of `root`.
pub fn flame_graph_ui(ui: &mut egui::Ui, snapshot: &Snapshot, root: &FlameNode, depth: usize) {
    let row = 18.0;
    let width = ui.available_width();
    let (rect, response) = ui.allocate_exact_size(
        egui::vec2(width, (depth as f32 + 1.0) * row),
        Sense::hover(),
    );
    let painter = ui.painter_at(rect);
    let font = egui::FontId::monospace(11.0);
    let mut hovered: Option<(String, u64, u64)> = None;
    let pointer = response.hover_pos();
    let mut stack: Vec<(&FlameNode, f32, f32, usize)> = vec![(root, rect.left(), width, 0)];
    while let Some((node, x, w, level)) = stack.pop() {
        if w < 1.0 || level > 60 {
            continue;
        }
        let r = Rect::from_min_size(
            Pos2::new(x, rect.top() + level as f32 * row),
            egui::vec2(w, row - 1.0),
        );
        let (label, color) = match node.frame {
            Some(f) => {
                let frame = snapshot.frames.get(f);
                (
                    format!("{}:{}:{}", frame.basename(), frame.line, frame.name),
                    palette::color32(palette::site_colour(Some(f))),
                )
            }
            None => ("all live memory".to_owned(), Color32::GRAY),
        };
        painter.rect_filled(r, 1.0, color);
        if w > 40.0 {
            painter.with_clip_rect(r).text(
                r.left_center() + egui::vec2(3.0, 0.0),
                egui::Align2::LEFT_CENTER,
                &label,
                font.clone(),
                Color32::BLACK,
            );
        }
        if pointer.is_some_and(|p| r.contains(p)) {
            hovered = Some((label, node.bytes, node.count));
            painter.rect_stroke(
                r,
                1.0,
                Stroke::new(1.5, palette::color32(palette::HIGHLIGHT)),
                egui::StrokeKind::Inside,
            );
        }
        let mut cx = x;
        for child in &node.children {
            let cw = w * (child.bytes as f64 / node.bytes.max(1) as f64) as f32;
            stack.push((child, cx, cw, level + 1));
            cx += cw;
        }
    }
    response.widget_info(|| {
        egui::WidgetInfo::labeled(
            egui::Role::Image,
            true,
            format!("Flame graph of {} live", format_size(root.bytes)),
        )
    });
    if let Some((label, bytes, count)) = hovered {
        response.on_hover_ui_at_pointer(|ui| {
            ui.monospace(label);
            ui.label(format!("{} in {count} allocations", format_size(bytes)));
        });
    }
}

/// Levels the flame graph's height is sized for, at most.
const FLAME_LEVELS: usize = 60;

/// The tree's levels (the root's included), at most [`FLAME_LEVELS`]: O(nodes in those
/// levels), without recursion (a tree is as deep as the file's deepest stack).
fn flame_depth(root: &FlameNode) -> usize {
    let mut depth = 1;
    let mut level: Vec<&FlameNode> = vec![root];
    while depth < FLAME_LEVELS {
        let next: Vec<&FlameNode> = level.iter().flat_map(|n| &n.children).collect();
        if next.is_empty() {
            break;
        }
        depth += 1;
        level = next;
    }
    depth
}

/// Each segment as a bar of its blocks: allocated (coloured by stack), pending free (red) and
/// free (background), with fragmentation numbers.
fn segments_ui(
    ui: &mut egui::Ui,
    model: &InstantModel<'_>,
    segments: &[SegmentBlocks],
    usage: &[SegmentUsage],
) {
    let reserved: u64 = usage.iter().map(|u| u.size).sum();
    let allocated: u64 = usage.iter().map(|u| u.allocated_bytes).sum();
    let free: u64 = usage.iter().map(|u| u.free_bytes).sum();
    let largest_free = usage
        .iter()
        .map(|u| u.largest_free_block)
        .max()
        .unwrap_or(0);
    ui.heading(format!("Segments: {}", usage.len()));
    ui.label(format!(
        "{} reserved, {} allocated, {} free; largest free block {}",
        format_size(reserved),
        format_size(allocated),
        format_size(free),
        format_size(largest_free)
    ));
    let fragmentation = if free > 0 {
        100.0 * (1.0 - largest_free as f64 / free as f64)
    } else {
        0.0
    };
    ui.label(format!(
        "fragmentation {fragmentation:.1}% (1 − largest free block ÷ free)"
    ))
    .on_hover_text(
        "0% when all free memory is one block; near 100% when it is scattered in small gaps",
    );
    ui.horizontal(|ui| {
        legend(ui, Color32::from_rgb(31, 119, 180), "allocated");
        legend(ui, palette::color32(palette::WARNING), "pending free");
        legend(ui, ui.visuals().extreme_bg_color, "free (cached)");
    });
    ui.separator();
    let largest = segments.iter().map(|s| s.size).max().unwrap_or(1).max(1);
    egui::ScrollArea::vertical().show(ui, |ui| {
        for (segment, use_) in segments.iter().zip(usage) {
            let width = ui.available_width();
            let w = (width * (segment.size as f64 / largest as f64) as f32).max(4.0);
            let (rect, response) = ui.allocate_exact_size(egui::vec2(width, 14.0), Sense::hover());
            if !ui.is_rect_visible(rect) {
                // Scrolled out of view: its space is kept, nothing is drawn.
                continue;
            }
            let bar = Rect::from_min_size(rect.min, egui::vec2(w, 12.0));
            let painter = ui.painter_at(rect);
            painter.rect_filled(bar, 0.0, ui.visuals().extreme_bg_color);
            let scale = f64::from(w) / segment.size.max(1) as f64;
            let colour_of = |block: &BlockSpan| match block.kind {
                BlockKind::Allocated => palette::color32(palette::site_colour(
                    model
                        .sites
                        .site(model.timeline.replay().get(block.alloc).and_then(|a| a.stack)),
                )),
                BlockKind::PendingFree => palette::color32(palette::WARNING),
            };
            let spans = segment.blocks.iter().map(|block| {
                let x0 = bar.left() + ((block.addr - segment.addr) as f64 * scale) as f32;
                let x1 = x0 + ((block.size as f64 * scale) as f32).max(1.0);
                (x0, x1.min(bar.right()), block)
            });
            for (x0, x1, color) in merged_spans(spans, colour_of) {
                painter.rect_filled(Rect::from_x_y_ranges(x0..=x1, bar.y_range()), 0.0, color);
            }
            painter.rect_stroke(bar, 0.0, Stroke::new(0.5, ui.visuals().weak_text_color()), egui::StrokeKind::Inside);
            response.on_hover_ui(|ui| {
                ui.label(format!(
                    "segment {:#x}: {} reserved, {} allocated in {} blocks, {} free, largest free block {} (stream {})",
                    segment.addr,
                    format_size(segment.size),
                    format_size(use_.allocated_bytes),
                    use_.allocations,
                    format_size(use_.free_bytes),
                    format_size(use_.largest_free_block),
                    segment.stream
                ));
            });
        }
    });
}

/// The rectangles that draw a segment's blocks (`(x0, x1, block)` in address order): a block
/// inside a pixel a rectangle already covers adds nothing (the first block of a pixel gives
/// its colour), and touching blocks of one colour are one rectangle. So a segment of 100,000
/// small blocks is at most a rectangle per pixel column, not one per block. O(blocks),
/// colouring only the blocks drawn.
fn merged_spans<'b, B: 'b>(
    spans: impl Iterator<Item = (f32, f32, &'b B)>,
    colour_of: impl Fn(&B) -> Color32,
) -> Vec<(f32, f32, Color32)> {
    let mut out: Vec<(f32, f32, Color32)> = Vec::new();
    for (x0, x1, block) in spans {
        if let Some(last) = out.last_mut() {
            if x1 <= last.1.floor() + 1.0 {
                // Within the pixel the last rectangle ends in.
                last.1 = last.1.max(x1);
                continue;
            }
            let colour = colour_of(block);
            if colour == last.2 && x0 <= last.1 + 0.5 {
                last.1 = x1;
                continue;
            }
            out.push((x0, x1, colour));
        } else {
            out.push((x0, x1, colour_of(block)));
        }
    }
    out
}

fn legend(ui: &mut egui::Ui, color: Color32, label: &str) {
    let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), Sense::hover());
    ui.painter().rect_filled(rect, 2.0, color);
    ui.label(label);
}

#[cfg(test)]
mod segment_bar_tests {
    use super::*;

    /// What broke: a segment bar drew a rectangle per live block, so a run that keeps a small
    /// block every step (160,000 of them at 10M entries) pushed that many shapes every frame.
    #[test]
    fn a_segment_of_many_small_blocks_is_at_most_a_rectangle_per_pixel() {
        let colours = [Color32::RED, Color32::BLUE];
        // 100,000 blocks of alternating colours over 1,000 pixels.
        let blocks: Vec<(f32, f32, usize)> = (0..100_000)
            .map(|i| {
                let x0 = i as f32 / 100.0;
                (x0, x0 + 1.0, i % 2)
            })
            .collect();
        let spans = merged_spans(blocks.iter().map(|(a, b, c)| (*a, *b, c)), |&c| colours[c]);
        assert!(spans.len() <= 1_001, "{} rectangles", spans.len());
        // They cover the bar, left to right.
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(spans.last().map(|s| s.1), Some(999.99 + 1.0));
    }

    #[test]
    fn touching_blocks_of_one_colour_are_one_rectangle_and_a_gap_keeps_them_apart() {
        let spans = merged_spans(
            [
                (0.0, 10.0, &0),
                (10.0, 20.0, &0),
                (40.0, 50.0, &0),
                (50.0, 60.0, &1),
            ]
            .into_iter(),
            |&c| [Color32::RED, Color32::BLUE][c],
        );
        assert_eq!(
            spans,
            [
                (0.0, 20.0, Color32::RED),
                (40.0, 50.0, Color32::RED),
                (50.0, 60.0, Color32::BLUE)
            ]
        );
    }
}
