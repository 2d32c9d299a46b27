//! The GPU backends without a GPU: fake driver libraries built from C with gcc.
//!
//! cudarc loads `libcuda` once per process, so each CUDA case runs in a child process (this
//! test binary, filtered to one `#[ignore]`d child test) with `LD_LIBRARY_PATH` pointing at
//! an empty folder ("no driver") or at the stub ("driver present"). The HIP shim takes an
//! explicit library path, so its cases run in process.

use std::path::{Path, PathBuf};
use std::process::Command;

const CUDA_STUB: &str = r#"
#include <stdlib.h>
#include <stdint.h>
typedef int CUresult;
static const size_t TOTAL = (size_t)64 << 20;
static size_t used = 0;
static int context_token;
static int events_live = 0;
#define HEADER 4096
CUresult cuInit(unsigned flags) { (void)flags; return getenv("STUB_CUDA_NO_DEVICE") ? 100 : 0; }
CUresult cuDeviceGet(int *dev, int ordinal) { if (ordinal != 0) return 101; *dev = 0; return 0; }
CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = TOTAL; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &context_token; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &context_token ? 0 : 201; }
CUresult cuMemAlloc_v2(uint64_t *ptr, size_t n) {
    void *m;
    if (used + n > TOTAL) return 2;
    if (posix_memalign(&m, HEADER, n + HEADER) != 0) return 2;
    *(size_t *)m = n; used += n; *ptr = (uint64_t)(uintptr_t)((char *)m + HEADER); return 0;
}
CUresult cuMemFree_v2(uint64_t ptr) {
    char *m = (char *)(uintptr_t)ptr - HEADER; used -= *(size_t *)m; free(m); return 0;
}
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) { *free_bytes = TOTAL - used; *total = TOTAL; return 0; }
CUresult cuEventCreate(void **ev, unsigned flags) { (void)flags; *ev = malloc(1); events_live++; return 0; }
CUresult cuEventRecord(void *ev, void *stream) { (void)ev; (void)stream; return 0; }
CUresult cuEventQuery(void *ev) { (void)ev; return 0; }
CUresult cuEventSynchronize(void *ev) { (void)ev; return 0; }
CUresult cuEventDestroy_v2(void *ev) { free(ev); events_live--; return 0; }
CUresult cuGetErrorString(CUresult r, const char **s) { *s = r == 100 ? "no CUDA-capable device is detected" : "stub error"; return 0; }
size_t stub_used_bytes(void) { return used; }
"#;

const HIP_STUB: &str = r#"
#include <stdlib.h>
#include <stdint.h>
static const size_t TOTAL = (size_t)64 << 20;
static size_t used = 0;
#define HEADER 4096
int hipGetDeviceCount(int *n) {
#ifdef NO_DEVICE
    *n = 0; return 100;
#else
    *n = 1; return 0;
#endif
}
int hipSetDevice(int d) { return d == 0 ? 0 : 101; }
int hipMalloc(void **ptr, size_t n) {
    void *m;
    if (used + n > TOTAL) return 2;
    if (posix_memalign(&m, HEADER, n + HEADER) != 0) return 2;
    *(size_t *)m = n; used += n; *ptr = (char *)m + HEADER; return 0;
}
int hipFree(void *ptr) { char *m = (char *)ptr - HEADER; used -= *(size_t *)m; free(m); return 0; }
int hipMemGetInfo(size_t *free_bytes, size_t *total) { *free_bytes = TOTAL - used; *total = TOTAL; return 0; }
const char *hipGetErrorString(int e) { return e == 100 ? "hipErrorNoDevice" : "hip stub error"; }
int hipEventCreateWithFlags(void **ev, unsigned flags) { (void)flags; *ev = malloc(1); return 0; }
int hipEventRecord(void *ev, void *stream) { (void)ev; (void)stream; return 0; }
int hipEventQuery(void *ev) { (void)ev; return 0; }
int hipEventSynchronize(void *ev) { (void)ev; return 0; }
int hipEventDestroy(void *ev) { free(ev); return 0; }
"#;

/// Compiles `source` into `dir/name` as a shared library.
fn build_stub(dir: &Path, name: &str, source: &str, defines: &[&str]) -> PathBuf {
    let c_file = dir.join(format!("{name}.c"));
    std::fs::write(&c_file, source).unwrap();
    let out = dir.join(name);
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&c_file)
        .args(defines)
        .status()
        .expect("gcc is needed to build the fake driver libraries");
    assert!(status.success(), "gcc failed for {name}");
    out
}

/// Runs one `#[ignore]`d child test of this binary with the given library path and mode.
#[cfg(feature = "cuda")]
fn run_child(test: &str, library_dir: &Path, extra_env: &[(&str, &str)]) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", library_dir)
        .env("MEMSNAP_GPU_CHILD", "1")
        .envs(extra_env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "child {test} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {test} did not run:\n{text}"
    );
    text
}

#[cfg(feature = "cuda")]
mod cuda {
    use memsnap_format::{validate, Action};
    use memsnap_recorder::{
        CachingAllocator, CudaDevice, Device, DeviceError, Error, HistoryOptions, Stream,
    };

    use super::*;

    fn in_child() -> bool {
        std::env::var_os("MEMSNAP_GPU_CHILD").is_some()
    }

    #[test]
    fn cuda_without_driver_reports_unavailable() {
        let empty = tempfile::tempdir().unwrap();
        run_child("gpu::cuda::child_no_driver", empty.path(), &[]);
    }

    #[test]
    fn cuda_driver_without_device_reports_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        build_stub(dir.path(), "libcuda.so", CUDA_STUB, &[]);
        run_child(
            "gpu::cuda::child_no_device",
            dir.path(),
            &[("STUB_CUDA_NO_DEVICE", "1")],
        );
    }

    #[test]
    fn cuda_allocations_work_through_the_stub_driver() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_stub(dir.path(), "libcuda.so", CUDA_STUB, &[]);
        std::os::unix::fs::symlink(&lib, dir.path().join("libcuda.so.1")).unwrap();
        run_child("gpu::cuda::child_driver_present", dir.path(), &[]);
    }

    #[test]
    #[ignore = "run in a child process by cuda_without_driver_reports_unavailable"]
    fn child_no_driver() {
        assert!(in_child());
        let Err(err) = CudaDevice::new(0) else {
            panic!("a CUDA device opened without a driver library")
        };
        assert!(
            matches!(
                err,
                DeviceError::Unavailable {
                    backend: "cuda",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("libcuda"), "{err}");
    }

    #[test]
    #[ignore = "run in a child process by cuda_driver_without_device_reports_unavailable"]
    fn child_no_device() {
        assert!(in_child());
        let Err(err) = CudaDevice::new(0) else {
            panic!("a CUDA device opened while cuInit fails")
        };
        assert!(err.to_string().contains("no CUDA-capable device"), "{err}");
    }

    #[test]
    #[ignore = "run in a child process by cuda_allocations_work_through_the_stub_driver"]
    fn child_driver_present() {
        assert!(in_child());
        let device = CudaDevice::new(0).expect("the stub driver should open");
        assert_eq!(device.mem_info().unwrap().total, 64 << 20);
        let alloc = CachingAllocator::new(device);
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let small = alloc.malloc(1000, Stream(0)).unwrap();
        let large = alloc.malloc(30 << 20, Stream(0)).unwrap();
        assert_eq!(small % 512, 0);
        alloc.record_stream(large, Stream(5));
        alloc.free(large).unwrap();
        // Out of memory from the driver goes through the retry ladder to an OOM error.
        assert!(matches!(
            alloc.malloc(100 << 20, Stream(0)),
            Err(Error::OutOfMemory(_))
        ));
        alloc.free(small).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes(), 0);
        assert_eq!(alloc.device().mem_info().unwrap().free, 64 << 20);
        let snap = alloc.snapshot();
        assert!(validate(&snap).is_empty());
        let actions: Vec<Action> = snap.traces()[0].iter().map(|e| e.action).collect();
        assert!(actions.contains(&Action::Oom));
        assert!(actions.contains(&Action::SegmentFree));
    }
}

#[cfg(feature = "hip")]
mod hip {
    use memsnap_format::validate;
    use memsnap_recorder::{
        CachingAllocator, Device, DeviceError, Error, HipDevice, HistoryOptions, Stream,
    };

    use super::*;

    #[test]
    fn hip_missing_library_reports_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let Err(err) = HipDevice::open(&dir.path().join("libamdhip64.so"), 0) else {
            panic!("opened a missing library")
        };
        assert!(
            matches!(err, DeviceError::Unavailable { backend: "hip", .. }),
            "{err}"
        );
    }

    #[test]
    fn hip_runtime_without_device_reports_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_stub(dir.path(), "libamdhip64.so", HIP_STUB, &["-DNO_DEVICE"]);
        let Err(err) = HipDevice::open(&lib, 0) else {
            panic!("opened a device the runtime does not have")
        };
        assert!(err.to_string().contains("hipErrorNoDevice"), "{err}");
    }

    #[test]
    fn hip_allocations_work_through_the_stub_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_stub(dir.path(), "libamdhip64.so", HIP_STUB, &[]);
        let device = HipDevice::open(&lib, 0).unwrap();
        assert_eq!(device.mem_info().unwrap().total, 64 << 20);
        let alloc = CachingAllocator::new(device);
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let a = alloc.malloc(5000, Stream(0)).unwrap();
        let b = alloc.malloc(12 << 20, Stream(0)).unwrap();
        alloc.record_stream(b, Stream(3));
        alloc.free(b).unwrap();
        assert!(matches!(
            alloc.malloc(80 << 20, Stream(0)),
            Err(Error::OutOfMemory(_))
        ));
        alloc.free(a).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.device().mem_info().unwrap().free, 64 << 20);
        assert!(validate(&alloc.snapshot()).is_empty());
    }
}

/// The CUDA backend against a real NVIDIA driver and GPU. These run only where
/// `MEMSNAP_REAL_CUDA=1` is set (`scripts/gpu_check.sh` sets it on a machine with a GPU); without
/// it each prints a notice and returns, as the real-snapshot tests do without their folder.
#[cfg(feature = "cuda")]
mod real_cuda {
    use memsnap_format::{validate, Action};
    use memsnap_recorder::{CachingAllocator, CudaDevice, Device, Error, HistoryOptions, Stream};

    fn real_device() -> Option<CudaDevice> {
        if std::env::var_os("MEMSNAP_REAL_CUDA").is_none() {
            eprintln!("skipped: set MEMSNAP_REAL_CUDA=1 on a machine with an NVIDIA GPU");
            return None;
        }
        Some(CudaDevice::new(0).expect("MEMSNAP_REAL_CUDA is set but device 0 did not open"))
    }

    #[test]
    fn real_cuda_allocator_round_trip_returns_every_byte_to_the_driver() {
        let Some(device) = real_device() else { return };
        let before = device.mem_info().unwrap();
        assert!(before.total >= 1 << 30, "{before:?}");
        let alloc = CachingAllocator::new(device);
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let small = alloc.malloc(1000, Stream(0)).unwrap();
        let large = alloc.malloc(300 << 20, Stream(0)).unwrap();
        assert_eq!(small % 512, 0);
        assert_ne!(small, 0);
        assert_ne!(large, 0);
        // The driver really handed out the large segment.
        let during = alloc.device().mem_info().unwrap();
        assert!(
            before.free - during.free >= 300 << 20,
            "{before:?} {during:?}"
        );
        // A real stream handle: CU_STREAM_PER_THREAD (an arbitrary number would be dereferenced
        // by the driver when the allocator records its event there).
        alloc.record_stream(large, Stream(2));
        alloc.free(large).unwrap();
        alloc.free(small).unwrap();
        // Split and reuse: a freed large segment serves a smaller request without a new segment.
        let reserved = alloc.stats().reserved_bytes();
        let again = alloc.malloc(100 << 20, Stream(0)).unwrap();
        assert_eq!(alloc.stats().reserved_bytes(), reserved);
        alloc.free(again).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes(), 0);
        let after = alloc.device().mem_info().unwrap();
        // Other processes may allocate meanwhile; our 2 MiB + 300 MiB must be back.
        assert!(
            after.free + (16 << 20) >= before.free,
            "{before:?} {after:?}"
        );
        let snap = alloc.snapshot();
        assert!(validate(&snap).is_empty(), "{:?}", validate(&snap));
        let actions: Vec<Action> = snap.traces()[0].iter().map(|e| e.action).collect();
        assert!(actions.contains(&Action::SegmentAlloc), "{actions:?}");
        assert!(actions.contains(&Action::SegmentFree), "{actions:?}");
    }

    #[test]
    fn real_cuda_out_of_memory_goes_through_the_retry_ladder() {
        let Some(device) = real_device() else { return };
        let total = device.mem_info().unwrap().total;
        let alloc = CachingAllocator::new(device);
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let kept = alloc.malloc(64 << 20, Stream(0)).unwrap();
        // More than the card has: cuMemAlloc itself fails, the allocator frees its cache, retries,
        // records an `oom` entry and returns OutOfMemory; the process and the kept block survive.
        let err = alloc.malloc(total + (1 << 30), Stream(0)).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
        // A memory fraction makes a request that the card could serve fail the same way.
        alloc.set_memory_fraction(0.01).unwrap();
        let err = alloc.malloc(total / 50, Stream(0)).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
        alloc.set_memory_fraction(1.0).unwrap();
        let ok = alloc.malloc(total / 50, Stream(0)).unwrap();
        alloc.free(ok).unwrap();
        alloc.free(kept).unwrap();
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes(), 0);
        let snap = alloc.snapshot();
        assert!(validate(&snap).is_empty(), "{:?}", validate(&snap));
        let ooms = snap.traces()[0]
            .iter()
            .filter(|e| e.action == Action::Oom)
            .count();
        assert_eq!(ooms, 2);
    }

    #[test]
    fn real_cuda_threads_share_one_allocator() {
        let Some(device) = real_device() else { return };
        let alloc = std::sync::Arc::new(CachingAllocator::new(device));
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let alloc = alloc.clone();
                // Each thread makes the context current itself (contexts are per thread).
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let size = 512 + (i * 7919 + t * 104729) % (4 << 20);
                        // The legacy default stream and CU_STREAM_PER_THREAD, two real handles.
                        let stream = Stream(if t % 2 == 0 { 0 } else { 2 });
                        let p = alloc.malloc(size, stream).unwrap();
                        alloc.free(p).unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(alloc.stats().allocated_bytes(), 0);
        alloc.empty_cache().unwrap();
        assert_eq!(alloc.stats().reserved_bytes(), 0);
        let snap = alloc.snapshot();
        assert!(validate(&snap).is_empty(), "{:?}", validate(&snap));
    }
}
