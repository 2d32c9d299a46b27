//! What a category is: the kinds of memory an allocation can be for ([`Category`]).
//!
//! How each allocation gets its category is [`crate::categories`]. The type is apart from the
//! rules because the replay takes categories from an import's source too
//! ([`crate::replay::Replay::categories_source`]), and the rules need the phases, which need
//! the curves, which need the replay: with the type beside the rules, those four modules
//! imported each other in a circle.

use serde::Serialize;

/// The category of an allocation (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    OptimizerState,
    Gradient,
    Activation,
    Temporary,
    Unknown,
    /// Model inputs (only from PyTorch's memory profiler).
    Input,
    /// Autograd's own bookkeeping (only from PyTorch's memory profiler).
    AutogradDetail,
}

impl Category {
    /// Every category, in report order.
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::OptimizerState,
        Category::Gradient,
        Category::Activation,
        Category::Temporary,
        Category::Unknown,
        Category::Input,
        Category::AutogradDetail,
    ];

    /// The category of PyTorch's `_memory_profiler.Category` name (`PARAMETER`, ...,
    /// `AUTOGRAD_DETAIL`); anything else is unknown.
    pub fn from_pytorch(name: &str) -> Category {
        match name {
            "PARAMETER" => Category::Parameter,
            "OPTIMIZER_STATE" => Category::OptimizerState,
            "INPUT" => Category::Input,
            "TEMPORARY" => Category::Temporary,
            "ACTIVATION" => Category::Activation,
            "GRADIENT" => Category::Gradient,
            "AUTOGRAD_DETAIL" => Category::AutogradDetail,
            _ => Category::Unknown,
        }
    }

    /// Input and autograd detail: categories only PyTorch's memory profiler gives (reports
    /// leave them out when they hold nothing).
    pub fn is_pytorch_only(self) -> bool {
        matches!(self, Category::Input | Category::AutogradDetail)
    }

    /// The name used in reports and JSON (`optimizer_state`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::OptimizerState => "optimizer_state",
            Category::Gradient => "gradient",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Unknown => "unknown",
            Category::Input => "input",
            Category::AutogradDetail => "autograd_detail",
        }
    }

    /// A label for people: `optimizer state`.
    pub fn label(self) -> &'static str {
        match self {
            Category::OptimizerState => "optimizer state",
            Category::AutogradDetail => "autograd detail",
            other => other.name(),
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}
