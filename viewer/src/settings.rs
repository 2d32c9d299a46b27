//! What the viewer remembers between runs: theme, recent files, preferred axis.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How many recent files File > Open Recent lists.
pub const MAX_RECENT: usize = 10;

/// The storage key under which eframe keeps [`Settings`].
pub const STORAGE_KEY: &str = "memsnap-viewer-settings";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThemeChoice {
    #[default]
    Dark,
    Light,
}

impl ThemeChoice {
    pub fn toggled(self) -> Self {
        match self {
            ThemeChoice::Dark => ThemeChoice::Light,
            ThemeChoice::Light => ThemeChoice::Dark,
        }
    }

    pub fn egui_theme(self) -> egui::Theme {
        match self {
            ThemeChoice::Dark => egui::Theme::Dark,
            ThemeChoice::Light => egui::Theme::Light,
        }
    }
}

/// Persisted settings. `#[serde(default)]` so a field added later does not reset the rest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub theme: ThemeChoice,
    /// Most recent first.
    pub recent_files: Vec<PathBuf>,
    /// Plot against wall time (when the trace has times) instead of the event index.
    pub wall_time_axis: bool,
}

impl Settings {
    /// Puts `path` first in the recent list, dropping an older copy and the oldest beyond
    /// [`MAX_RECENT`].
    pub fn remember(&mut self, path: &Path) {
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        self.recent_files.retain(|p| *p != path);
        self.recent_files.insert(0, path);
        self.recent_files.truncate(MAX_RECENT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_files_are_most_recent_first_without_duplicates() {
        let mut s = Settings::default();
        for i in 0..(MAX_RECENT + 3) {
            s.remember(Path::new(&format!("/no/such/{i}.pickle")));
        }
        s.remember(Path::new("/no/such/5.pickle"));
        assert_eq!(s.recent_files.len(), MAX_RECENT);
        assert_eq!(s.recent_files[0], Path::new("/no/such/5.pickle"));
        assert_eq!(
            s.recent_files
                .iter()
                .filter(|p| p.ends_with("5.pickle"))
                .count(),
            1
        );
    }

    #[test]
    fn settings_missing_fields_fall_back_to_defaults() {
        let s: Settings = serde_json::from_str(r#"{"theme":"Light"}"#).expect("parse");
        assert_eq!(s.theme, ThemeChoice::Light);
        assert!(s.recent_files.is_empty());
    }
}
