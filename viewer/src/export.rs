//! Exporting the current view: the window as PNG (from egui's screenshot), the timeline as SVG
//! (from the same geometry the painter draws).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use egui::{Color32, ColorImage, Pos2, Rect};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot write {path}: {what}")]
    Write { path: PathBuf, what: String },
}

/// Writes an egui screenshot as a PNG file.
pub fn write_png(image: &ColorImage, path: &Path) -> Result<(), ExportError> {
    let [w, h] = image.size;
    let mut rgba = Vec::with_capacity(w * h * 4);
    for pixel in &image.pixels {
        rgba.extend_from_slice(&pixel.to_srgba_unmultiplied());
    }
    let fail = |what: String| ExportError::Write {
        path: path.to_owned(),
        what,
    };
    let buffer = image::RgbaImage::from_raw(w as u32, h as u32, rgba)
        .ok_or_else(|| fail("image size does not match its pixels".into()))?;
    buffer
        .save_with_format(path, image::ImageFormat::Png)
        .map_err(|e| fail(e.to_string()))
}

/// A default export file name in the current folder: `memsnap-<name>.<ext>`, not overwriting.
pub fn default_export_path(document_name: &str, extension: &str) -> PathBuf {
    let stem: String = document_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut path = PathBuf::from(format!("memsnap-{stem}.{extension}"));
    let mut n = 1;
    while path.exists() {
        path = PathBuf::from(format!("memsnap-{stem}-{n}.{extension}"));
        n += 1;
    }
    path
}

/// A minimal SVG document builder with the few primitives the timeline uses.
pub struct Svg {
    body: String,
    size: egui::Vec2,
}

impl Svg {
    pub fn new(size: egui::Vec2, background: Color32) -> Self {
        let mut svg = Svg {
            body: String::new(),
            size,
        };
        svg.rect(Rect::from_min_size(Pos2::ZERO, size), background);
        svg
    }

    pub fn rect(&mut self, rect: Rect, fill: Color32) {
        let _ = writeln!(
            self.body,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" {}/>"#,
            rect.min.x,
            rect.min.y,
            rect.width(),
            rect.height(),
            fill_attr(fill)
        );
    }

    pub fn polygon(&mut self, points: &[Pos2], fill: Color32) {
        if points.len() < 3 {
            return;
        }
        let _ = write!(self.body, r#"<polygon points=""#);
        for p in points {
            let _ = write!(self.body, "{:.1},{:.1} ", p.x, p.y);
        }
        let _ = writeln!(self.body, r#"" {}/>"#, fill_attr(fill));
    }

    pub fn polyline(&mut self, points: &[Pos2], stroke: Color32, width: f32) {
        if points.len() < 2 {
            return;
        }
        let _ = write!(self.body, r#"<polyline fill="none" points=""#);
        for p in points {
            let _ = write!(self.body, "{:.1},{:.1} ", p.x, p.y);
        }
        let _ = writeln!(
            self.body,
            r#"" stroke="{}" stroke-opacity="{:.3}" stroke-width="{width:.1}"/>"#,
            hex(stroke),
            f32::from(stroke.a()) / 255.0
        );
    }

    pub fn text(&mut self, pos: Pos2, text: &str, color: Color32, size: f32) {
        let _ = writeln!(
            self.body,
            r#"<text x="{:.1}" y="{:.1}" font-family="sans-serif" font-size="{size:.0}" fill="{}">{}</text>"#,
            pos.x,
            pos.y,
            hex(color),
            escape(text)
        );
    }

    pub fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" viewBox=\"0 0 {w:.0} {h:.0}\">\n{}</svg>\n",
            self.body,
            w = self.size.x,
            h = self.size.y,
        )
    }
}

fn fill_attr(c: Color32) -> String {
    let [r, g, b, a] = c.to_srgba_unmultiplied();
    if a == 255 {
        format!(r##"fill="#{r:02x}{g:02x}{b:02x}""##)
    } else {
        format!(
            r##"fill="#{r:02x}{g:02x}{b:02x}" fill-opacity="{:.3}""##,
            f32::from(a) / 255.0
        )
    }
}

fn hex(c: Color32) -> String {
    let [r, g, b, _] = c.to_srgba_unmultiplied();
    format!("#{r:02x}{g:02x}{b:02x}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_escapes_text_and_writes_shapes() {
        let mut svg = Svg::new(egui::vec2(100.0, 50.0), Color32::WHITE);
        svg.polygon(
            &[
                Pos2::new(0.0, 0.0),
                Pos2::new(10.0, 0.0),
                Pos2::new(10.0, 10.0),
            ],
            Color32::from_rgb(255, 0, 0),
        );
        svg.text(
            Pos2::new(1.0, 2.0),
            "<forward> & more",
            Color32::BLACK,
            12.0,
        );
        let out = svg.finish();
        assert!(out.starts_with("<svg "));
        assert!(out.contains(r##"fill="#ff0000""##));
        assert!(out.contains("&lt;forward&gt; &amp; more"));
        assert!(out.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn png_round_trips_through_the_image_crate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.png");
        let image = ColorImage::new([3, 2], vec![Color32::from_rgb(1, 2, 3); 6]);
        write_png(&image, &path).expect("write");
        let back = image::open(&path).expect("read").to_rgba8();
        assert_eq!(back.dimensions(), (3, 2));
        assert_eq!(back.get_pixel(2, 1).0, [1, 2, 3, 255]);
    }
}
