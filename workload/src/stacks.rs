//! The call sites of the simulated training script, as PyTorch records them with
//! `_record_memory_history(stacks="all")`: innermost first, the caching allocator's C++ frames,
//! the ATen operator and its dispatch, then the Python frames of the script (module `forward`
//! calls, the optimizer's `step`), down to the interpreter's entry. Backward work runs on the
//! autograd engine's device thread, so its stacks hold autograd nodes and engine frames and no
//! Python frame, as in real files.

use memsnap_format::Frame;

/// What an allocation (or a free) is for; each kind has its own family of call sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    Parameter,
    Activation,
    ForwardTemporary,
    Loss,
    /// A parameter's gradient (autograd's `AccumulateGrad` / the weight-gradient kernel).
    Gradient,
    /// The gradient of an activation, passed on to the layer before.
    InputGradient,
    OptimizerState,
    OptimizerTemporary,
    Leak,
    /// The autograd engine releasing saved activations during backward (a free).
    BackwardRelease,
    /// `optimizer.zero_grad(set_to_none=True)` dropping the gradients (a free).
    ZeroGrad,
}

pub(crate) const SITES: [Site; 11] = [
    Site::Parameter,
    Site::Activation,
    Site::ForwardTemporary,
    Site::Loss,
    Site::Gradient,
    Site::InputGradient,
    Site::OptimizerState,
    Site::OptimizerTemporary,
    Site::Leak,
    Site::BackwardRelease,
    Site::ZeroGrad,
];

/// Relative share of the stack pool each site kind gets.
const WEIGHTS: [usize; 11] = [2, 8, 3, 1, 3, 2, 1, 2, 1, 1, 1];

const PROJECT: &str = "/home/user/project";
const TORCH: &str = "/usr/local/lib/python3.11/site-packages/torch";
const RUNPY: &str = "/usr/lib/python3.11/runpy.py";

/// The call sites of the script: how many variants each site kind has and how deep their
/// stacks are. The frames are made when registered with a device's allocator.
pub(crate) struct CallSites {
    /// Variants per site kind, in [`SITES`] order.
    variants: [usize; SITES.len()],
    /// `TrainingRun::stack_depth`.
    depth: usize,
}

impl CallSites {
    /// About `pool` distinct stacks in all, at least one per site kind, of about `depth`
    /// frames each (0: the call site's own frames).
    pub(crate) fn new(pool: usize, depth: usize) -> Self {
        let total_weight: usize = WEIGHTS.iter().sum();
        let variants = WEIGHTS.map(|weight| (pool.saturating_mul(weight) / total_weight).max(1));
        CallSites { variants, depth }
    }

    /// Registers every call site's stack with `register`, family by family, and returns the
    /// handles per site kind (a stack `register` refuses is left out). One stack's frames are
    /// alive at a time. O(pool × depth).
    pub(crate) fn register<H>(
        &self,
        mut register: impl FnMut(&[Frame]) -> Option<H>,
    ) -> Vec<Vec<H>> {
        let mut padding = Padding::default();
        SITES
            .iter()
            .zip(self.variants)
            .enumerate()
            .map(|(kind, (&site, variants))| {
                (0..variants)
                    .filter_map(|v| {
                        let mut frames = innermost_first(site, v);
                        if self.depth > 0 {
                            padding.pad(&mut frames, self.depth, kind, v);
                        }
                        register(&frames)
                    })
                    .collect()
            })
            .collect()
    }
}

/// The frames that make stacks deep (`TrainingRun::stack_depth`): nested modules of the model
/// (`blocks/block_K.py forward` under `nn/modules/module.py _call_impl`), one distinct frame
/// per depth, shared by every stack, as the frames of a real program are. Made once.
#[derive(Default)]
struct Padding {
    frames: Vec<Frame>,
}

impl Padding {
    /// Inserts the outermost module frames above the interpreter's (or the autograd thread's)
    /// entry frames, until `frames` holds between 2/3 and 4/3 of `depth` frames (by a hash of
    /// the site kind and variant, so stack lengths vary).
    fn pad(&mut self, frames: &mut Vec<Frame>, depth: usize, kind: usize, v: usize) {
        let low = depth - depth / 3;
        let spread = (depth + depth / 3) - low;
        let mix = (kind as u64 + 1)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(v as u64)
            .wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let target = low + ((mix >> 17) % (spread as u64 + 1)) as usize;
        let extra = target.saturating_sub(frames.len());
        while self.frames.len() < extra {
            let i = self.frames.len();
            self.frames.push(if i.is_multiple_of(2) {
                torch(
                    "nn/modules/module.py",
                    1784 + (i as i64 / 2) % 7,
                    "_call_impl",
                )
            } else {
                project(
                    &format!("blocks/block_{}.py", i / 2),
                    10 + i as i64,
                    "forward",
                )
            });
        }
        // Above the entry frames (the interpreter's four, or the autograd thread's last
        // ones), so innermost stays innermost.
        let at = frames.len().saturating_sub(4);
        frames.splice(at..at, self.frames[..extra].iter().cloned());
    }
}

fn cpp(name: &str) -> Frame {
    Frame::new(name, "??", 0)
}

fn cpp_at(name: &str, file: &str, line: i64) -> Frame {
    Frame::new(name, file, line)
}

fn project(file: &str, line: i64, name: &str) -> Frame {
    Frame::new(name, format!("{PROJECT}/{file}"), line)
}

fn torch(file: &str, line: i64, name: &str) -> Frame {
    Frame::new(name, format!("{TORCH}/{file}"), line)
}

/// The caching allocator's own frames, innermost first, as PyTorch's unwinder sees them.
fn allocator_frames(frames: &mut Vec<Frame>, free: bool) {
    frames.push(cpp("torch::unwind::unwind()"));
    frames.push(cpp("torch::CapturedTraceback::gather(bool, bool, bool)"));
    frames.push(cpp_at(
        "torch::cuda::(anonymous namespace)::gather_with_cpp()",
        "memory_snapshot.cpp",
        0,
    ));
    if free {
        frames.push(cpp_at(
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::Block*)",
            "CUDACachingAllocator.cpp",
            0,
        ));
        frames.push(cpp(
            "c10::intrusive_ptr<c10::StorageImpl, c10::detail::intrusive_target_default_null_type<c10::StorageImpl> >::reset_()",
        ));
        frames.push(cpp_at(
            "c10::TensorImpl::~TensorImpl()",
            "TensorImpl.cpp",
            0,
        ));
    } else {
        frames.push(cpp_at(
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
            "CUDACachingAllocator.cpp",
            0,
        ));
        frames.push(cpp(
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)",
        ));
        frames.push(cpp(
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
        ));
        frames.push(cpp(
            "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
        ));
        frames.push(cpp(
            "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)",
        ));
    }
}

/// An ATen operator called from Python: the kernel wrapper, the dispatcher and the binding.
fn aten_op(frames: &mut Vec<Frame>, op: &str) {
    frames.push(cpp_at(
        &format!(
            "at::(anonymous namespace)::wrapper_CUDA_{op}(at::Tensor const&, at::Tensor const&)"
        ),
        "RegisterCUDA_0.cpp",
        0,
    ));
    frames.push(cpp(&format!(
        "at::_ops::{op}::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)"
    )));
    frames.push(cpp_at(
        &format!("torch::autograd::VariableType::(anonymous namespace)::{op}(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)"),
        "VariableType_0.cpp",
        0,
    ));
    frames.push(cpp(&format!(
        "at::_ops::{op}::call(at::Tensor const&, at::Tensor const&)"
    )));
    frames.push(cpp_at(
        &format!("torch::autograd::THPVariable_{op}(_object*, _object*, _object*)"),
        "python_torch_functions_0.cpp",
        0,
    ));
    frames.push(cpp("_PyObject_MakeTpCall"));
}

/// `nn.Module.__call__`: two frames per module call, innermost first.
fn module_call(frames: &mut Vec<Frame>) {
    frames.push(torch("nn/modules/module.py", 1784, "_call_impl"));
    frames.push(torch("nn/modules/module.py", 1773, "_wrapped_call_impl"));
}

/// The trainer's epoch loop down to the interpreter's entry, innermost first.
fn training_loop(frames: &mut Vec<Frame>) {
    frames.extend([
        project("trainer.py", 104, "_run_epoch"),
        project("trainer.py", 61, "fit"),
        project("train.py", 197, "main"),
        project("train.py", 214, "<module>"),
        Frame::new("_run_code", RUNPY, 88),
        Frame::new("_run_module_as_main", RUNPY, 198),
    ]);
    interpreter_entry(frames);
}

fn interpreter_entry(frames: &mut Vec<Frame>) {
    frames.extend([
        cpp("Py_RunMain"),
        cpp("Py_BytesMain"),
        cpp_at("__libc_start_main_impl", "./csu/../csu/libc-start.c", 392),
        cpp("_start"),
    ]);
}

/// The autograd engine's device thread, innermost first.
fn autograd_thread(frames: &mut Vec<Frame>) {
    frames.extend([
        cpp("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
        cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
        cpp("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
        cpp("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
        cpp("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
        cpp_at("start_thread", "./nptl/pthread_create.c", 442),
        cpp_at(
            "__clone3",
            "./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S",
            81,
        ),
    ]);
}

/// Autograd nodes of the model's operators, by variant.
const BACKWARD_NODES: [(&str, &str); 5] = [
    ("MmBackward0", "mm_mat2_backward"),
    ("AddmmBackward0", "mm_mat1_backward"),
    ("NativeLayerNormBackward0", "layer_norm_backward"),
    ("GeluBackward0", "gelu_backward"),
    (
        "ScaledDotProductEfficientAttentionBackward0",
        "_efficient_attention_backward",
    ),
];

/// The frames of variant `v` of a site kind, innermost first. Each variant differs in at least
/// one frame, so variants are distinct stacks.
fn innermost_first(site: Site, v: usize) -> Vec<Frame> {
    let v_line = v as i64;
    let mut frames = Vec::with_capacity(32);
    match site {
        Site::Parameter => {
            allocator_frames(&mut frames, false);
            aten_op(&mut frames, "empty");
            frames.push(torch("utils/_device.py", 104, "__torch_function__"));
            frames.push(match v % 3 {
                0 => torch("nn/modules/linear.py", 106, "__init__"),
                1 => torch("nn/modules/normalization.py", 205, "__init__"),
                _ => torch("nn/modules/sparse.py", 167, "__init__"),
            });
            frames.extend([
                project("model.py", 90, "__init__"),
                project("model.py", 40 + v_line, "__init__"),
                project("model.py", 198, "__init__"),
                project("train.py", 60, "build_model"),
                project("train.py", 171, "main"),
                project("train.py", 214, "<module>"),
                Frame::new("_run_code", RUNPY, 88),
                Frame::new("_run_module_as_main", RUNPY, 198),
            ]);
            interpreter_entry(&mut frames);
        }
        Site::Activation | Site::ForwardTemporary => {
            allocator_frames(&mut frames, false);
            let (op, leaf): (&str, &[Frame]) = match v % 5 {
                0 => ("addmm", &[torch("nn/modules/linear.py", 125, "forward")]),
                1 => (
                    "native_layer_norm",
                    &[
                        torch("nn/functional.py", 2910, "layer_norm"),
                        torch("nn/modules/normalization.py", 217, "forward"),
                    ],
                ),
                2 => ("gelu", &[torch("nn/modules/activation.py", 734, "forward")]),
                3 => (
                    "native_dropout",
                    &[
                        torch("nn/functional.py", 1425, "dropout"),
                        torch("nn/modules/dropout.py", 70, "forward"),
                    ],
                ),
                _ => (
                    "_scaled_dot_product_efficient_attention",
                    &[project("attention.py", 77, "_attn")],
                ),
            };
            aten_op(&mut frames, op);
            frames.extend(leaf.iter().cloned());
            module_call(&mut frames);
            frames.push(if v.is_multiple_of(2) {
                project("model.py", 97, "forward")
            } else {
                project("attention.py", 141, "forward")
            });
            module_call(&mut frames);
            let block_line = if site == Site::Activation { 50 } else { 150 };
            frames.push(project("model.py", block_line + v_line, "forward"));
            module_call(&mut frames);
            frames.push(project("model.py", 212, "forward"));
            module_call(&mut frames);
            frames.push(project("train.py", 88, "train_step"));
            training_loop(&mut frames);
        }
        Site::Loss => {
            allocator_frames(&mut frames, false);
            aten_op(&mut frames, "nll_loss_forward");
            frames.push(torch("nn/functional.py", 3462, "cross_entropy"));
            frames.push(torch("nn/modules/loss.py", 1310, "forward"));
            module_call(&mut frames);
            frames.push(project("losses.py", 20 + v_line, "compute_loss"));
            frames.push(project("train.py", 89, "train_step"));
            training_loop(&mut frames);
        }
        Site::Gradient | Site::InputGradient => {
            allocator_frames(&mut frames, false);
            let (node, helper) = BACKWARD_NODES[v % BACKWARD_NODES.len()];
            let line = if site == Site::Gradient { 1200 } else { 2400 };
            frames.push(cpp(
                "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)",
            ));
            frames.push(cpp_at(
                &format!("torch::autograd::generated::details::{helper}(at::Tensor const&, at::Tensor const&)"),
                "FunctionsManual.cpp",
                line + v_line,
            ));
            frames.push(cpp_at(
                &format!("torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
                "Functions.cpp",
                0,
            ));
            if site == Site::Gradient {
                frames.push(cpp(
                    "torch::autograd::AccumulateGrad::accumulateGrad(at::Tensor const&, at::Tensor&, at::Tensor const&, unsigned long, std::function<void (at::Tensor&&)> const&)",
                ));
            }
            autograd_thread(&mut frames);
        }
        Site::BackwardRelease => {
            allocator_frames(&mut frames, true);
            let (node, _) = BACKWARD_NODES[v % BACKWARD_NODES.len()];
            frames.push(cpp("torch::autograd::SavedVariable::reset_data()"));
            frames.push(cpp_at(
                &format!("torch::autograd::generated::{node}::release_variables()"),
                "Functions.h",
                v_line,
            ));
            autograd_thread(&mut frames);
        }
        Site::OptimizerState | Site::OptimizerTemporary => {
            allocator_frames(&mut frames, false);
            if site == Site::OptimizerState {
                aten_op(&mut frames, "zeros_like");
                frames.push(torch("optim/adam.py", 176 + v_line, "_init_group"));
            } else {
                aten_op(&mut frames, "_foreach_sqrt");
                frames.push(torch("optim/adam.py", 700 + v_line, "_multi_tensor_adam"));
                frames.push(torch("optim/adam.py", 933, "adam"));
            }
            frames.extend([
                torch("optim/adam.py", 247, "step"),
                torch("optim/optimizer.py", 79, "_use_grad"),
                torch("optim/optimizer.py", 485, "wrapper"),
                project("train.py", 95, "train_step"),
            ]);
            training_loop(&mut frames);
        }
        Site::ZeroGrad => {
            allocator_frames(&mut frames, true);
            frames.push(cpp_at(
                "torch::autograd::THPVariable_set_grad(THPVariable*, _object*, void*)",
                "python_variable.cpp",
                0,
            ));
            frames.extend([
                torch("optim/optimizer.py", 1010 + v_line, "zero_grad"),
                project("train.py", 97, "train_step"),
            ]);
            training_loop(&mut frames);
        }
        Site::Leak => {
            allocator_frames(&mut frames, false);
            aten_op(&mut frames, "clone");
            frames.extend([
                project("metrics.py", 33 + v_line, "record"),
                project("callbacks.py", 58, "on_step_end"),
                project("trainer.py", 140, "_call_hooks"),
                project("train.py", 101, "train_step"),
            ]);
            training_loop(&mut frames);
        }
    }
    frames
}
