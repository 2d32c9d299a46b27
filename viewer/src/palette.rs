//! Colours: one per stack (so the same call site has the same colour everywhere), plus the
//! fixed colours of the special bands.

use egui::Color32;
use memsnap_format::StackId;

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

/// The colour of allocations with this stack (a hash, so ids next to each other differ).
pub fn stack_color(stack: Option<StackId>) -> Color32 {
    match stack {
        Some(StackId(id)) => {
            let h = (u64::from(id) ^ 0x9e37_79b9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            STACK_COLORS[((h >> 32) % STACK_COLORS.len() as u64) as usize]
        }
        None => Color32::from_rgb(120, 120, 120),
    }
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
    fn neighbouring_stacks_get_different_colours() {
        let distinct: std::collections::HashSet<_> =
            (0..8).map(|i| stack_color(Some(StackId(i)))).collect();
        assert!(distinct.len() >= 6, "{}", distinct.len());
        assert_eq!(stack_color(Some(StackId(3))), stack_color(Some(StackId(3))));
    }
}
