//! Keyboard commands. One table drives both the key handling and the help overlay, so the
//! overlay always lists what the keys really do.

use egui::{Key, KeyboardShortcut, Modifiers};

/// Something the user can ask for from the keyboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Open,
    CloseFile,
    NextFile,
    ZoomIn,
    ZoomOut,
    PanLeft,
    PanRight,
    ResetZoom,
    PreviousStep,
    NextStep,
    JumpToPeak,
    Unpin,
    ToggleTheme,
    ToggleHelp,
    ExportPng,
    ExportSvg,
    FocusSearch,
    CycleColorMode,
}

/// Each command with its keys (the first is shown in menus) and what it does.
pub const COMMANDS: &[(Command, &[KeyboardShortcut], &str)] = &[
    (Command::Open, &[cmd(Key::O)], "Open snapshot files"),
    (Command::CloseFile, &[cmd(Key::W)], "Close the current file"),
    (
        Command::NextFile,
        &[cmd(Key::Tab)],
        "Show the next open file",
    ),
    (
        Command::ZoomIn,
        &[key(Key::Plus), key(Key::Equals), key(Key::W)],
        "Zoom in around the centre (or the mouse wheel over the timeline)",
    ),
    (
        Command::ZoomOut,
        &[key(Key::Minus), key(Key::S)],
        "Zoom out",
    ),
    (
        Command::PanLeft,
        &[key(Key::ArrowLeft), key(Key::A)],
        "Pan left (or drag with the left button)",
    ),
    (
        Command::PanRight,
        &[key(Key::ArrowRight), key(Key::D)],
        "Pan right",
    ),
    (
        Command::ResetZoom,
        &[key(Key::Num0), key(Key::Home)],
        "Show the whole run (or double-click the timeline)",
    ),
    (
        Command::PreviousStep,
        &[key(Key::OpenBracket)],
        "Zoom to the previous training step",
    ),
    (
        Command::NextStep,
        &[key(Key::CloseBracket)],
        "Zoom to the next training step",
    ),
    (
        Command::JumpToPeak,
        &[key(Key::P)],
        "Put the instant cursor on the peak",
    ),
    (
        Command::Unpin,
        &[key(Key::Escape)],
        "Unpin the selected allocation, close overlays",
    ),
    (
        Command::ToggleTheme,
        &[cmd(Key::T)],
        "Switch between light and dark theme",
    ),
    (
        Command::ToggleHelp,
        &[key(Key::F1), key(Key::Questionmark)],
        "Show or hide this help",
    ),
    (
        Command::ExportPng,
        &[cmd(Key::E)],
        "Export the window as PNG",
    ),
    (
        Command::ExportSvg,
        &[cmd_shift(Key::E)],
        "Export the timeline as SVG",
    ),
    (
        Command::FocusSearch,
        &[cmd(Key::F)],
        "Search allocations by function or file name",
    ),
    (
        Command::CycleColorMode,
        &[key(Key::C)],
        "Colour bands by user-code site, category, phase or module (cycles)",
    ),
];

/// Mouse gestures, listed in the help overlay after the keys.
pub const GESTURES: &[(&str, &str)] = &[
    ("Wheel / Ctrl+wheel", "Zoom around the mouse"),
    ("Shift+wheel", "Pan"),
    ("Drag", "Pan"),
    ("Right-drag or Shift+drag", "Zoom to the dragged box"),
    ("Click a band", "Pin the allocation and show its full stack"),
    ("Click the overview", "Centre the view there"),
    ("Double-click", "Show the whole run"),
    ("Drop files", "Open them (several files become ranks)"),
];

const fn key(k: Key) -> KeyboardShortcut {
    KeyboardShortcut::new(Modifiers::NONE, k)
}

const fn cmd(k: Key) -> KeyboardShortcut {
    KeyboardShortcut::new(Modifiers::COMMAND, k)
}

const fn cmd_shift(k: Key) -> KeyboardShortcut {
    KeyboardShortcut::new(
        Modifiers {
            alt: false,
            ctrl: false,
            shift: true,
            mac_cmd: false,
            command: true,
        },
        k,
    )
}

/// The shortcut text for a command's first key (`Ctrl+O`), for menus and tooltips.
pub fn shortcut_text(ctx: &egui::Context, command: Command) -> String {
    COMMANDS
        .iter()
        .find(|(c, _, _)| *c == command)
        .and_then(|(_, keys, _)| keys.first())
        .map(|k| ctx.format_shortcut(k))
        .unwrap_or_default()
}

/// The commands pressed this frame. While a text field has focus only commands with a
/// modifier (and Escape) count, so typing in the search box does not zoom.
pub fn pressed(ctx: &egui::Context) -> Vec<Command> {
    let typing = ctx.egui_wants_keyboard_input();
    ctx.input_mut(|input| {
        let mut out = Vec::new();
        // Longer modifier sets first, so Ctrl+Shift+E is not also read as Ctrl+E.
        let mut table: Vec<_> = COMMANDS
            .iter()
            .flat_map(|(c, keys, _)| keys.iter().map(move |k| (*c, *k)))
            .collect();
        table.sort_by_key(|(_, k)| std::cmp::Reverse(modifier_count(k.modifiers)));
        for (command, shortcut) in table {
            let plain = shortcut.modifiers.is_none();
            if typing && plain && shortcut.logical_key != Key::Escape {
                continue;
            }
            if input.consume_shortcut(&shortcut) && !out.contains(&command) {
                out.push(command);
            }
        }
        out
    })
}

fn modifier_count(m: Modifiers) -> usize {
    usize::from(m.alt) + usize::from(m.shift) + usize::from(m.ctrl || m.command || m.mac_cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_is_bound_to_two_commands() {
        let mut seen = Vec::new();
        for (command, keys, _) in COMMANDS {
            for k in *keys {
                assert!(
                    !seen.iter().any(|(_, s)| s == k),
                    "{k:?} bound twice (second: {command:?})"
                );
                seen.push((*command, *k));
            }
        }
    }

    #[test]
    fn every_command_has_a_key_and_a_description() {
        for (command, keys, text) in COMMANDS {
            assert!(!keys.is_empty(), "{command:?} has no key");
            assert!(!text.is_empty(), "{command:?} has no description");
        }
    }
}
