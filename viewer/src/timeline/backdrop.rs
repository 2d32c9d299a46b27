//! The plot's backdrop: its background, the phase shading, the grid and the allocation bands,
//! composited here into one picture in physical pixels and drawn as one textured rectangle.
//!
//! Why not as shapes: these four layers cover the whole plot, one over the other, and a long
//! run's bands are thousands of thin rectangles. A GPU does not care; a software rasterizer
//! (Mesa's llvmpipe: a VM, a remote desktop, a container without a GPU) pays for every pixel
//! of every layer and more for thin triangles. Drawn as shapes they were more than a third of
//! a frame's time there (1M entries: 12 of 32 ms); as one picture, rebuilt only when one of
//! them changes, the GPU fills the plot once (10M entries: frames p50 34.2 → 23.1 ms).
//!
//! Cost: O(plot pixels + the bands' and shades' pixels) when something changed, on the UI
//! thread (`update`'s p50 while zooming at 10M entries: 1.5 → 2.7 ms); runs of one colour
//! over one colour are blended once.
//!
//! The picture is what the GPU would have drawn: colours are premultiplied and blended in gamma
//! space, as egui blends; a band fills the pixels whose centres it covers (a mesh is not
//! anti-aliased), while the shading and the grid lines cover pixels in proportion to their
//! area (anti-aliased, as egui's feathered shapes are).

use egui::{Color32, ColorImage, Pos2, Rect, TextureHandle, TextureOptions};
use memsnap_plot::scene::Line;

use crate::palette::color32;

/// Everything the backdrop's picture is made from.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct BackdropKey {
    /// Which band geometry: changes each time the bands are laid out again.
    pub(super) bands: u64,
    /// The plot's rectangle, in points.
    pub(super) plot: Rect,
    pub(super) background: Color32,
    pub(super) shading: Vec<(Rect, Color32)>,
    pub(super) grid: Vec<Line>,
    pub(super) pixels_per_point: f32,
    pub(super) max_texture_side: usize,
}

/// The backdrop's textures (one, or tiles when the plot is wider or taller than the GPU's
/// largest texture), kept while its [`BackdropKey`] is unchanged.
pub(super) struct Backdrop {
    key: BackdropKey,
    tiles: Vec<(TextureHandle, Rect)>,
}

impl Backdrop {
    /// The backdrop for `key`: `previous` when made from the same, else composited again
    /// (reusing `previous`'s textures when there are as many tiles).
    pub(super) fn update(
        ctx: &egui::Context,
        previous: Option<Backdrop>,
        key: BackdropKey,
        bands: impl Iterator<Item = (Rect, Color32)>,
    ) -> Backdrop {
        let previous = match previous {
            Some(same) if same.key == key => return same,
            other => other,
        };
        let mut canvas = Canvas::new(key.plot, key.pixels_per_point, key.background);
        for &(r, c) in &key.shading {
            canvas.fill_area(r, c);
        }
        for line in &key.grid {
            canvas.line(line);
        }
        for (r, c) in bands {
            canvas.fill_centres(r, c);
        }
        let tiles = canvas.into_tiles(key.max_texture_side);
        let mut handles = previous
            .map(|p| p.tiles)
            .filter(|t| t.len() == tiles.len())
            .unwrap_or_default()
            .into_iter()
            .map(|(handle, _)| handle);
        let tiles = tiles
            .into_iter()
            .map(|(image, at)| match handles.next() {
                Some(mut handle) => {
                    handle.set(image, TextureOptions::NEAREST);
                    (handle, at)
                }
                None => (
                    ctx.load_texture("timeline backdrop", image, TextureOptions::NEAREST),
                    at,
                ),
            })
            .collect();
        Backdrop { key, tiles }
    }

    pub(super) fn paint(&self, painter: &egui::Painter) {
        let uv = Rect::from_min_max(Pos2::ZERO, Pos2::new(1.0, 1.0));
        for (handle, at) in &self.tiles {
            painter.image(handle.id(), *at, uv, Color32::WHITE);
        }
    }
}

/// Blends each colour of `over` on the pixel of `row` under it, in gamma space with
/// premultiplied alpha: what egui's blending (`ONE, ONE_MINUS_SRC_ALPHA`) does.
///
/// Runs of one colour over one colour (a shade over the background, most of the plot) are
/// blended once.
fn blend_row(row: &mut [Color32], over: impl Iterator<Item = Color32>) {
    let mut last: Option<(Color32, Color32, Color32)> = None;
    for (pixel, top) in row.iter_mut().zip(over) {
        let blended = match last {
            Some((under, on, blended)) if under == *pixel && on == top => blended,
            _ => {
                let blended = blend(*pixel, top);
                last = Some((*pixel, top, blended));
                blended
            }
        };
        *pixel = blended;
    }
}

/// `top` over `under`, premultiplied, in gamma space (as egui's `Color32::blend`).
#[inline]
fn blend(under: Color32, top: Color32) -> Color32 {
    let keep = 255 - u32::from(top.a());
    let channel = |u: u8, t: u8| {
        let kept = (u32::from(u) * keep + 127) / 255;
        (kept + u32::from(t)).min(255) as u8
    };
    Color32::from_rgba_premultiplied(
        channel(under.r(), top.r()),
        channel(under.g(), top.g()),
        channel(under.b(), top.b()),
        channel(under.a(), top.a()),
    )
}

/// A picture being composited over whole physical pixels: those whose centres lie in the plot.
pub(super) struct Canvas {
    /// The picture's first pixel column and row, in physical pixels.
    x0: i64,
    y0: i64,
    width: usize,
    height: usize,
    pixels_per_point: f32,
    pixels: Vec<Color32>,
}

impl Canvas {
    /// A canvas over `plot` (in points), filled with `background`.
    pub(super) fn new(plot: Rect, pixels_per_point: f32, background: Color32) -> Canvas {
        let edge = |v: f32| (v * pixels_per_point).round() as i64;
        let (x0, x1) = (edge(plot.left()), edge(plot.right()));
        let (y0, y1) = (edge(plot.top()), edge(plot.bottom()));
        let width = usize::try_from(x1 - x0).unwrap_or(0);
        let height = usize::try_from(y1 - y0).unwrap_or(0);
        Canvas {
            x0,
            y0,
            width,
            height,
            pixels_per_point,
            pixels: vec![background; width * height],
        }
    }

    /// `a` to `b` (points, either order) in physical pixels from `origin`, clipped to
    /// `0..=len`.
    fn span(&self, a: f32, b: f32, origin: i64, len: usize) -> (f32, f32) {
        let to_pixels = |v: f32| (v * self.pixels_per_point - origin as f32).clamp(0.0, len as f32);
        (to_pixels(a.min(b)), to_pixels(a.max(b)))
    }

    /// Blends `colour` over the pixels whose centres `r` covers (half-open, as GPUs fill
    /// triangles): what a mesh of `r` would paint.
    pub(super) fn fill_centres(&mut self, r: Rect, colour: Color32) {
        let (left, right) = self.span(r.left(), r.right(), self.x0, self.width);
        let (top, bottom) = self.span(r.top(), r.bottom(), self.y0, self.height);
        // Pixel i is covered when lo <= i + 0.5 < hi.
        let first = |lo: f32| (lo - 0.5).ceil().max(0.0) as usize;
        let (x0, x1) = (first(left), first(right));
        let (y0, y1) = (first(top), first(bottom));
        if x0 >= x1 {
            return;
        }
        for y in y0..y1 {
            let row = &mut self.pixels[y * self.width + x0..y * self.width + x1];
            if colour.a() == 255 {
                row.fill(colour);
            } else {
                blend_row(row, std::iter::repeat(colour));
            }
        }
    }

    /// Blends `colour` over `r`, each pixel in proportion to the part of it `r` covers.
    pub(super) fn fill_area(&mut self, r: Rect, colour: Color32) {
        let (left, right) = self.span(r.left(), r.right(), self.x0, self.width);
        let (top, bottom) = self.span(r.top(), r.bottom(), self.y0, self.height);
        if right <= left || bottom <= top {
            return;
        }
        let coverage =
            |i: usize, lo: f32, hi: f32| (hi.min(i as f32 + 1.0) - lo.max(i as f32)).max(0.0);
        let (x0, x1) = (
            left.floor() as usize,
            (right.ceil() as usize).min(self.width),
        );
        let (y0, y1) = (
            top.floor() as usize,
            (bottom.ceil() as usize).min(self.height),
        );
        // The colour of each column at full height, then each row scaled by its own cover.
        let columns: Vec<Color32> = (x0..x1)
            .map(|x| colour.gamma_multiply(coverage(x, left, right)))
            .collect();
        for y in y0..y1 {
            let row_cover = coverage(y, top, bottom);
            let row = &mut self.pixels[y * self.width + x0..y * self.width + x1];
            if row_cover >= 1.0 {
                blend_row(row, columns.iter().copied());
            } else {
                blend_row(row, columns.iter().map(|c| c.gamma_multiply(row_cover)));
            }
        }
    }

    /// A horizontal or vertical line, as the area it covers (a line thinner than a pixel
    /// tints the pixels it crosses in proportion, as egui draws it). Other lines are not
    /// part of the backdrop.
    pub(super) fn line(&mut self, line: &Line) {
        let half = line.width / 2.0;
        let colour = color32(line.colour);
        match line.points.as_slice() {
            [a, b] if a.y == b.y => self.fill_area(
                Rect::from_min_max(
                    Pos2::new(a.x.min(b.x), a.y - half),
                    Pos2::new(a.x.max(b.x), a.y + half),
                ),
                colour,
            ),
            [a, b] if a.x == b.x => self.fill_area(
                Rect::from_min_max(
                    Pos2::new(a.x - half, a.y.min(b.y)),
                    Pos2::new(a.x + half, a.y.max(b.y)),
                ),
                colour,
            ),
            _ => {}
        }
    }

    /// The pixel at canvas column `x`, row `y`.
    #[cfg(test)]
    pub(super) fn pixel(&self, x: usize, y: usize) -> Color32 {
        self.pixels[y * self.width + x]
    }

    /// The picture as images of at most `max_side` pixels a side, each with the rectangle
    /// (in points) it covers.
    pub(super) fn into_tiles(self, max_side: usize) -> Vec<(ColorImage, Rect)> {
        let max_side = max_side.max(1);
        let ppp = self.pixels_per_point;
        let at = |tx: usize, ty: usize, w: usize, h: usize| {
            let point = |x: i64, y: i64| Pos2::new(x as f32 / ppp, y as f32 / ppp);
            let (x, y) = (self.x0 + tx as i64, self.y0 + ty as i64);
            Rect::from_min_max(point(x, y), point(x + w as i64, y + h as i64))
        };
        if self.width == 0 || self.height == 0 {
            return Vec::new();
        }
        if self.width <= max_side && self.height <= max_side {
            let rect = at(0, 0, self.width, self.height);
            return vec![(
                ColorImage::new([self.width, self.height], self.pixels),
                rect,
            )];
        }
        let mut tiles = Vec::new();
        for ty in (0..self.height).step_by(max_side) {
            for tx in (0..self.width).step_by(max_side) {
                let w = max_side.min(self.width - tx);
                let h = max_side.min(self.height - ty);
                let pixels = (ty..ty + h)
                    .flat_map(|y| &self.pixels[y * self.width + tx..y * self.width + tx + w])
                    .copied()
                    .collect();
                tiles.push((ColorImage::new([w, h], pixels), at(tx, ty, w, h)));
            }
        }
        tiles
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKGROUND: Color32 = Color32::from_rgb(10, 20, 30);
    const RED: Color32 = Color32::from_rgb(200, 10, 10);

    fn r(x0: f32, x1: f32, y0: f32, y1: f32) -> Rect {
        Rect::from_x_y_ranges(x0..=x1, y0..=y1)
    }

    /// The canvas' pixels that differ from the background, as (column, row).
    fn painted(canvas: &Canvas) -> Vec<(usize, usize)> {
        (0..canvas.height)
            .flat_map(|y| (0..canvas.width).map(move |x| (x, y)))
            .filter(|&(x, y)| canvas.pixel(x, y) != BACKGROUND)
            .collect()
    }

    #[test]
    fn a_band_fills_exactly_the_pixels_whose_centres_it_covers() {
        let mut canvas = Canvas::new(r(0.0, 10.0, 0.0, 10.0), 1.0, BACKGROUND);
        // Centres 2.5, 3.5, 4.5 are inside 2.0..4.6; rows 1.5 and 2.5 inside 1.4..3.5 (3.5
        // is the edge: half-open, as a GPU fills).
        canvas.fill_centres(r(2.0, 4.6, 1.4, 3.5), RED);
        let expected: Vec<_> = (1..=2).flat_map(|y| (2..=4).map(move |x| (x, y))).collect();
        assert_eq!(painted(&canvas), expected);
        assert!(expected.iter().all(|&(x, y)| canvas.pixel(x, y) == RED));

        // Between pixel centres: nothing, as a mesh of it would paint nothing.
        let mut canvas = Canvas::new(r(0.0, 10.0, 0.0, 10.0), 1.0, BACKGROUND);
        canvas.fill_centres(r(0.6, 1.4, 0.0, 10.0), RED);
        canvas.fill_centres(r(0.0, 10.0, 3.6, 4.4), RED);
        assert!(painted(&canvas).is_empty());
    }

    #[test]
    fn at_two_pixels_a_point_the_canvas_has_twice_the_pixels_each_way() {
        let mut canvas = Canvas::new(r(0.0, 10.0, 0.0, 5.0), 2.0, BACKGROUND);
        assert_eq!((canvas.width, canvas.height), (20, 10));
        // Centres at 0.25, 0.75, … points: 0.6..0.8 covers the one at 0.75.
        canvas.fill_centres(r(0.0, 1.0, 0.6, 0.8), RED);
        assert_eq!(painted(&canvas), vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn shading_tints_each_pixel_in_proportion_to_the_part_it_covers() {
        let shade = Color32::from_rgba_premultiplied(40, 40, 0, 100);
        let mut canvas = Canvas::new(r(0.0, 4.0, 0.0, 2.0), 1.0, BACKGROUND);
        canvas.fill_area(r(0.0, 2.5, 0.0, 2.0), shade);
        let full = BACKGROUND.blend(shade);
        let half = BACKGROUND.blend(shade.gamma_multiply(0.5));
        for y in 0..2 {
            assert_eq!(canvas.pixel(0, y), full);
            assert_eq!(canvas.pixel(1, y), full);
            assert_eq!(canvas.pixel(2, y), half);
            assert_eq!(canvas.pixel(3, y), BACKGROUND);
        }
        // A grid line half a pixel thick over one row tints it by half.
        let grid = memsnap_plot::Colour::rgb(224, 224, 224);
        canvas.line(&Line {
            points: vec![
                memsnap_plot::scene::Pos::new(0.0, 1.5),
                memsnap_plot::scene::Pos::new(4.0, 1.5),
            ],
            colour: grid,
            width: 0.5,
        });
        assert_eq!(
            canvas.pixel(3, 1),
            BACKGROUND.blend(color32(grid).gamma_multiply(0.5))
        );
        assert_eq!(canvas.pixel(3, 0), BACKGROUND);
    }

    #[test]
    fn the_canvas_blends_as_egui_does() {
        let levels = [0u8, 1, 77, 128, 200, 254, 255];
        for &a in &levels {
            for &c in &levels {
                // Premultiplied: no channel above alpha.
                let top = Color32::from_rgba_premultiplied(c.min(a), c.min(a) / 2, 0, a);
                for &u in &levels {
                    let under = Color32::from_rgba_premultiplied(u, 255 - u, u / 3, 255);
                    assert_eq!(
                        blend(under, top),
                        under.blend(top),
                        "{under:?} under {top:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_plot_larger_than_the_largest_texture_is_cut_into_tiles_that_cover_it_once() {
        let mut canvas = Canvas::new(r(10.0, 15.0, 20.0, 23.0), 1.0, BACKGROUND);
        canvas.fill_centres(r(10.0, 15.0, 22.0, 23.0), RED);
        let tiles = canvas.into_tiles(2);
        // 5 x 3 pixels in tiles of at most 2 x 2: 3 columns of tiles by 2 rows.
        assert_eq!(tiles.len(), 6);
        let area: usize = tiles.iter().map(|(image, _)| image.pixels.len()).sum();
        assert_eq!(area, 15);
        let red: usize = tiles
            .iter()
            .map(|(image, _)| image.pixels.iter().filter(|&&p| p == RED).count())
            .sum();
        assert_eq!(red, 5, "the bottom row");
        for (image, at) in &tiles {
            assert_eq!(at.width(), image.size[0] as f32);
            assert_eq!(at.height(), image.size[1] as f32);
            assert!(r(10.0, 15.0, 20.0, 23.0).contains_rect(*at));
        }
        // The bottom-right tile is the single red pixel at (14, 22).
        let (image, at) = &tiles[5];
        assert_eq!((image.size, at.min), ([1, 1], Pos2::new(14.0, 22.0)));
        assert_eq!(image.pixels, vec![RED]);
        // Small enough: one tile, the whole plot.
        let canvas = Canvas::new(r(10.0, 15.0, 20.0, 23.0), 1.0, BACKGROUND);
        let tiles = canvas.into_tiles(2048);
        assert_eq!(tiles.len(), 1);
        assert_eq!(tiles[0].1, r(10.0, 15.0, 20.0, 23.0));
    }
}
