"""memsnap.torch's out-of-memory shim (_oom_shim.cpp), without PyTorch or a GPU.

The shim is what makes running out of memory under memsnap raise torch.OutOfMemoryError:
CUDAPluggableAllocator (torch 2.11) does not check the pointer its allocator returns, so the
shim throws PyTorch's own c10::OutOfMemoryError instead of returning NULL. Here it is compiled
against a stand-in for PyTorch's c10/util/Exception.h (same macros, same type names) and driven
by a small C++ program over the recorder's host backend: an allocation larger than the device
throws OutOfMemoryError with the recorder's message, other failures throw c10::Error, and the
allocator works on after it. The real thing ran on an H100/H200 (recorder/README.md).
"""

import ctypes
import os
import shutil
import subprocess
import types
import warnings

import pytest

import memsnap.torch

COMPILER = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler")

STAND_IN_HEADER = r"""
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
namespace c10 {
struct Error : std::runtime_error { using std::runtime_error::runtime_error; };
struct OutOfMemoryError : Error { using Error::Error; };
namespace detail {
template <typename... A> std::string cat(const A&... a) { std::ostringstream s; (s << ... << a); return s.str(); }
}
}
#define TORCH_CHECK_WITH(kind, cond, ...) \
  do { if (!(cond)) throw ::c10::kind(::c10::detail::cat(__VA_ARGS__)); } while (0)
#define TORCH_CHECK(cond, ...) TORCH_CHECK_WITH(Error, cond, __VA_ARGS__)
"""

DRIVER = r"""
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstddef>
using Alloc = void* (*)(size_t, int, void*);
using Free = void (*)(void*, size_t, int, void*);
using Init = int (*)(void*, void*, void*);
int main(int argc, char** argv) {
  void* recorder = dlopen(argv[1], RTLD_NOW);
  void* shim = dlopen(argv[2], RTLD_NOW);
  if (!recorder || !shim) { std::printf("dlopen: %s\n", dlerror()); return 2; }
  auto init = reinterpret_cast<Init>(dlsym(shim, "memsnap_oom_shim_init"));
  auto alloc = reinterpret_cast<Alloc>(dlsym(shim, "memsnap_oom_shim_alloc"));
  auto release = reinterpret_cast<Free>(dlsym(shim, "memsnap_oom_shim_free"));
  if (init(dlsym(recorder, "memsnap_alloc_checked"), dlsym(recorder, "memsnap_free"),
           dlsym(recorder, "memsnap_last_error")) != 0) { std::printf("init refused\n"); return 2; }
  void* small = alloc(1 << 20, 0, nullptr);
  std::printf("small %s\n", small ? "ok" : "NULL");
  release(small, 1 << 20, 0, nullptr);
  try {
    alloc(size_t(1) << 30, 0, nullptr);
    std::printf("huge returned\n");
  } catch (const c10::OutOfMemoryError& e) {
    std::printf("OutOfMemoryError: %s\n", e.what());
  }
  try {
    alloc(16, -1, nullptr);
    std::printf("bad device returned\n");
  } catch (const c10::OutOfMemoryError& e) {
    std::printf("wrong type: %s\n", e.what());
  } catch (const c10::Error& e) {
    std::printf("Error: %s\n", e.what());
  }
  void* after = alloc(1 << 20, 0, nullptr);
  std::printf("after %s\n", after ? "ok" : "NULL");
  release(after, 1 << 20, 0, nullptr);
  return 0;
}
"""


@pytest.fixture
def fake_torch(tmp_path):
    """A module that looks like torch to build_oom_shim: torch/include with the stand-in
    header, torch/lib/libc10.so (empty)."""
    root = tmp_path / "torch"
    (root / "include" / "c10" / "util").mkdir(parents=True)
    (root / "include" / "c10" / "util" / "Exception.h").write_text(STAND_IN_HEADER)
    (root / "lib").mkdir()
    empty = tmp_path / "empty.cpp"
    empty.write_text("")
    subprocess.run([COMPILER, "-shared", "-fPIC", str(empty), "-o", str(root / "lib" / "libc10.so")], check=True)
    return types.SimpleNamespace(
        __file__=str(root / "__init__.py"),
        __version__="0.0+memsnap-test",
        _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True),
    )


def test_an_allocation_larger_than_the_device_throws_out_of_memory_error(tmp_path, fake_torch):
    shim = memsnap.torch.build_oom_shim(fake_torch, cache_dir=str(tmp_path / "cache"))
    include = os.path.join(os.path.dirname(fake_torch.__file__), "include")
    driver = tmp_path / "driver"
    (tmp_path / "driver.cpp").write_text(DRIVER)
    subprocess.run([COMPILER, "-std=c++17", f"-I{include}", str(tmp_path / "driver.cpp"), "-ldl", "-o", str(driver)],
                   check=True)
    env = dict(os.environ, MEMSNAP_BACKEND="host", MEMSNAP_DEVICE_MEMORY="256MiB", MEMSNAP_HISTORY="off")
    result = subprocess.run([str(driver), memsnap.torch.library_path(), shim], capture_output=True, text=True,
                            env=env, timeout=60)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[0] == "small ok"
    assert lines[1].startswith("OutOfMemoryError: out of memory: tried to allocate 1073741824 bytes"), lines
    assert lines[2].startswith("Error: memsnap: "), lines
    assert lines[3] == "after ok"


def test_the_shim_is_built_once_per_torch_and_cached(tmp_path, fake_torch):
    cache = str(tmp_path / "cache")
    first = memsnap.torch.build_oom_shim(fake_torch, cache_dir=cache)
    built_at = os.stat(first).st_mtime_ns
    assert memsnap.torch.build_oom_shim(fake_torch, cache_dir=cache) == first
    assert os.stat(first).st_mtime_ns == built_at
    fake_torch.__version__ = "0.1+memsnap-test"
    assert memsnap.torch.build_oom_shim(fake_torch, cache_dir=cache) != first
    assert sorted(os.listdir(cache)) == sorted(n for n in os.listdir(cache) if not n.startswith("."))


def test_without_headers_or_compiler_it_says_why(tmp_path, fake_torch):
    with pytest.raises(memsnap.torch.MemsnapError, match="cannot run the C\\+\\+ compiler"):
        memsnap.torch.build_oom_shim(fake_torch, cache_dir=str(tmp_path / "a"), compiler="/nonexistent/c++")
    with pytest.raises(memsnap.torch.MemsnapError, match="building memsnap's OOM shim failed"):
        memsnap.torch.build_oom_shim(fake_torch, cache_dir=str(tmp_path / "b"), compiler="false")
    assert os.listdir(tmp_path / "b") == []  # no partial file left behind
    headerless = types.SimpleNamespace(__file__=str(tmp_path / "bare" / "__init__.py"), __version__="0",
                                       _C=types.SimpleNamespace())
    with pytest.raises(memsnap.torch.MemsnapError, match="headers are not installed"):
        memsnap.torch.build_oom_shim(headerless, cache_dir=str(tmp_path / "c"))


def test_enable_falls_back_with_one_warning_when_the_shim_cannot_be_built(tmp_path, monkeypatch):
    headerless = types.SimpleNamespace(__file__=str(tmp_path / "bare" / "__init__.py"), __version__="0",
                                       _C=types.SimpleNamespace())
    monkeypatch.setattr(memsnap.torch, "_oom_shim_path", None)
    lib = memsnap.torch.load_library()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert memsnap.torch._oom_shim(headerless, lib) is None
        assert memsnap.torch._oom_shim(headerless, lib) is None
    assert len(caught) == 1 and "will not raise torch.OutOfMemoryError" in str(caught[0].message)
    assert isinstance(lib, ctypes.CDLL)
