/*
 * memsnap.h: the C ABI of memsnap's recorder (libmemsnap_recorder.so / .a).
 *
 * The library is a caching allocator with PyTorch's behaviour that records every allocation
 * with its stack and writes PyTorch-compatible memory snapshots (the pickle that
 * torch.cuda.memory._dump_snapshot() writes, readable by pytorch.org/memory_viz and
 * `memsnap view`).
 *
 * Rules that hold for every function here:
 *   - Nothing ever aborts or unwinds into the caller. Functions that can fail return an int
 *     status (MEMSNAP_OK = 0, otherwise one of the MEMSNAP_ERR_* codes) and memsnap_last_error()
 *     gives the message. memsnap_alloc returns NULL on failure; memsnap_free never fails.
 *   - The allocator is created on first use from the environment (see below), or explicitly
 *     with memsnap_init().
 *   - Every function is thread-safe.
 *
 * Environment (read once, at first use):
 *   MEMSNAP_BACKEND      cuda | hip | host | simulated        (default: cuda)
 *   MEMSNAP_DEVICE_MEMORY  bytes per simulated/host device, e.g. 80GiB (default 80GiB)
 *   MEMSNAP_HISTORY      off | state | all                    (default: all if MEMSNAP_DUMP or
 *                                                              MEMSNAP_LIVE is set, else off)
 *   MEMSNAP_CONTEXT      never | state | alloc | all          (default: all)
 *   MEMSNAP_MAX_ENTRIES  ring-buffer size per device          (default: 1000000)
 *   MEMSNAP_STACKS       none | native | python | all         (default: native; python and all
 *                                                              add CPython frames when the
 *                                                              library runs inside python)
 *   MEMSNAP_DUMP         snapshot path written at exit and on out-of-memory
 *   MEMSNAP_DUMP_ON_SIGUSR1=1  also write MEMSNAP_DUMP when the process gets SIGUSR1
 *   MEMSNAP_ALLOC_CONF   allocator settings, PYTORCH_CUDA_ALLOC_CONF syntax
 *                        (falls back to PYTORCH_CUDA_ALLOC_CONF when unset)
 *   MEMSNAP_LIVE         1 | unix:/path.sock | tcp:127.0.0.1:PORT: publish each device's history
 *                        while it records (`memsnap watch ADDR`), from the moment its allocator
 *                        is created; the address is printed on stderr ("memsnap: live at ...").
 *                        1 is a private socket named after the pid; device d > 0 gets
 *                        path.d / port + d. A failure to listen is printed on stderr and the
 *                        run goes on without it. 0 or off: none.
 *   MEMSNAP_LIVE_TOKEN   token (16+ bytes) each live listener must send first (memsnap watch
 *                        --token); required for a non-loopback address (tcp:0.0.0.0:PORT)
 *
 * Zero-code use with PyTorch: see recorder-ffi/python/memsnap_torch.py.
 * Linking a C program against the static library (Linux):
 *   cc app.c -Irecorder-ffi/include target/release/libmemsnap_recorder.a \
 *      -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
 */
#ifndef MEMSNAP_H
#define MEMSNAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define MEMSNAP_OK 0
/** An argument is invalid (NULL path, unknown option string, negative device, ...). */
#define MEMSNAP_ERR_INVALID_ARGUMENT 1
/** The device is out of memory. */
#define MEMSNAP_ERR_OUT_OF_MEMORY 2
/** Reading or writing a file failed. */
#define MEMSNAP_ERR_IO 3
/** The backend (CUDA, HIP, ...) failed or is not available. */
#define MEMSNAP_ERR_BACKEND 4
/** A bug inside memsnap was caught before it could reach the caller. */
#define MEMSNAP_ERR_INTERNAL 5

/* ---- The two functions torch.cuda.memory.CUDAPluggableAllocator calls. ---------------- */

/**
 * Allocates `size` bytes on `device` for use on `stream` (a cudaStream_t/hipStream_t; NULL is
 * the default stream). `size` 0 returns NULL without error, as PyTorch expects.
 * Returns NULL on failure (see memsnap_last_error()).
 */
void *memsnap_alloc(size_t size, int device, void *stream);

/**
 * memsnap_alloc with its status: stores the pointer (NULL on failure) in *out and returns
 * MEMSNAP_OK, MEMSNAP_ERR_OUT_OF_MEMORY when the device has no room, or another code. For
 * wrappers that raise their framework's out-of-memory error (memsnap.torch's C++ shim).
 */
int memsnap_alloc_checked(size_t size, int device, void *stream, void **out);

/**
 * Frees a pointer returned by memsnap_alloc on `device`. `size` and `stream` are the values of
 * the allocation (PyTorch passes them; memsnap knows them already and ignores them). Freeing
 * NULL, or a pointer this library did not allocate, does nothing (the latter sets
 * memsnap_last_error()).
 */
void memsnap_free(void *ptr, size_t size, int device, void *stream);

/* ---- Optional hooks of CUDAPluggableAllocator (set_*_fn). --------------------------------- */

/** set_init_fn: creates the allocator (from the environment) for `device_count` devices. */
void memsnap_init_hook(int device_count);
/** set_reset_fn: called by torch.cuda.empty_cache(); releases cached segments. */
void memsnap_reset_hook(void);
/** set_memory_fraction_fn: torch.cuda.set_per_process_memory_fraction(fraction, device). */
void memsnap_memory_fraction_hook(double fraction, int device);
/** set_record_stream_fn: tensor.record_stream(stream). */
void memsnap_record_stream_hook(void *ptr, void *stream);

/* ---- Control. ------------------------------------------------------------------------------ */

/**
 * Creates the allocator now. `backend` is "cuda", "hip", "host" or "simulated"; NULL reads
 * MEMSNAP_BACKEND. Fails if the allocator already exists with another backend.
 */
int memsnap_init(const char *backend);

/**
 * Starts, changes or stops history recording, like torch.cuda.memory._record_memory_history.
 *   enabled:     "off" (or NULL: stop and clear), "state", "all"
 *   context:     "never", "state", "alloc", "all" (NULL: "all")
 *   stacks:      "none", "native", "python", "all" (NULL: "native")
 *   max_entries: ring-buffer size per device; 0 means the default (1000000)
 */
int memsnap_record_history(const char *enabled, const char *context, const char *stacks,
                           size_t max_entries);

/**
 * Writes a snapshot of every device to `path` atomically. The format comes from the file name
 * (.pickle, .msgpack, .json, optionally .gz/.zst); anything else is written as a pickle.
 */
int memsnap_dump_snapshot(const char *path);

/**
 * Path written when an allocation fails for lack of memory (NULL stops dumping on OOM).
 * The snapshot then ends with the `oom` entry.
 */
int memsnap_set_oom_dump_path(const char *path);

/** Releases every cached, unused segment back to the device (torch.cuda.empty_cache()). */
int memsnap_empty_cache(void);

/** Caps the memory memsnap may reserve on `device` at `fraction` of its capacity (0 < f <= 1). */
int memsnap_set_memory_fraction(double fraction, int device);

/** Marks `ptr` as used on `stream`: it is reused only when that stream's work is done. */
int memsnap_record_stream(void *ptr, void *stream);

/** The main counters of one device, named after torch.cuda.memory_stats() keys. */
typedef struct memsnap_stats {
    uint64_t allocated_bytes_current; /* allocated_bytes.all.current */
    uint64_t allocated_bytes_peak;    /* allocated_bytes.all.peak */
    uint64_t reserved_bytes_current;  /* reserved_bytes.all.current */
    uint64_t reserved_bytes_peak;     /* reserved_bytes.all.peak */
    uint64_t active_bytes_current;    /* active_bytes.all.current */
    uint64_t active_bytes_peak;       /* active_bytes.all.peak */
    uint64_t requested_bytes_current; /* requested_bytes.all.current */
    uint64_t allocation_current;      /* allocation.all.current */
    uint64_t segment_current;         /* segment.all.current */
    uint64_t num_alloc_retries;       /* num_alloc_retries */
    uint64_t num_ooms;                /* num_ooms */
} memsnap_stats;

/** Fills `out` with the counters of `device`. */
int memsnap_get_stats(int device, memsnap_stats *out);

/**
 * Every counter of `device` as one JSON object with torch.cuda.memory_stats()'s flat keys
 * ("allocated_bytes.all.current", ...). Writes at most `capacity` bytes including the final
 * NUL into `buf` and the full length (without NUL) into `*needed`; call with capacity 0 to ask
 * the length. Returns MEMSNAP_ERR_INVALID_ARGUMENT when the buffer is too small.
 */
int memsnap_stats_json(int device, char *buf, size_t capacity, size_t *needed);

/**
 * Starts publishing `device`'s history at `addr` (NULL or "1": a private unix socket named
 * after the pid; "unix:/path.sock"; "tcp:127.0.0.1:PORT", loopback only, port 0 picks one) for
 * `memsnap watch` and other listeners, until the process exits. Creates the device's allocator
 * if needed and prints the address on stderr. History must be on for entries to flow. Fails
 * (MEMSNAP_ERR_INVALID_ARGUMENT) for a bad address or a device already published,
 * (MEMSNAP_ERR_IO) when the socket cannot be made; the allocator is unaffected either way.
 */
int memsnap_serve_live(int device, const char *addr);

/**
 * The address `device`'s history is published at ("unix:/..." or "tcp:127.0.0.1:PORT", as
 * `memsnap watch` takes it), with memsnap_stats_json's buffer convention. Returns
 * MEMSNAP_ERR_INVALID_ARGUMENT when the device is not published (*needed is then 0).
 */
int memsnap_live_address(int device, char *buf, size_t capacity, size_t *needed);

/**
 * Records an annotation of `device`'s history, as PyTorch's `record_function` markers are
 * recorded: `{"stage": stage, "name": name}` stamped with the history clock, written to the
 * snapshot's `external_annotations` and sent to live listeners. A range is a "START" and an
 * "END" of the same name; memsnap's analysis reads `ProfilerStep#N` as a step, optimizer and
 * backward names as phases, and `memsnap.module: PATH` (what `memsnap.torch.enable(modules=True)`
 * records around each module's forward) as the module that allocated. Nothing is recorded
 * while history is off. Fails (MEMSNAP_ERR_INVALID_ARGUMENT) for a NULL, empty-stage or
 * non-UTF-8 argument or a device out of range.
 */
int memsnap_annotate(int device, const char *stage, const char *name);

/**
 * The message of the last failure on this thread ("" if none). The string stays valid until
 * the next failing memsnap call on the same thread.
 */
const char *memsnap_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MEMSNAP_H */
