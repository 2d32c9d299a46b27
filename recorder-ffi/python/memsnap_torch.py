"""memsnap_torch: memsnap as PyTorch's CUDA allocator, from a source checkout.

    import memsnap_torch          # PYTHONPATH=recorder-ffi/python
    memsnap_torch.enable(max_entries=200_000, stacks="all", dump_on_oom="oom.pickle")
    ...  # train as usual; tensors now come from memsnap
    memsnap_torch.dump("snapshot.pickle")    # then: memsnap view snapshot.pickle

The implementation is the wheel's ``memsnap.torch`` (``python/memsnap/torch.py`` of this
checkout), loaded here by path, so neither the wheel nor its compiled extension is needed: the
recorder library comes from ``$MEMSNAP_LIBRARY``, else this checkout's ``target/release`` or
``target/debug``, else the loader path. ``load()`` is ``load_library()`` under its old name.
"""

import importlib.util
import os
import sys

_IMPLEMENTATION = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "memsnap", "torch.py"
)

_spec = importlib.util.spec_from_file_location(__name__, _IMPLEMENTATION)
_module = importlib.util.module_from_spec(_spec)
# `import memsnap_torch` hands out what sys.modules holds once this file has run: the
# implementation itself, with its state (the loaded library) in one place.
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
_module.load = _module.load_library
