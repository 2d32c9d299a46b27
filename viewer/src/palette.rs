//! The colours of the viewer: the palette of `memsnap-plot` (so a site, a category or a phase
//! has the same colour here as in `memsnap plot`), converted to egui's colour type.

use egui::Color32;
pub use memsnap_plot::palette::*;

/// A palette colour as egui's (premultiplied) colour.
pub fn color32(c: Colour) -> Color32 {
    Color32::from_rgba_unmultiplied(c.r, c.g, c.b, c.a)
}

/// An egui colour as a palette colour (the scene takes the theme's colours from egui).
pub fn colour(c: Color32) -> Colour {
    let [r, g, b, a] = c.to_srgba_unmultiplied();
    Colour::rgba(r, g, b, a)
}
