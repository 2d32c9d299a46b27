//! Exporting the current view: the window as PNG (from egui's screenshot). The timeline's SVG
//! is written by `memsnap_plot::svg` from the scene the frame painted
//! ([`crate::timeline::TimelineState::last_svg`]).

use std::path::{Path, PathBuf};

use egui::ColorImage;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

#[cfg(test)]
mod tests {
    use super::*;
    use egui::Color32;

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
