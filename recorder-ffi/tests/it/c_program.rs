//! A C program compiled with gcc against `memsnap.h` and `libmemsnap_recorder.a`.

use std::path::Path;
use std::process::Command;

use memsnap_format::{validate, Action, BlockState};

use super::{alloc_frames, built_library, have_program};

const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "memsnap.h"

#define MiB (1024 * 1024)
#define LAYERS 4

static int failures = 0;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "check failed: %s (line %d): %s\n", \
    #cond, __LINE__, memsnap_last_error()); failures++; } } while (0)

/* Activations kept for backward: the up-slope. Non-static so the symbol names the frame. */
void forward_pass(void *activations[LAYERS]) {
    for (int i = 0; i < LAYERS; i++) {
        activations[i] = memsnap_alloc((size_t)(i + 1) * MiB, 0, NULL);
        CHECK(activations[i] != NULL);
        if (activations[i]) memset(activations[i], i, (size_t)(i + 1) * MiB); /* real memory */
    }
}

/* Freed in reverse order while gradients come and go: the down-slope. */
void backward_pass(void *activations[LAYERS]) {
    for (int i = LAYERS - 1; i >= 0; i--) {
        void *grad = memsnap_alloc(4096, 0, NULL);
        CHECK(grad != NULL);
        memsnap_free(grad, 4096, 0, NULL);
        memsnap_free(activations[i], (size_t)(i + 1) * MiB, 0, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s SNAPSHOT\n", argv[0]); return 2; }
    CHECK(memsnap_init("host") == MEMSNAP_OK);
    CHECK(memsnap_record_history("all", "all", "native", 0) == MEMSNAP_OK);

    void *activations[LAYERS];
    for (int step = 0; step < 2; step++) {
        char name[32];
        snprintf(name, sizeof name, "ProfilerStep#%d", step);
        CHECK(memsnap_annotate(0, "START", name) == MEMSNAP_OK);
        forward_pass(activations);
        backward_pass(activations);
        CHECK(memsnap_annotate(0, "END", name) == MEMSNAP_OK);
    }
    void *kept = memsnap_alloc(3 * MiB, 0, NULL);
    CHECK(kept != NULL);

    /* What PyTorch's pluggable allocator may do. */
    CHECK(memsnap_alloc(0, 0, NULL) == NULL);
    memsnap_free(NULL, 0, 0, NULL);

    /* Bad input is a status and a message, never a crash. */
    memsnap_free((void *)0x1234, 16, 0, NULL);
    CHECK(strstr(memsnap_last_error(), "0x1234") != NULL);
    CHECK(memsnap_dump_snapshot(NULL) == MEMSNAP_ERR_INVALID_ARGUMENT);
    CHECK(memsnap_record_history("sometimes", NULL, NULL, 0) == MEMSNAP_ERR_INVALID_ARGUMENT);
    CHECK(memsnap_alloc(16, -1, NULL) == NULL);
    CHECK(memsnap_annotate(0, NULL, "x") == MEMSNAP_ERR_INVALID_ARGUMENT);
    CHECK(memsnap_annotate(0, "", "x") == MEMSNAP_ERR_INVALID_ARGUMENT);
    CHECK(memsnap_annotate(-1, "START", "x") == MEMSNAP_ERR_INVALID_ARGUMENT);

    memsnap_stats stats;
    CHECK(memsnap_get_stats(0, &stats) == MEMSNAP_OK);
    CHECK(stats.allocated_bytes_current >= 3 * MiB);
    CHECK(stats.allocated_bytes_peak >= 10 * MiB);
    CHECK(stats.reserved_bytes_current >= stats.allocated_bytes_current);
    size_t needed = 0;
    CHECK(memsnap_stats_json(0, NULL, 0, &needed) == MEMSNAP_ERR_INVALID_ARGUMENT);
    char *json = malloc(needed + 1);
    CHECK(memsnap_stats_json(0, json, needed + 1, &needed) == MEMSNAP_OK);
    CHECK(strstr(json, "\"allocated_bytes.all.current\":") != NULL);
    free(json);

    CHECK(memsnap_dump_snapshot(argv[1]) == MEMSNAP_OK);
    memsnap_free(kept, 3 * MiB, 0, NULL);
    CHECK(memsnap_empty_cache() == MEMSNAP_OK);
    printf("peak %llu bytes, %d failures\n", (unsigned long long)stats.allocated_bytes_peak, failures);
    return failures == 0 ? 0 : 1;
}
"#;

#[test]
fn a_c_program_links_the_static_library_and_dumps_a_valid_snapshot() {
    if !have_program("gcc", "the C ABI test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("pattern.c");
    let program = dir.path().join("pattern");
    let snapshot_path = dir.path().join("c.pickle");
    std::fs::write(&source, PROGRAM).unwrap();

    compile(&source, &program, &["-O0"]);

    let run = Command::new(&program)
        .arg(&snapshot_path)
        .env_remove("MEMSNAP_DUMP")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the C program failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );

    // The library and this program (-O0) keep frame pointers: no warning.
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!stderr.contains("lacks frame pointers"), "{stderr}");

    let (snapshot, _) = memsnap_format::read_path(&snapshot_path).unwrap();
    assert_eq!(
        validate(&snapshot),
        vec![],
        "the snapshot breaks an invariant"
    );
    // The markers, in order, as ranges around each step's allocations.
    let marks: Vec<(&str, &str)> = snapshot
        .external_annotations
        .iter()
        .flatten()
        .map(|a| (a.stage().unwrap(), a.name().unwrap()))
        .collect();
    assert_eq!(
        marks,
        [
            ("START", "ProfilerStep#0"),
            ("END", "ProfilerStep#0"),
            ("START", "ProfilerStep#1"),
            ("END", "ProfilerStep#1"),
        ]
    );
    let trace = &snapshot.traces()[0];
    let alloc_sizes: Vec<u64> = trace
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.size)
        .collect();
    const MIB: u64 = 1 << 20;
    let step = [MIB, 2 * MIB, 3 * MIB, 4 * MIB, 4096, 4096, 4096, 4096];
    let expected: Vec<u64> = step.iter().chain(&step).copied().chain([3 * MIB]).collect();
    assert_eq!(alloc_sizes, expected);
    let frees = trace
        .iter()
        .filter(|e| e.action == Action::FreeCompleted)
        .count();
    assert_eq!(
        frees, 16,
        "every step frees its 4 activations and 4 gradients"
    );

    // Native stacks name the C functions that allocated.
    let stacks = alloc_frames(&snapshot);
    // memsnap's own frames are trimmed: the stack starts at the C code that allocated.
    assert_eq!(stacks[0][0].0, "forward_pass", "{:?}", stacks[0]);
    assert_eq!(stacks[0][1].0, "main", "{:?}", stacks[0]);
    assert!(stacks[4].iter().any(|(name, _, _)| name == "backward_pass"));

    // The kept 3 MiB tensor is the one live block.
    let live: Vec<u64> = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.requested_size.unwrap_or(0))
        .collect();
    assert_eq!(live, vec![3 * MIB]);
}

/// Compiles `source` against `memsnap.h` and the static library.
fn compile(source: &Path, program: &Path, flags: &[&str]) {
    let library = built_library("libmemsnap_recorder.a");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let compiled = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-I")
        .arg(&include)
        .arg(source)
        .arg(&library)
        .args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
            "-o",
        ])
        .arg(program)
        .output()
        .unwrap();
    assert!(
        compiled.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
}

/// A host whose own code has no frame pointers: allocations twelve calls deep, `rbp` used as
/// an ordinary register on the way.
const NO_FRAME_POINTER_PROGRAM: &str = r#"
#include <stddef.h>
#include "memsnap.h"

long layer(int depth, long a, long b, long c, long d, long e);
/* Called through a volatile pointer so gcc neither inlines the recursion nor turns it into a
   loop: twelve real frames. */
static long (*volatile next_layer)(int, long, long, long, long, long) = layer;

/* Keeps many values live across the call so gcc needs rbp as a general register. */
long layer(int depth, long a, long b, long c, long d, long e) {
    long f = a * 3 + b, g = b * 5 + c, h = c * 7 + d, i = d * 11 + e, j = e * 13 + a;
    long k = f ^ g, l = g ^ h, m = h ^ i, n = i ^ j, o = j ^ f;
    long r;
    if (depth == 0) {
        for (int t = 0; t < 50; t++) {
            void *p = memsnap_alloc(4096, 0, NULL);
            memsnap_free(p, 4096, 0, NULL);
        }
        r = 1;
    } else {
        r = next_layer(depth - 1, k, l, m, n, o);
    }
    return r + f + g + h + i + j + k + l + m + n + o;
}

int main(int argc, char **argv) {
    (void)argv;
    if (memsnap_init("host") != MEMSNAP_OK) return 2;
    if (memsnap_record_history("all", "all", "native", 0) != MEMSNAP_OK) return 2;
    return layer(11 + argc, 1, 2, 3, 4, 5) == 0 ? 3 : 0;
}
"#;

/// The stderr of [`NO_FRAME_POINTER_PROGRAM`] compiled with `flags`.
fn deep_program_stderr(flags: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("deep.c");
    let program = dir.path().join("deep");
    std::fs::write(&source, NO_FRAME_POINTER_PROGRAM).unwrap();
    compile(&source, &program, flags);
    let run = Command::new(&program)
        .env_remove("MEMSNAP_DUMP")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "the C program failed:\n{stderr}");
    stderr
}

#[test]
fn a_host_without_frame_pointers_gets_one_warning() {
    if !have_program("gcc", "the frame-pointer warning test") {
        return;
    }
    let stderr = deep_program_stderr(&["-O2", "-fomit-frame-pointer"]);
    // 100 captures, one warning, naming the fix.
    assert_eq!(
        stderr.matches("lacks frame pointers").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("-fno-omit-frame-pointer"), "{stderr}");
    // The fix the warning names silences it.
    let stderr = deep_program_stderr(&["-O2", "-fno-omit-frame-pointer"]);
    assert!(!stderr.contains("lacks frame pointers"), "{stderr}");
}
