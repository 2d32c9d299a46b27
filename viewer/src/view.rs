//! The visible window of the timeline: zoom, pan and reset as plain arithmetic, so they are
//! tested without a window. Positions are in axis units (event index or microseconds).

/// What the panels share about the allocation in focus: the timeline sets it, the details
/// panel and the "at an instant" page read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// What the pointer is over (this frame).
    pub hovered: Option<memsnap_analysis::Hit>,
    /// The allocation clicked on (its full stack is shown).
    pub pinned: Option<memsnap_analysis::AllocId>,
    /// The instant cursor (an event), for the "At an instant" view.
    pub cursor: Option<u32>,
}

/// The visible x range of a timeline inside the recorded range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimeWindow {
    /// The whole recorded range.
    pub full_start: f64,
    pub full_end: f64,
    /// What is on screen.
    pub start: f64,
    pub end: f64,
    /// Zooming in stops at this span (one event, or one microsecond).
    pub min_span: f64,
}

impl TimeWindow {
    /// A window showing all of `start..end`.
    pub fn new(start: f64, end: f64, min_span: f64) -> Self {
        let end = if end > start {
            end
        } else {
            start + min_span.max(1.0)
        };
        TimeWindow {
            full_start: start,
            full_end: end,
            start,
            end,
            min_span: min_span.max(f64::EPSILON),
        }
    }

    pub fn span(&self) -> f64 {
        self.end - self.start
    }

    pub fn full_span(&self) -> f64 {
        self.full_end - self.full_start
    }

    /// Whether less than the whole range is shown.
    pub fn is_zoomed(&self) -> bool {
        self.span() < self.full_span() * 0.999
    }

    /// Shows the whole range.
    pub fn reset(&mut self) {
        self.start = self.full_start;
        self.end = self.full_end;
    }

    /// Shows `a..b` (in either order), kept inside the full range and at least `min_span` wide.
    pub fn show_range(&mut self, a: f64, b: f64) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let span = (hi - lo).clamp(self.min_span.min(self.full_span()), self.full_span());
        let center = (lo + hi) / 2.0;
        self.start = center - span / 2.0;
        self.end = center + span / 2.0;
        self.clamp_to_full();
    }

    /// Zooms by `factor` (below 1 zooms in) keeping `anchor` at the same screen position.
    pub fn zoom_at(&mut self, anchor: f64, factor: f64) {
        if !factor.is_finite() || factor <= 0.0 {
            return;
        }
        let anchor = anchor.clamp(self.start, self.end);
        let span =
            (self.span() * factor).clamp(self.min_span.min(self.full_span()), self.full_span());
        let t = if self.span() > 0.0 {
            (anchor - self.start) / self.span()
        } else {
            0.5
        };
        self.start = anchor - t * span;
        self.end = self.start + span;
        self.clamp_to_full();
    }

    /// Moves the window by `delta` axis units, stopping at the ends.
    pub fn pan_by(&mut self, delta: f64) {
        self.start += delta;
        self.end += delta;
        self.clamp_to_full();
    }

    /// Moves the window by a fraction of its width (positive moves right).
    pub fn pan_by_fraction(&mut self, fraction: f64) {
        self.pan_by(self.span() * fraction);
    }

    fn clamp_to_full(&mut self) {
        let span = self.span().min(self.full_span());
        if self.start < self.full_start {
            self.start = self.full_start;
            self.end = self.start + span;
        }
        if self.end > self.full_end {
            self.end = self.full_end;
            self.start = self.end - span;
        }
    }

    /// Axis position → x pixel inside `left..left + width`.
    pub fn to_screen(&self, x: f64, left: f32, width: f32) -> f32 {
        left + ((x - self.start) / self.span() * f64::from(width)) as f32
    }

    /// x pixel → axis position.
    pub fn from_screen(&self, px: f32, left: f32, width: f32) -> f64 {
        self.start + f64::from(px - left) / f64::from(width.max(1.0)) * self.span()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zooming_keeps_the_anchor_in_place() {
        let mut w = TimeWindow::new(0.0, 1000.0, 1.0);
        w.zoom_at(250.0, 0.5);
        assert_eq!((w.start, w.end), (125.0, 625.0));
        let px = w.to_screen(250.0, 0.0, 100.0);
        assert!((px - 25.0).abs() < 1e-3, "{px}");
        assert!(w.is_zoomed());
    }

    #[test]
    fn zoom_stops_at_the_minimum_span_and_the_full_range() {
        let mut w = TimeWindow::new(0.0, 1000.0, 10.0);
        for _ in 0..100 {
            w.zoom_at(500.0, 0.5);
        }
        assert!((w.span() - 10.0).abs() < 1e-9, "{}", w.span());
        for _ in 0..100 {
            w.zoom_at(500.0, 2.0);
        }
        assert_eq!((w.start, w.end), (0.0, 1000.0));
        assert!(!w.is_zoomed());
    }

    #[test]
    fn panning_stops_at_the_ends() {
        let mut w = TimeWindow::new(0.0, 1000.0, 1.0);
        w.show_range(100.0, 200.0);
        w.pan_by(-500.0);
        assert_eq!((w.start, w.end), (0.0, 100.0));
        w.pan_by_fraction(100.0);
        assert_eq!((w.start, w.end), (900.0, 1000.0));
        w.reset();
        assert_eq!((w.start, w.end), (0.0, 1000.0));
    }

    #[test]
    fn show_range_accepts_reversed_bounds_and_screen_maps_invert() {
        let mut w = TimeWindow::new(0.0, 1000.0, 1.0);
        w.show_range(600.0, 400.0);
        assert_eq!((w.start, w.end), (400.0, 600.0));
        let x = w.from_screen(w.to_screen(512.0, 10.0, 300.0), 10.0, 300.0);
        assert!((x - 512.0).abs() < 1e-3);
    }

    #[test]
    fn an_empty_range_still_has_a_width() {
        let w = TimeWindow::new(5.0, 5.0, 1.0);
        assert!(w.span() > 0.0);
    }
}
