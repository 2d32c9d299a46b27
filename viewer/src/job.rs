//! Background work: the one way the viewer runs anything off the UI thread (loading a file,
//! finding the steps and profiles, simulating the allocator, receiving a live recording and
//! rebuilding its document: see [`crate::live`], whose receiver is a job that lasts as long
//! as its connection).
//!
//! A [`Job`] is a piece of work on its own named thread. The work and the UI share a
//! [`Progress`]: the work reports a stage and how far it is, and reads the cancel flag the UI
//! sets. A panic in the work costs that job only: it comes back as
//! [`JobError::Panicked`], like any other failure, never as a crashed window. When the
//! result is ready the job asks egui for a repaint, and the UI thread picks it up with
//! [`Job::poll`]; no frame ever waits for a job.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::{mpsc, Mutex};
use std::time::Instant;

/// Why a job gave no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError<E = Infallible> {
    /// The work panicked; `message` is the panic's text.
    #[error("{what} failed unexpectedly: {message}")]
    Panicked { what: String, message: String },
    /// The UI asked the job to stop, and it did.
    #[error("{what} was cancelled")]
    Cancelled { what: String },
    /// No thread could be started for the work.
    #[error("cannot start a thread for {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The work reported an error of its own.
    #[error(transparent)]
    Failed(E),
}

/// What a job's work and the UI share: the stage and how far the work is in it, and whether
/// the UI asked it to stop. The work polls [`Progress::is_cancelled`] where stopping is cheap.
#[derive(Debug)]
pub struct Progress {
    done: AtomicU64,
    total: AtomicU64,
    stage: Mutex<&'static str>,
    cancelled: AtomicBool,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            stage: Mutex::new("starting"),
            cancelled: AtomicBool::new(false),
        }
    }
}

impl Progress {
    /// Enters `stage` with `done` of `total` units (0 of 0: how far is unknown).
    pub fn set(&self, stage: &'static str, done: u64, total: u64) {
        if let Ok(mut s) = self.stage.lock() {
            *s = stage;
        }
        self.done.store(done, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    /// What the work is doing now ("decoding", ...).
    pub fn stage(&self) -> &'static str {
        self.stage.lock().map_or("working", |s| *s)
    }

    /// Fraction done in the current stage, or `None` when unknown.
    pub fn fraction(&self) -> Option<f32> {
        let total = self.total.load(Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed);
        (total > 0).then(|| (done as f64 / total as f64).clamp(0.0, 1.0) as f32)
    }

    /// Asks the work to stop.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether the UI asked the work to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// A piece of work on its own thread, polled by the UI.
pub struct Job<T, E = Infallible> {
    what: String,
    started: Instant,
    progress: Arc<Progress>,
    receiver: mpsc::Receiver<Result<T, JobError<E>>>,
}

impl<T: Send + 'static, E: Send + 'static> Job<T, E> {
    /// Starts `work` on a thread named after `what` ("loading run.pickle", "the simulation":
    /// also how errors name the job). When the result is ready, `repaint` (when given) is
    /// asked to redraw so the UI polls it.
    pub fn spawn(
        what: impl Into<String>,
        repaint: Option<egui::Context>,
        work: impl FnOnce(&Progress) -> Result<T, E> + Send + 'static,
    ) -> Self {
        let what = what.into();
        let progress = Arc::new(Progress::default());
        let (sender, receiver) = mpsc::channel();
        let shared = progress.clone();
        let name = what.clone();
        let spawned = std::thread::Builder::new()
            .name(what.clone())
            .spawn(move || {
                let result = match catch(&name, || work(&shared)) {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(_)) if shared.is_cancelled() => Err(JobError::Cancelled { what: name }),
                    Ok(Err(e)) => Err(JobError::Failed(e)),
                    Err(panicked) => Err(panicked.widen()),
                };
                let _ = sender.send(result);
                if let Some(ctx) = repaint {
                    ctx.request_repaint();
                }
            });
        let receiver = match spawned {
            Ok(_) => receiver,
            Err(source) => {
                // No thread: the error goes through the channel the UI polls anyway.
                let (sender, receiver) = mpsc::channel();
                let _ = sender.send(Err(JobError::Spawn {
                    what: what.clone(),
                    source,
                }));
                receiver
            }
        };
        Job {
            what,
            started: Instant::now(),
            progress,
            receiver,
        }
    }

    /// The result, once the work is done; `None` while it runs. Call it once per frame: the
    /// result is handed over once.
    pub fn poll(&self) -> Option<Result<T, JobError<E>>> {
        match self.receiver.try_recv() {
            Ok(result) => Some(result),
            Err(mpsc::TryRecvError::Empty) => None,
            // The worker sends before it ends, and a panic is caught: only a thread killed
            // from outside ends without a result.
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(self.lost())),
        }
    }

    /// Blocks until the work is done (tests, benchmarks, headless runs).
    pub fn wait(&self) -> Result<T, JobError<E>> {
        self.receiver.recv().unwrap_or_else(|_| Err(self.lost()))
    }

    fn lost(&self) -> JobError<E> {
        JobError::Panicked {
            what: self.what.clone(),
            message: "the worker thread ended without a result".into(),
        }
    }
}

impl<T, E> Job<T, E> {
    /// What the job does, as its errors name it.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// When the job started.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Asks the work to stop; the job then reports [`JobError::Cancelled`] (or its result,
    /// when the work finished anyway).
    pub fn cancel(&self) {
        self.progress.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.progress.is_cancelled()
    }
}

/// Runs `f` here, turning a panic into [`JobError::Panicked`] naming `what`. [`Job::spawn`]
/// runs its work through this; a job doing several independent parts (the steps of each
/// device) runs each through it too, so a panic costs one part.
pub fn catch<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, JobError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| JobError::Panicked {
        what: what.to_owned(),
        message: panic_message(&*panic),
    })
}

impl JobError {
    /// The same error, as a job with errors of type `E` reports it.
    pub fn widen<E>(self) -> JobError<E> {
        match self {
            JobError::Panicked { what, message } => JobError::Panicked { what, message },
            JobError::Cancelled { what } => JobError::Cancelled { what },
            JobError::Spawn { what, source } => JobError::Spawn { what, source },
            JobError::Failed(never) => match never {},
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_panic_in_the_work_is_a_panicked_error_naming_the_job() {
        let job: Job<(), Infallible> = Job::spawn("the test work", None, |_| panic!("boom"));
        match job.wait() {
            Err(JobError::Panicked { what, message }) => {
                assert_eq!((what.as_str(), message.as_str()), ("the test work", "boom"));
            }
            other => panic!("expected a panic error, got {other:?}"),
        }
    }

    #[test]
    fn cancel_stops_a_job_that_polls_the_flag() {
        let (started, is_started) = mpsc::channel();
        let job: Job<(), &'static str> = Job::spawn("endless", None, move |progress| {
            let _ = started.send(());
            while !progress.is_cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err("stopped")
        });
        is_started.recv().expect("the work started");
        assert!(job.poll().is_none(), "still running");
        job.cancel();
        assert!(matches!(job.wait(), Err(JobError::Cancelled { what }) if what == "endless"));
    }

    #[test]
    fn the_work_s_own_error_and_progress_come_through() {
        let job: Job<(), String> = Job::spawn("failing", None, |progress| {
            progress.set("halfway", 1, 2);
            Err("no such device".to_owned())
        });
        let err = job.wait().expect_err("it failed");
        // The thread is done: the last progress it reported stays readable.
        assert!(matches!(&err, JobError::Failed(e) if e == "no such device"));
        assert_eq!(err.to_string(), "no such device");
    }

    #[test]
    fn a_repaint_is_requested_when_the_result_is_ready() {
        let ctx = egui::Context::default();
        let (tx, rx) = mpsc::channel();
        ctx.set_request_repaint_callback(move |_| {
            let _ = tx.send(());
        });
        let job: Job<u8> = Job::spawn("quick", Some(ctx), |_| Ok(7));
        rx.recv_timeout(Duration::from_secs(10))
            .expect("repaint asked");
        assert_eq!(job.wait().expect("result"), 7);
    }
}
