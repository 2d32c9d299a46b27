//! One open file as a model, free of UI: the decoded snapshot, the analysis of each device
//! (the picture's part built on the loader's job, the steps and profiles following in
//! background [`Job`]s), and what the file says about itself. How it is shown (the device
//! chosen, each panel's state, the pages) is [`crate::document_ui`]'s.

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant as WallInstant};

use memsnap_analysis::compare::DeviceProfile;
use memsnap_analysis::{DeviceTimeline, StepAnalysis, StepOptions};
use memsnap_format::io::Detected;
use memsnap_format::Snapshot;

use crate::job::{self, Job, JobError};
use crate::loader::LoadedSnapshot;
use crate::units::format_size;

/// What the timeline and the allocation details read of one device: borrowed from a
/// [`Document`] and its [`DeviceModel`].
pub struct TimelineModel<'a> {
    pub snapshot: &'a Snapshot,
    pub timeline: &'a DeviceTimeline,
    pub steps: &'a StepAnalysis,
    /// The user-code site of each stack (band colours in [`memsnap_plot::ColourBy::Site`], labels).
    pub sites: &'a memsnap_plot::sites::StackSites,
}

impl TimelineModel<'_> {
    /// What the scene is built from.
    pub fn scene(&self) -> memsnap_plot::scene::SceneModel<'_> {
        memsnap_plot::scene::SceneModel {
            timeline: self.timeline,
            steps: self.steps,
            sites: self.sites,
        }
    }
}

/// Why a file's snapshot cannot be shown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DocumentError {
    /// Every device failed its analysis; `device` is the first of them, `source` why.
    #[error("no device could be analysed (device {device}: {source})")]
    NoDeviceAnalysed {
        device: i64,
        #[source]
        source: memsnap_analysis::AnalysisError,
    },
    #[error("the snapshot has no trace entries and no segments")]
    Empty,
}

/// A result computed after the picture is up: pending, then ready or failed.
#[derive(Debug, Default)]
pub enum Later<T> {
    #[default]
    Pending,
    Ready(T),
    /// Shared: a job that failed as a whole fails every device's result.
    Failed(Arc<JobError>),
}

impl<T> Later<T> {
    pub fn ready(&self) -> Option<&T> {
        match self {
            Later::Ready(value) => Some(value),
            _ => None,
        }
    }

    pub fn error(&self) -> Option<&JobError> {
        match self {
            Later::Failed(e) => Some(&**e),
            _ => None,
        }
    }

    /// Whether it is computed, or failed.
    pub fn is_done(&self) -> bool {
        !matches!(self, Later::Pending)
    }

    fn from_result(result: Result<T, Arc<JobError>>) -> Self {
        match result {
            Ok(value) => Later::Ready(value),
            Err(e) => Later::Failed(e),
        }
    }
}

/// The analysis model of one device: built once, read by every panel.
pub struct DeviceModel {
    pub device: i64,
    pub timeline: Arc<DeviceTimeline>,
    /// Steps, phases and categories: computed after the picture is up (the bands do not need
    /// them; the step marks, phase shading and the steps table appear when they are ready).
    steps: Later<Arc<StepAnalysis>>,
    /// Summary and per-site bytes, for the ranks table and the diff: computed after the
    /// steps (it costs as much as the rest of the analysis), see [`Document::prepare`].
    profile: Later<DeviceProfile>,
}

impl DeviceModel {
    /// The timeline with its drawing indexes: what the first picture needs. The steps follow
    /// ([`DeviceModel::compute_steps`]).
    pub fn build(
        snapshot: &Snapshot,
        device: i64,
    ) -> Result<DeviceModel, memsnap_analysis::AnalysisError> {
        let timeline = DeviceTimeline::build_for_drawing(snapshot, device)?;
        // Found here, on the loading thread: each is an O(n) scan the first time, and the
        // device summary shows them in the first frame.
        for kind in memsnap_analysis::CurveKind::ALL {
            timeline.peak(kind);
        }
        Ok(DeviceModel {
            device,
            timeline: Arc::new(timeline),
            steps: Later::Pending,
            profile: Later::Pending,
        })
    }

    /// The steps, phases and categories; no steps and no categories while they are being
    /// computed or when finding them failed (see [`DeviceModel::steps_ready`],
    /// [`DeviceModel::steps_error`]).
    pub fn steps(&self) -> &StepAnalysis {
        static PENDING: LazyLock<StepAnalysis> = LazyLock::new(pending_steps);
        self.steps.ready().map_or(&PENDING, |s| s)
    }

    /// The steps, shared (pending ones while they are found, as [`Self::steps`]).
    pub fn shared_steps(&self) -> Arc<StepAnalysis> {
        match self.steps.ready() {
            Some(steps) => steps.clone(),
            None => Arc::new(pending_steps()),
        }
    }

    /// Whether the steps are computed (or failed).
    pub fn steps_ready(&self) -> bool {
        self.steps.is_done()
    }

    /// Why the steps could not be found.
    pub fn steps_error(&self) -> Option<&JobError> {
        self.steps.error()
    }

    /// Computes the steps here and now (when they are not yet): benchmarks and tests.
    pub fn compute_steps(&mut self) {
        if !self.steps.is_done() {
            self.steps =
                Later::from_result(find_steps(self.device, &self.timeline).map_err(Arc::new));
        }
    }

    /// The summary and per-site bytes, once computed (`None` before, or when computing it
    /// failed: see [`DeviceModel::profile_error`]).
    pub fn profile(&self) -> Option<&DeviceProfile> {
        self.profile.ready()
    }

    /// Why the profile could not be computed.
    pub fn profile_error(&self) -> Option<&JobError> {
        self.profile.error()
    }

    /// Whether the steps and the profile are computed (or failed).
    pub fn profile_done(&self) -> bool {
        self.steps_ready() && self.profile.is_done()
    }
}

/// No steps, no phases, no categories.
fn pending_steps() -> StepAnalysis {
    StepAnalysis {
        method: memsnap_analysis::StepMethod::None,
        fallback_reason: None,
        setup: None,
        steps: Vec::new(),
        drift: Default::default(),
        categories: Vec::new(),
    }
}

/// The steps of one device; a panic costs only these steps.
fn find_steps(device: i64, timeline: &DeviceTimeline) -> Result<Arc<StepAnalysis>, JobError> {
    job::catch(&format!("finding the steps of device {device}"), || {
        Arc::new(timeline.steps(&StepOptions::default()))
    })
}

/// How the viewer summarises a device for its profile (the ranks table and the diff): as
/// `memsnap summary` does, without the phases' categories, which neither shows (58 MB for a
/// run of 303,030 steps).
pub fn profile_options() -> memsnap_analysis::SummaryOptions {
    memsnap_analysis::SummaryOptions {
        phase_categories: false,
        ..Default::default()
    }
}

/// The profile of one device; a panic costs only this profile.
fn profile(
    snapshot: &Snapshot,
    device: i64,
    timeline: &DeviceTimeline,
    steps: Option<Arc<StepAnalysis>>,
) -> Result<DeviceProfile, JobError> {
    job::catch(&format!("summarising device {device}"), || {
        // The summary's steps are the model's (both `StepOptions::default()`): found once,
        // not again for the summary.
        let options = profile_options();
        match steps {
            Some(steps) => memsnap_analysis::compare::device_profile_with_steps(
                snapshot, timeline, &options, steps,
            ),
            None => memsnap_analysis::compare::device_profile(snapshot, timeline, &options),
        }
    })
}

/// Puts a background job's per-device results in their slots; a job that failed as a whole
/// (no thread) fails every device.
fn fill<'a, T: 'a>(
    slots: impl Iterator<Item = &'a mut Later<T>>,
    result: Result<Vec<Result<T, JobError>>, JobError>,
) {
    match result {
        Ok(results) => {
            for (slot, result) in slots.zip(results) {
                *slot = Later::from_result(result.map_err(Arc::new));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for slot in slots {
                *slot = Later::Failed(e.clone());
            }
        }
    }
}

/// The analysis that follows the first picture, one job at a time: the steps of every device
/// first (the timeline's marks and the steps table wait for them), then the profiles (the
/// ranks table and the diff), which reuse the steps.
enum Background {
    Steps(Job<Vec<Result<Arc<StepAnalysis>, JobError>>>),
    Profiles(Job<Vec<Result<DeviceProfile, JobError>>>),
    Done,
}

/// A file with the device it shows: what the pages comparing files (ranks, diff) read.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    pub document: &'a Document,
    pub device: &'a DeviceModel,
}

/// An open snapshot file.
pub struct Document {
    pub id: u64,
    pub name: String,
    pub path: Option<PathBuf>,
    pub detected: Detected,
    pub file_bytes: u64,
    pub decode_time: Duration,
    pub analysis_time: Duration,
    pub snapshot: Arc<Snapshot>,
    /// The user-code site of every stack (band colours and labels).
    pub sites: memsnap_plot::sites::StackSites,
    /// Devices with a trace or segments, ascending.
    pub devices: Vec<DeviceModel>,
    /// The device to show first: the one with the longest trace, as in PyTorch's viewer.
    pub default_device: usize,
    /// Devices that could not be analysed (the others still show).
    pub device_errors: Vec<String>,
    background: Background,
    /// Asked to redraw when a background job is done.
    repaint: Option<egui::Context>,
}

impl Document {
    /// Builds what the picture of every device needs (runs on the loader's job), and starts
    /// the steps in the background; `repaint` is asked to redraw as they arrive.
    pub fn prepare(
        id: u64,
        loaded: LoadedSnapshot,
        repaint: Option<egui::Context>,
    ) -> Result<Document, DocumentError> {
        let started = WallInstant::now();
        let snapshot = loaded.snapshot;
        let mut devices = Vec::new();
        let mut failures = Vec::new();
        let sites = std::thread::scope(|scope| {
            let sites = scope.spawn(|| memsnap_plot::sites::StackSites::new(&snapshot));
            for device in DeviceTimeline::devices(&snapshot) {
                match DeviceModel::build(&snapshot, device) {
                    Ok(model) => devices.push(model),
                    Err(e) => failures.push((device, e)),
                }
            }
            sites
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        if devices.is_empty() {
            return Err(match failures.into_iter().next() {
                Some((device, source)) => DocumentError::NoDeviceAnalysed { device, source },
                None => DocumentError::Empty,
            });
        }
        let device_errors = failures
            .iter()
            .map(|(device, e)| format!("device {device}: {e}"))
            .collect();
        // PyTorch's viewer starts on the device with the longest trace; so do we.
        let longest = DeviceTimeline::default_device(&snapshot);
        let default_device = devices
            .iter()
            .position(|d| Some(d.timeline.device()) == longest)
            .unwrap_or(0);
        let mut document = Document {
            id,
            name: loaded.name,
            path: loaded.path,
            detected: loaded.detected,
            file_bytes: loaded.file_bytes,
            decode_time: loaded.decode_time,
            analysis_time: started.elapsed(),
            snapshot: Arc::new(snapshot),
            sites,
            devices,
            default_device,
            device_errors,
            background: Background::Done,
            repaint,
        };
        document.start_steps();
        Ok(document)
    }

    fn start_steps(&mut self) {
        let work: Vec<_> = self
            .devices
            .iter()
            .map(|d| (d.device, d.timeline.clone()))
            .collect();
        self.background = Background::Steps(Job::spawn(
            format!("steps of {}", self.name),
            self.repaint.clone(),
            move |_| {
                Ok(work
                    .iter()
                    .map(|(device, timeline)| find_steps(*device, timeline))
                    .collect())
            },
        ));
    }

    fn start_profiles(&mut self) {
        let snapshot = self.snapshot.clone();
        let work: Vec<_> = self
            .devices
            .iter()
            .map(|d| (d.device, d.timeline.clone(), d.steps.ready().cloned()))
            .collect();
        self.background = Background::Profiles(Job::spawn(
            format!("profiles of {}", self.name),
            self.repaint.clone(),
            move |_| {
                Ok(work
                    .iter()
                    .map(|(device, timeline, steps)| {
                        profile(&snapshot, *device, timeline, steps.clone())
                    })
                    .collect())
            },
        ));
    }

    /// Takes what the background jobs have finished, starting the profiles when the steps
    /// are in. With `block`, waits for all of it.
    fn take_background(&mut self, block: bool) {
        loop {
            match std::mem::replace(&mut self.background, Background::Done) {
                Background::Steps(job) => match if block { Some(job.wait()) } else { job.poll() } {
                    Some(result) => {
                        fill(self.devices.iter_mut().map(|d| &mut d.steps), result);
                        self.start_profiles();
                    }
                    None => {
                        self.background = Background::Steps(job);
                        return;
                    }
                },
                Background::Profiles(job) => {
                    match if block { Some(job.wait()) } else { job.poll() } {
                        Some(result) => {
                            fill(self.devices.iter_mut().map(|d| &mut d.profile), result);
                        }
                        None => {
                            self.background = Background::Profiles(job);
                            return;
                        }
                    }
                }
                Background::Done => return,
            }
        }
    }

    /// Takes what the background analysis has finished; the UI calls it once a frame.
    pub fn poll(&mut self) {
        self.take_background(false);
    }

    /// Waits for the steps and profiles of every device (tests, benchmarks, screenshots).
    pub fn wait_for_profiles(&mut self) {
        self.take_background(true);
    }

    /// Whether every device's steps are computed (they follow the first picture).
    pub fn steps_ready(&self) -> bool {
        self.devices.iter().all(DeviceModel::steps_ready)
    }

    /// Whether every device's profile is computed.
    pub fn profiles_ready(&self) -> bool {
        self.devices.iter().all(DeviceModel::profile_done)
    }

    /// A tooltip line about the file.
    pub fn summary(&self) -> String {
        let entries = self.snapshot.entry_count();
        format!(
            "{}\n{} {}{} on disk, {} trace entries, {} device(s)\ndecoded in {:.2} s, analysed in {:.2} s",
            self.path
                .as_ref()
                .map_or(self.name.clone(), |p| p.display().to_string()),
            self.detected.format.name(),
            format_size(self.file_bytes),
            match self.detected.compression {
                memsnap_format::Compression::None => "",
                memsnap_format::Compression::Gzip => " (gzip)",
                memsnap_format::Compression::Zstd => " (zstd)",
            },
            entries,
            self.devices.len(),
            self.decode_time.as_secs_f64(),
            self.analysis_time.as_secs_f64(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_workload::{generate, TrainingRun};

    #[test]
    fn the_picture_is_built_without_the_steps_and_they_arrive_complete() {
        let (snapshot, _) = generate(&TrainingRun::default());
        let mut model = DeviceModel::build(&snapshot, 0).expect("model");
        // What the first picture needs is there; the steps are not yet.
        assert!(!model.timeline.by_size_desc().is_empty());
        assert!(!model.steps_ready());
        assert!(!model.profile_done());
        assert!(model.steps().steps.is_empty() && model.steps().categories.is_empty());
        model.compute_steps();
        assert!(model.steps_ready());
        let expected = model.timeline.steps(&StepOptions::default());
        assert_eq!(model.steps(), &expected);
        assert!(expected.steps.len() >= 3);
        assert_eq!(
            expected.categories.len(),
            model.timeline.replay().allocations.len()
        );
    }
}
