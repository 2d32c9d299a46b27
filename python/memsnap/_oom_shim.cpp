// memsnap.torch's out-of-memory shim: the allocator pair PyTorch's CUDAPluggableAllocator calls,
// over memsnap's C ABI, that throws c10::OutOfMemoryError when the device has no room.
//
// Why it exists: CUDAPluggableAllocator (torch 2.11) does not check the pointer its alloc
// function returns, so a plain C allocator that fails gives a tensor with a NULL data pointer
// instead of torch.OutOfMemoryError. A C++ function that throws c10::OutOfMemoryError is what
// PyTorch's own caching allocator does; PyTorch's Python bindings turn it into
// torch.OutOfMemoryError, and the training loop can catch it and go on.
//
// memsnap.torch compiles this file once per PyTorch build (against torch's own headers, with its
// C++ ABI) and caches the library; memsnap_oom_shim_init receives memsnap's functions from the
// recorder library that memsnap.torch loaded, so nothing here links against it.
#include <c10/util/Exception.h>

#include <cstddef>
#include <string>

namespace {

using AllocChecked = int (*)(size_t, int, void*, void**);
using Free = void (*)(void*, size_t, int, void*);
using LastError = const char* (*)();

constexpr int kOutOfMemory = 2;  // MEMSNAP_ERR_OUT_OF_MEMORY in memsnap.h

AllocChecked alloc_checked = nullptr;
Free free_fn = nullptr;
LastError last_error = nullptr;

}  // namespace

extern "C" {

// Returns 0 once the three functions are set (memsnap.torch calls it before installing the shim).
int memsnap_oom_shim_init(void* alloc, void* free, void* error) {
  if (alloc == nullptr || free == nullptr || error == nullptr) {
    return 1;
  }
  alloc_checked = reinterpret_cast<AllocChecked>(alloc);
  free_fn = reinterpret_cast<Free>(free);
  last_error = reinterpret_cast<LastError>(error);
  return 0;
}

void* memsnap_oom_shim_alloc(size_t size, int device, void* stream) {
  TORCH_CHECK(alloc_checked != nullptr, "memsnap's OOM shim was installed before memsnap_oom_shim_init");
  void* ptr = nullptr;
  const int code = alloc_checked(size, device, stream, &ptr);
  if (code == 0) {
    return ptr;
  }
  const char* message = last_error();
  std::string text = (message != nullptr && *message != '\0') ? message : "memsnap: allocation failed";
  // The recorder's message names the request, the capacity and what is free, as PyTorch's does.
  TORCH_CHECK_WITH(OutOfMemoryError, code != kOutOfMemory, text);
  TORCH_CHECK(false, "memsnap: ", text);
}

void memsnap_oom_shim_free(void* ptr, size_t size, int device, void* stream) {
  if (free_fn != nullptr) {
    free_fn(ptr, size, device, stream);
  }
}

}  // extern "C"
