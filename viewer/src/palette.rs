//! Colours: one per user-code site (so the same call site has the same colour everywhere),
//! one per allocation category and per phase kind, plus the fixed colours of the special bands.

use egui::Color32;
use memsnap_analysis::{Category, PhaseKind};
use memsnap_format::FrameId;

/// What the colour of an allocation band says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ColorMode {
    /// The user-code site that allocated it (`sites::top_frame` of its stack).
    #[default]
    Site,
    /// Its category: parameter, optimizer state, gradient, activation, temporary, unknown.
    Category,
    /// The kind of phase (set-up, forward, backward, optimizer) it was allocated in.
    Phase,
}

impl ColorMode {
    pub const ALL: [ColorMode; 3] = [ColorMode::Site, ColorMode::Category, ColorMode::Phase];

    pub fn label(self) -> &'static str {
        match self {
            ColorMode::Site => "site",
            ColorMode::Category => "category",
            ColorMode::Phase => "phase",
        }
    }

    pub fn tooltip(self) -> &'static str {
        match self {
            ColorMode::Site => "Colour each allocation by the user-code site that made it (same site, same colour)",
            ColorMode::Category => "Colour each allocation by what it is for: parameter, optimizer state, gradient, activation, temporary",
            ColorMode::Phase => "Colour each allocation by the phase it was allocated in: set-up, forward, backward, optimizer",
        }
    }

    /// The next mode, for the keyboard shortcut that cycles through them.
    pub fn next(self) -> Self {
        match self {
            ColorMode::Site => ColorMode::Category,
            ColorMode::Category => ColorMode::Phase,
            ColorMode::Phase => ColorMode::Site,
        }
    }
}

/// Tableau 20, the palette family PyTorch's viewer uses, so colours feel familiar.
const STACK_COLORS: [Color32; 20] = [
    Color32::from_rgb(31, 119, 180),
    Color32::from_rgb(255, 127, 14),
    Color32::from_rgb(44, 160, 44),
    Color32::from_rgb(214, 39, 40),
    Color32::from_rgb(148, 103, 189),
    Color32::from_rgb(140, 86, 75),
    Color32::from_rgb(227, 119, 194),
    Color32::from_rgb(188, 189, 34),
    Color32::from_rgb(23, 190, 207),
    Color32::from_rgb(174, 199, 232),
    Color32::from_rgb(255, 187, 120),
    Color32::from_rgb(152, 223, 138),
    Color32::from_rgb(255, 152, 150),
    Color32::from_rgb(197, 176, 213),
    Color32::from_rgb(196, 156, 148),
    Color32::from_rgb(247, 182, 210),
    Color32::from_rgb(219, 219, 141),
    Color32::from_rgb(158, 218, 229),
    Color32::from_rgb(57, 59, 121),
    Color32::from_rgb(82, 84, 163),
];

/// Allocations without a stack (or with an empty one), and allocations outside any phase.
pub const NO_SITE: Color32 = Color32::from_rgb(120, 120, 120);

/// The colour of allocations made at this user-code site (a hash of the frame, so frames
/// next to each other in the table differ).
pub fn site_color(site: Option<FrameId>) -> Color32 {
    match site {
        Some(FrameId(id)) => {
            let h = (u64::from(id) ^ 0x9e37_79b9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            STACK_COLORS[((h >> 32) % STACK_COLORS.len() as u64) as usize]
        }
        None => NO_SITE,
    }
}

/// One fixed colour per category, distinct from each other and from the greys of the special
/// bands.
pub fn category_color(category: Category) -> Color32 {
    match category {
        Category::Parameter => Color32::from_rgb(31, 119, 180),
        Category::OptimizerState => Color32::from_rgb(148, 103, 189),
        Category::Gradient => Color32::from_rgb(44, 160, 44),
        Category::Activation => Color32::from_rgb(255, 127, 14),
        Category::Temporary => Color32::from_rgb(227, 119, 194),
        Category::Unknown => Color32::from_rgb(140, 86, 75),
    }
}

/// The colour of a phase kind: its slope line, its bands in phase colouring, its legend
/// swatch. Mid tones, legible on both themes.
pub fn phase_color(kind: PhaseKind) -> Color32 {
    match kind {
        PhaseKind::Setup => Color32::from_rgb(176, 128, 255),
        PhaseKind::Forward => FORWARD_SLOPE,
        PhaseKind::Backward => BACKWARD_SLOPE,
        PhaseKind::Optimizer => Color32::from_rgb(70, 190, 90),
    }
}

/// The light tint behind the bands over a phase: the phase colour, mostly transparent, so it
/// reads as a tint of the plot background in either theme.
pub fn phase_shade(kind: PhaseKind, dark: bool) -> Color32 {
    let [r, g, b, _] = phase_color(kind).to_array();
    Color32::from_rgba_unmultiplied(r, g, b, if dark { 40 } else { 46 })
}

/// The `i`-th of several series (ranks in the overlay): the ten strong Tableau colours in order.
pub fn series_color(i: usize) -> Color32 {
    STACK_COLORS[i % 10]
}

/// Memory allocated before the recorded window: its own muted colour.
pub fn before_window(dark: bool) -> Color32 {
    if dark {
        Color32::from_rgb(88, 92, 104)
    } else {
        Color32::from_rgb(176, 180, 192)
    }
}

/// The residual "smaller than X" band.
pub fn residual(dark: bool) -> Color32 {
    if dark {
        Color32::from_rgb(70, 70, 70)
    } else {
        Color32::from_rgb(205, 205, 205)
    }
}

/// Bands that do not match the search: kept in place so the total stays exact, but faded.
pub fn unmatched(dark: bool) -> Color32 {
    if dark {
        Color32::from_rgb(50, 50, 54)
    } else {
        Color32::from_rgb(228, 228, 232)
    }
}

/// The reserved-memory outline.
pub fn reserved(dark: bool) -> Color32 {
    if dark {
        Color32::from_rgb(230, 230, 230)
    } else {
        Color32::from_rgb(30, 30, 30)
    }
}

/// The envelope of spikes shorter than a pixel.
pub fn envelope(dark: bool) -> Color32 {
    if dark {
        Color32::from_rgba_unmultiplied(255, 255, 255, 60)
    } else {
        Color32::from_rgba_unmultiplied(0, 0, 0, 50)
    }
}

/// Training-step markers and slopes.
pub const STEP_MARK: Color32 = Color32::from_rgb(250, 200, 60);
pub const FORWARD_SLOPE: Color32 = Color32::from_rgb(255, 90, 60);
pub const BACKWARD_SLOPE: Color32 = Color32::from_rgb(60, 170, 255);
/// The highlight around a pinned or hovered allocation.
pub const HIGHLIGHT: Color32 = Color32::from_rgb(255, 255, 0);
/// Leaks and warnings.
pub const WARNING: Color32 = Color32::from_rgb(235, 80, 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_sites_get_different_colours() {
        let distinct: std::collections::HashSet<_> =
            (0..8).map(|i| site_color(Some(FrameId(i)))).collect();
        assert!(distinct.len() >= 6, "{}", distinct.len());
        assert_eq!(site_color(Some(FrameId(3))), site_color(Some(FrameId(3))));
    }

    #[test]
    fn categories_and_phases_have_distinct_colours_apart_from_the_special_bands() {
        let special = [
            before_window(true),
            before_window(false),
            residual(true),
            residual(false),
            NO_SITE,
        ];
        let categories: std::collections::HashSet<_> =
            Category::ALL.iter().map(|&c| category_color(c)).collect();
        assert_eq!(categories.len(), Category::ALL.len());
        let kinds = [
            PhaseKind::Setup,
            PhaseKind::Forward,
            PhaseKind::Backward,
            PhaseKind::Optimizer,
        ];
        let phases: std::collections::HashSet<_> = kinds.iter().map(|&k| phase_color(k)).collect();
        assert_eq!(phases.len(), kinds.len());
        for dark in [true, false] {
            let shades: std::collections::HashSet<_> =
                kinds.iter().map(|&k| phase_shade(k, dark)).collect();
            assert_eq!(shades.len(), kinds.len());
        }
        assert!(categories
            .iter()
            .chain(&phases)
            .all(|c| !special.contains(c)));
    }

    #[test]
    fn colour_modes_cycle_through_all_three() {
        let mut mode = ColorMode::default();
        assert_eq!(mode, ColorMode::Site);
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(mode);
            mode = mode.next();
        }
        assert_eq!(mode, ColorMode::Site);
        assert_eq!(seen, ColorMode::ALL);
    }
}
