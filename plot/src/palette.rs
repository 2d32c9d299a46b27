//! The colours of every memsnap picture, in one place: one per user-code site (so a call site
//! has the same colour in `memsnap plot`, the viewer's timeline, its segment map and flame
//! graph), one per allocation category and per phase kind, plus the fixed colours of the
//! special bands. Colours are plain sRGBA values; the viewer converts them to egui's type.

use std::fmt;

use memsnap_analysis::{Category, PhaseKind};
use memsnap_format::FrameId;

/// An sRGB colour with straight (not premultiplied) alpha.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Colour {
    pub r: u8,
    pub g: u8,
    pub b: u8,
    pub a: u8,
}

impl Colour {
    pub const fn rgb(r: u8, g: u8, b: u8) -> Colour {
        Colour { r, g, b, a: 255 }
    }

    pub const fn rgba(r: u8, g: u8, b: u8, a: u8) -> Colour {
        Colour { r, g, b, a }
    }

    /// The same colour with `alpha`.
    pub const fn with_alpha(self, a: u8) -> Colour {
        Colour { a, ..self }
    }

    /// Opacity in `0..=1`.
    pub fn opacity(self) -> f32 {
        f32::from(self.a) / 255.0
    }
}

/// `#rrggbb` (the alpha is written separately, as an SVG opacity).
impl fmt::Display for Colour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:02x}{:02x}{:02x}", self.r, self.g, self.b)
    }
}

/// What the colour of an allocation band says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ColourBy {
    /// The user-code site that allocated it (`sites::top_frame` of its stack): one site, one
    /// colour.
    #[default]
    Site,
    /// Its category: parameter, optimizer state, gradient, activation, temporary, unknown.
    Category,
    /// The kind of phase (set-up, forward, backward, optimizer) it was allocated in.
    Phase,
    /// The module path that made it (`memsnap_analysis::modules`: the user `forward`s that
    /// `nn.Module.__call__` entered, outermost first): one path, one colour.
    Module,
}

impl ColourBy {
    pub const ALL: [ColourBy; 4] = [
        ColourBy::Site,
        ColourBy::Category,
        ColourBy::Phase,
        ColourBy::Module,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ColourBy::Site => "site",
            ColourBy::Category => "category",
            ColourBy::Phase => "phase",
            ColourBy::Module => "module",
        }
    }

    pub fn tooltip(self) -> &'static str {
        match self {
            ColourBy::Site => "Colour each allocation by the user-code site that made it (same site, same colour)",
            ColourBy::Category => "Colour each allocation by what it is for: parameter, optimizer state, gradient, activation, temporary",
            ColourBy::Phase => "Colour each allocation by the phase it was allocated in: set-up, forward, backward, optimizer",
            ColourBy::Module => "Colour each allocation by the module path that made it (its named path, such as blocks.0.attn, when recorded with enable(modules=True); else the forwards nn.Module calls entered, by file:line; same path, same colour; grey outside every module)",
        }
    }

    /// The next mode, for the keyboard shortcut that cycles through them.
    pub fn next(self) -> Self {
        match self {
            ColourBy::Site => ColourBy::Category,
            ColourBy::Category => ColourBy::Phase,
            ColourBy::Phase => ColourBy::Module,
            ColourBy::Module => ColourBy::Site,
        }
    }
}

/// Tableau 20, the palette family PyTorch's viewer uses, so colours feel familiar.
const STACK_COLOURS: [Colour; 20] = [
    Colour::rgb(31, 119, 180),
    Colour::rgb(255, 127, 14),
    Colour::rgb(44, 160, 44),
    Colour::rgb(214, 39, 40),
    Colour::rgb(148, 103, 189),
    Colour::rgb(140, 86, 75),
    Colour::rgb(227, 119, 194),
    Colour::rgb(188, 189, 34),
    Colour::rgb(23, 190, 207),
    Colour::rgb(174, 199, 232),
    Colour::rgb(255, 187, 120),
    Colour::rgb(152, 223, 138),
    Colour::rgb(255, 152, 150),
    Colour::rgb(197, 176, 213),
    Colour::rgb(196, 156, 148),
    Colour::rgb(247, 182, 210),
    Colour::rgb(219, 219, 141),
    Colour::rgb(158, 218, 229),
    Colour::rgb(57, 59, 121),
    Colour::rgb(82, 84, 163),
];

/// The swatch that stands for "one colour per site" in a legend.
pub const SITE_SWATCH: Colour = STACK_COLOURS[0];

/// Allocations without a stack (or with an empty one), and allocations outside any phase.
pub const NO_SITE: Colour = Colour::rgb(120, 120, 120);

/// The colour of allocations made at this user-code site (a hash of the frame, so frames
/// next to each other in the table differ).
pub fn site_colour(site: Option<FrameId>) -> Colour {
    match site {
        Some(id) => {
            let h = (id.index() as u64 ^ 0x9e37_79b9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            STACK_COLOURS[((h >> 32) % STACK_COLOURS.len() as u64) as usize]
        }
        None => NO_SITE,
    }
}

/// The colour of allocations made under a module path ([`crate::sites::StackSites::module`]:
/// a hash of the path's frames), [`NO_SITE`] outside every module.
pub fn module_colour(module: Option<u64>) -> Colour {
    match module {
        Some(key) => {
            let h = (key ^ 0x9e37_79b9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            STACK_COLOURS[((h >> 32) % STACK_COLOURS.len() as u64) as usize]
        }
        None => NO_SITE,
    }
}

/// One fixed colour per category, distinct from each other and from the greys of the special
/// bands.
pub fn category_colour(category: Category) -> Colour {
    match category {
        Category::Parameter => Colour::rgb(31, 119, 180),
        Category::OptimizerState => Colour::rgb(148, 103, 189),
        Category::Gradient => Colour::rgb(44, 160, 44),
        Category::Activation => Colour::rgb(255, 127, 14),
        Category::Temporary => Colour::rgb(227, 119, 194),
        Category::Unknown => Colour::rgb(140, 86, 75),
        Category::Input => Colour::rgb(23, 190, 207),
        Category::AutogradDetail => Colour::rgb(188, 189, 34),
    }
}

/// The colour of a phase kind: its slope line, its bands in phase colouring, its legend
/// swatch. Mid tones, legible on both themes.
pub fn phase_colour(kind: PhaseKind) -> Colour {
    match kind {
        PhaseKind::Setup => Colour::rgb(176, 128, 255),
        PhaseKind::Forward => FORWARD_SLOPE,
        PhaseKind::Backward => BACKWARD_SLOPE,
        PhaseKind::Optimizer => Colour::rgb(70, 190, 90),
    }
}

/// The light tint behind the bands over a phase: the phase colour, mostly transparent, so it
/// reads as a tint of the plot background in either theme.
pub fn phase_shade(kind: PhaseKind, dark: bool) -> Colour {
    phase_colour(kind).with_alpha(if dark { 40 } else { 46 })
}

/// The `i`-th of several series (ranks in the overlay): the ten strong Tableau colours in order.
pub fn series_colour(i: usize) -> Colour {
    STACK_COLOURS[i % 10]
}

/// Memory allocated before the recorded window: its own muted colour.
pub fn before_window(dark: bool) -> Colour {
    if dark {
        Colour::rgb(88, 92, 104)
    } else {
        Colour::rgb(176, 180, 192)
    }
}

/// The residual "smaller than X" band.
pub fn residual(dark: bool) -> Colour {
    if dark {
        Colour::rgb(70, 70, 70)
    } else {
        Colour::rgb(205, 205, 205)
    }
}

/// Bands that do not match the search: kept in place so the total stays exact, but faded.
pub fn unmatched(dark: bool) -> Colour {
    if dark {
        Colour::rgb(50, 50, 54)
    } else {
        Colour::rgb(228, 228, 232)
    }
}

/// The reserved-memory outline.
pub fn reserved(dark: bool) -> Colour {
    if dark {
        Colour::rgb(230, 230, 230)
    } else {
        Colour::rgb(30, 30, 30)
    }
}

/// The envelope of spikes shorter than a pixel.
pub fn envelope(dark: bool) -> Colour {
    if dark {
        Colour::rgba(255, 255, 255, 60)
    } else {
        Colour::rgba(0, 0, 0, 50)
    }
}

/// The whole run's total in an overview strip.
pub fn overview(dark: bool) -> Colour {
    if dark {
        Colour::rgb(110, 140, 190)
    } else {
        Colour::rgb(90, 120, 170)
    }
}

/// Training-step marks and their labels.
pub const STEP_MARK: Colour = Colour::rgb(250, 200, 60);
/// The forward and backward slopes (and those phases' colour).
pub const FORWARD_SLOPE: Colour = Colour::rgb(255, 90, 60);
pub const BACKWARD_SLOPE: Colour = Colour::rgb(60, 170, 255);
/// The highlight around a pinned or hovered allocation.
pub const HIGHLIGHT: Colour = Colour::rgb(255, 255, 0);
/// Leaks and warnings.
pub const WARNING: Colour = Colour::rgb(235, 80, 60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_sites_get_different_colours() {
        let distinct: std::collections::HashSet<_> = (0..8)
            .map(|i| site_colour(Some(FrameId::from_index(i))))
            .collect();
        assert!(distinct.len() >= 6, "{}", distinct.len());
        let three = Some(FrameId::from_index(3));
        assert_eq!(site_colour(three), site_colour(three));
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
            Category::ALL.iter().map(|&c| category_colour(c)).collect();
        assert_eq!(categories.len(), Category::ALL.len());
        let kinds = [
            PhaseKind::Setup,
            PhaseKind::Forward,
            PhaseKind::Backward,
            PhaseKind::Optimizer,
        ];
        let phases: std::collections::HashSet<_> = kinds.iter().map(|&k| phase_colour(k)).collect();
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
    fn colour_modes_cycle_through_all_of_them() {
        let mut mode = ColourBy::default();
        assert_eq!(mode, ColourBy::Site);
        let mut seen = Vec::new();
        for _ in 0..ColourBy::ALL.len() {
            seen.push(mode);
            mode = mode.next();
        }
        assert_eq!(mode, ColourBy::Site);
        assert_eq!(seen, ColourBy::ALL);
    }

    #[test]
    fn module_paths_get_colours_and_no_module_is_grey() {
        assert_eq!(module_colour(None), NO_SITE);
        let colours: std::collections::HashSet<Colour> =
            (1..40u64).map(|k| module_colour(Some(k))).collect();
        assert!(colours.len() > 10, "keys spread over the palette");
        assert!(!colours.contains(&NO_SITE));
    }

    #[test]
    fn colours_print_as_svg_hex() {
        assert_eq!(Colour::rgb(255, 0, 16).to_string(), "#ff0010");
    }
}
