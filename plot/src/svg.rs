//! Writes a [`Scene`] as an SVG document: the one writer behind `memsnap plot` and the
//! viewer's SVG export.

use std::fmt::Write as _;

use crate::palette::Colour;
use crate::scene::{Align, Line, Pos, Rect, Scene, Text};

/// The scene as SVG text. Shapes keep their scene coordinates less the scene's origin.
pub fn write_svg(scene: &Scene) -> String {
    let mut svg = Svg {
        out: String::with_capacity(64 * 1024 + scene.bands.rects.len() * 48),
        origin: scene.origin,
    };
    let (w, h) = (scene.size.x.round(), scene.size.y.round());
    let _ = writeln!(
        svg.out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Ubuntu, sans-serif">"#
    );
    svg.rect(
        Rect::from_min_size(scene.origin, scene.size.x, scene.size.y),
        scene.theme.background,
    );
    if scene.theme.plot_background != scene.theme.background {
        svg.rect(scene.plot, scene.theme.plot_background);
    }
    if let Some(title) = &scene.title {
        svg.text(title);
    }
    // Data is clipped to the plot, so a step that starts before the visible range is cut at
    // the edge instead of being bent.
    let p = svg.at(scene.plot.min);
    let _ = writeln!(
        svg.out,
        r#"<clipPath id="plot-area"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath>"#,
        p.x,
        p.y,
        scene.plot.width(),
        scene.plot.height()
    );
    let overlay = &scene.overlay;
    let _ = writeln!(svg.out, r#"<g clip-path="url(#plot-area)">"#);
    for (rect, colour) in &overlay.shading {
        svg.rect(*rect, *colour);
    }
    let _ = writeln!(svg.out, "</g>");
    for line in &overlay.grid {
        svg.polyline(line);
    }
    for text in &overlay.ticks {
        svg.text(text);
    }
    let _ = writeln!(svg.out, r#"<g clip-path="url(#plot-area)">"#);
    // One path per band (one subpath per step), then the residual band and the envelope.
    let bands = &scene.bands;
    let _ = writeln!(svg.out, r#"<g stroke="none">"#);
    for &(_, start, end) in &bands.bands {
        if let Some((_, colour)) = bands.rects.get(start) {
            svg.path(bands.rects[start..end].iter().map(|(r, _)| r), *colour);
        }
    }
    let _ = writeln!(svg.out, "</g>");
    for range in [
        bands.bands_end..bands.residual_end,
        bands.residual_end..bands.rects.len(),
    ] {
        if let Some((_, colour)) = bands.rects.get(range.start) {
            svg.path(bands.rects[range].iter().map(|(r, _)| r), *colour);
        }
    }
    if let Some(reserved) = &bands.reserved {
        svg.polyline(reserved);
    }
    for mark in overlay.step_marks.iter().filter(|m| !m.crowded) {
        svg.polyline(&mark.line);
    }
    for slope in &overlay.slopes {
        for (colour, width) in [(overlay.halo, 4.0), (slope.colour, 2.0)] {
            svg.polyline(&Line {
                points: vec![slope.from, slope.to],
                colour,
                width,
            });
        }
    }
    for label in &overlay.labels {
        if let Some((rect, colour)) = label.halo {
            svg.rect(rect, colour);
        }
        svg.text(&label.text);
    }
    let _ = writeln!(svg.out, "</g>");
    svg.legend(scene);
    let _ = writeln!(svg.out, "</svg>");
    svg.out
}

struct Svg {
    out: String,
    origin: Pos,
}

impl Svg {
    fn at(&self, p: Pos) -> Pos {
        Pos::new(p.x - self.origin.x, p.y - self.origin.y)
    }

    fn rect(&mut self, rect: Rect, fill: Colour) {
        let p = self.at(rect.min);
        let _ = writeln!(
            self.out,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" {}/>"#,
            p.x,
            p.y,
            rect.width(),
            rect.height(),
            fill_attr(fill)
        );
    }

    fn path<'a>(&mut self, rects: impl Iterator<Item = &'a Rect>, fill: Colour) {
        let _ = write!(self.out, r#"<path d=""#);
        for rect in rects {
            let (a, b) = (self.at(rect.min), self.at(rect.max));
            let _ = write!(
                self.out,
                "M{:.1},{:.1}H{:.1}V{:.1}H{:.1}Z",
                a.x, a.y, b.x, b.y, a.x
            );
        }
        let _ = writeln!(self.out, r#"" {}/>"#, fill_attr(fill));
    }

    fn polyline(&mut self, line: &Line) {
        if line.points.len() < 2 {
            return;
        }
        let _ = write!(self.out, r#"<polyline fill="none" points=""#);
        for p in &line.points {
            let p = self.at(*p);
            let _ = write!(self.out, "{:.1},{:.1} ", p.x, p.y);
        }
        let _ = write!(
            self.out,
            r#"" stroke="{}" stroke-width="{:.1}""#,
            line.colour, line.width
        );
        if line.colour.a < 255 {
            let _ = write!(
                self.out,
                r#" stroke-opacity="{:.3}""#,
                line.colour.opacity()
            );
        }
        let _ = writeln!(self.out, "/>");
    }

    fn text(&mut self, text: &Text) {
        let p = self.at(text.pos);
        let anchor = match text.align.0 {
            Align::Min => "start",
            Align::Center => "middle",
            Align::Max => "end",
        };
        // SVG places text by its baseline.
        let y = match text.align.1 {
            Align::Min => p.y + text.size * 0.9,
            Align::Center => p.y + text.size * 0.35,
            Align::Max => p.y,
        };
        let _ = writeln!(
            self.out,
            r#"<text x="{:.1}" y="{y:.1}" font-size="{:.0}" text-anchor="{anchor}" {}>{}</text>"#,
            p.x,
            text.size,
            fill_attr(text.colour),
            escape(&text.text)
        );
    }

    /// The legend in a row ending at the plot's right edge, in the margin above the plot (below
    /// the title); entries that do not fit the plot's width wrap to a row above.
    fn legend(&mut self, scene: &Scene) {
        let mut top = scene.plot.min.y - 22.0;
        if scene.legend.is_empty() || top < scene.origin.y {
            return;
        }
        let mut x = scene.plot.max.x;
        for entry in scene.legend.iter().rev() {
            let width = 24.0 + 6.5 * entry.label.chars().count() as f32;
            if x - width < scene.plot.min.x && x < scene.plot.max.x && top - 18.0 >= scene.origin.y
            {
                x = scene.plot.max.x;
                top -= 18.0;
            }
            x -= width;
            let swatch = Rect::from_min_size(Pos::new(x, top), 12.0, 12.0);
            self.rect(swatch, entry.swatch);
            if let Some(inner) = entry.inner {
                self.rect(swatch.expand2(-3.0, -3.0), inner);
            }
            self.text(&Text {
                pos: Pos::new(x + 16.0, top + 6.0),
                align: (Align::Min, Align::Center),
                text: entry.label.clone(),
                colour: scene.theme.text,
                size: 12.0,
            });
        }
    }
}

fn fill_attr(c: Colour) -> String {
    if c.a == 255 {
        format!(r#"fill="{c}""#)
    } else {
        format!(r#"fill="{c}" fill-opacity="{:.3}""#, c.opacity())
    }
}

/// Text made safe for SVG.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_makes_text_safe_for_svg() {
        assert_eq!(escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }

    #[test]
    fn translucent_fills_carry_their_opacity() {
        assert_eq!(fill_attr(Colour::rgb(255, 0, 0)), r##"fill="#ff0000""##);
        assert_eq!(
            fill_attr(Colour::rgba(0, 0, 0, 51)),
            r##"fill="#000000" fill-opacity="0.200""##
        );
    }
}
