//! The call sites of the synthetic training script: Python stacks 10 to 20 frames deep, as
//! `_record_memory_history(stacks="python")` records them (innermost frame first).

use crate::intern::{Frame, StackId};
use crate::model::Snapshot;

/// What an allocation is for; each kind has its own family of call sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Site {
    Parameter,
    Activation,
    ForwardTemporary,
    Loss,
    Gradient,
    OptimizerState,
    OptimizerTemporary,
    Leak,
}

const SITES: [Site; 8] = [
    Site::Parameter,
    Site::Activation,
    Site::ForwardTemporary,
    Site::Loss,
    Site::Gradient,
    Site::OptimizerState,
    Site::OptimizerTemporary,
    Site::Leak,
];

/// Relative share of the stack pool each site kind gets.
const WEIGHTS: [usize; 8] = [2, 8, 3, 1, 4, 1, 2, 1];

const PROJECT: &str = "/home/user/project";
const TORCH: &str = "/usr/local/lib/python3.11/site-packages/torch";
const RUNPY: &str = "/usr/lib/python3.11/runpy.py";

/// The interned stacks of every call site, per site kind.
pub(super) struct CallSites {
    stacks: Vec<Vec<StackId>>,
}

impl CallSites {
    /// Interns about `pool` distinct stacks (at least one per site kind) into `snapshot`.
    pub(super) fn new(snapshot: &mut Snapshot, pool: usize) -> Self {
        let total_weight: usize = WEIGHTS.iter().sum();
        let stacks = SITES
            .iter()
            .zip(WEIGHTS)
            .map(|(&site, weight)| {
                let variants = (pool * weight / total_weight).max(1);
                (0..variants)
                    .map(|v| {
                        let mut frames = outermost_first(site, v);
                        frames.reverse();
                        snapshot.intern_stack(frames)
                    })
                    .collect()
            })
            .collect();
        CallSites { stacks }
    }

    /// The stack of call site `key` of this kind (the same key always gives the same stack).
    pub(super) fn pick(&self, site: Site, key: usize) -> StackId {
        let family = &self.stacks[site as usize];
        family[key % family.len()]
    }
}

fn project(file: &str, line: i64, name: &str) -> Frame {
    Frame::new(name, format!("{PROJECT}/{file}"), line)
}

fn torch(file: &str, line: i64, name: &str) -> Frame {
    Frame::new(name, format!("{TORCH}/{file}"), line)
}

/// `nn.Module.__call__`: two frames per module call.
fn module_call(frames: &mut Vec<Frame>) {
    frames.push(torch("nn/modules/module.py", 1773, "_wrapped_call_impl"));
    frames.push(torch("nn/modules/module.py", 1784, "_call_impl"));
}

/// `python -m train` through the trainer's epoch loop.
fn training_loop() -> Vec<Frame> {
    vec![
        Frame::new("_run_module_as_main", RUNPY, 198),
        Frame::new("_run_code", RUNPY, 88),
        project("train.py", 214, "<module>"),
        project("train.py", 197, "main"),
        project("trainer.py", 61, "fit"),
        project("trainer.py", 104, "_run_epoch"),
    ]
}

/// The frames of variant `v` of a site kind, outermost first. Each variant differs in at least
/// one line number, so variants are distinct stacks.
fn outermost_first(site: Site, v: usize) -> Vec<Frame> {
    let v_line = v as i64;
    match site {
        Site::Parameter => {
            let mut frames = vec![
                Frame::new("_run_module_as_main", RUNPY, 198),
                Frame::new("_run_code", RUNPY, 88),
                project("train.py", 214, "<module>"),
                project("train.py", 171, "main"),
                project("train.py", 60, "build_model"),
                project("model.py", 198, "__init__"),
                project("model.py", 40 + v_line, "__init__"),
                project("model.py", 90, "__init__"),
            ];
            let leaf = match v % 3 {
                0 => [torch("nn/modules/linear.py", 106, "__init__")],
                1 => [torch("nn/modules/normalization.py", 205, "__init__")],
                _ => [torch("nn/modules/sparse.py", 167, "__init__")],
            };
            frames.extend(leaf);
            frames.push(torch("utils/_device.py", 104, "__torch_function__"));
            frames
        }
        Site::Activation | Site::ForwardTemporary => {
            let mut frames = training_loop();
            frames.push(project("train.py", 88, "train_step"));
            module_call(&mut frames);
            frames.push(project("model.py", 212, "forward"));
            module_call(&mut frames);
            let block_line = if site == Site::Activation { 50 } else { 150 };
            frames.push(project("model.py", block_line + v_line, "forward"));
            module_call(&mut frames);
            if v.is_multiple_of(2) {
                frames.push(project("model.py", 97, "forward"));
            } else {
                frames.push(project("attention.py", 141, "forward"));
            }
            module_call(&mut frames);
            match v % 5 {
                0 => frames.push(torch("nn/modules/linear.py", 125, "forward")),
                1 => {
                    frames.push(torch("nn/modules/normalization.py", 217, "forward"));
                    frames.push(torch("nn/functional.py", 2910, "layer_norm"));
                }
                2 => frames.push(torch("nn/modules/activation.py", 734, "forward")),
                3 => {
                    frames.push(torch("nn/modules/dropout.py", 70, "forward"));
                    frames.push(torch("nn/functional.py", 1425, "dropout"));
                }
                _ => frames.push(project("attention.py", 77, "_attn")),
            }
            frames
        }
        Site::Loss => {
            let mut frames = training_loop();
            frames.push(project("train.py", 89, "train_step"));
            frames.push(project("losses.py", 20 + v_line, "compute_loss"));
            module_call(&mut frames);
            frames.push(torch("nn/modules/loss.py", 1310, "forward"));
            frames.push(torch("nn/functional.py", 3462, "cross_entropy"));
            frames
        }
        Site::Gradient => {
            let mut frames = training_loop();
            frames.extend([
                project("train.py", 92, "train_step"),
                torch("_tensor.py", 648, "backward"),
                torch("autograd/__init__.py", 354, "backward"),
                torch("autograd/graph.py", 829, "_engine_run_backward"),
                torch("autograd/function.py", 307, "apply"),
                project("model.py", 170 + v_line, "backward"),
            ]);
            frames
        }
        Site::OptimizerState | Site::OptimizerTemporary => {
            let mut frames = training_loop();
            frames.extend([
                project("train.py", 95, "train_step"),
                torch("optim/optimizer.py", 485, "wrapper"),
                torch("optim/optimizer.py", 79, "_use_grad"),
                torch("optim/adam.py", 247, "step"),
            ]);
            if site == Site::OptimizerState {
                frames.push(torch("optim/adam.py", 176 + v_line, "_init_group"));
            } else {
                frames.push(torch("optim/adam.py", 933, "adam"));
                frames.push(torch("optim/adam.py", 700 + v_line, "_multi_tensor_adam"));
            }
            frames
        }
        Site::Leak => {
            let mut frames = training_loop();
            frames.extend([
                project("train.py", 101, "train_step"),
                project("trainer.py", 140, "_call_hooks"),
                project("callbacks.py", 58, "on_step_end"),
                project("metrics.py", 33 + v_line, "record"),
            ]);
            frames
        }
    }
}
