# Builds the snapshot of `memviz/tests.rs` in Python and writes what torch 2.15 `_memory_viz.py`
# prints for it. Regenerate: python3 fixture.py fixture path/to/_memory_viz.py
import sys

import importlib.util
spec = importlib.util.spec_from_file_location("mv", sys.argv[2])
mv = importlib.util.module_from_spec(spec); spec.loader.exec_module(mv)
MiB = 1 << 20
A = [{'name': 'forward', 'filename': '/home/u/model.py', 'line': 54},
     {'name': 'PyEval_EvalFrame', 'filename': 'ceval.c', 'line': 0},
     {'name': '<module>', 'filename': 'C:\\train\\train.py', 'line': 10}]
B = [{'name': "it's \"q\"", 'filename': 'x/y.py', 'line': 3}]
HIDDEN = [{'name': 'torch::unwind::unwind()', 'filename': '', 'line': 0}]
base = 0x7f0000000000
snap = {
 'segments': [
  {'device': 0, 'address': base, 'total_size': 45 * MiB, 'allocated_size': 30 * MiB, 'active_size': 30 * MiB,
   'requested_size': 25 * MiB, 'stream': 0, 'segment_type': 'large', 'segment_pool_id': (0, 0), 'is_expandable': False,
   'blocks': [
     {'address': base, 'size': 30 * MiB, 'requested_size': 25 * MiB, 'state': 'active_allocated', 'frames': A},
     {'address': base + 30 * MiB, 'size': 15 * MiB, 'requested_size': 8, 'state': 'inactive', 'frames': []}],
   'frames': B},
  {'device': 0, 'address': base + 64 * MiB, 'total_size': 22 * MiB, 'allocated_size': 3 * MiB, 'active_size': 3 * MiB,
   'requested_size': 3 * MiB, 'stream': 140000, 'segment_type': 'large', 'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],
   'blocks': [
     {'address': base + 64 * MiB, 'size': 1 * MiB, 'requested_size': 1 * MiB, 'state': 'active_allocated', 'frames': HIDDEN},
     {'address': base + 65 * MiB, 'size': 1 * MiB, 'requested_size': 1 * MiB, 'state': 'active_allocated', 'frames': B},
     {'address': base + 66 * MiB, 'size': 1 * MiB, 'requested_size': 1 * MiB, 'state': 'active_allocated', 'frames': []},
     {'address': base + 67 * MiB, 'size': 19 * MiB, 'requested_size': 0, 'state': 'inactive', 'frames': []}]},
  {'device': 1, 'address': 0x10000000, 'total_size': 2 * MiB, 'allocated_size': 1536, 'stream': 0,
   'blocks': [
     {'size': 1024, 'state': 'active_allocated', 'history': [
        {'addr': 0x10000000, 'real_size': 800, 'frames': A}, {'addr': 0x10000000, 'real_size': 100}]},
     {'size': 512, 'state': 'active_allocated', 'requested_size': 500},
     {'size': 2 * MiB - 1536, 'state': 'inactive'}]},
 ],
 'device_traces': [[
   {'action': 'segment_alloc', 'addr': 0x5000, 'size': 2 * MiB, 'stream': 0, 'time_us': 1, 'frames': B},
   {'action': 'alloc', 'addr': 0x5200, 'size': 512, 'stream': 0, 'time_us': 2},
   {'action': 'alloc', 'addr': base + 2048, 'size': 1000, 'stream': 0, 'time_us': 3},
   {'action': 'alloc', 'addr': 0x99, 'size': 3 * 1024 ** 3, 'stream': 0, 'time_us': 4},
   {'action': 'free_requested', 'addr': 0x5200, 'size': 512, 'stream': 0, 'time_us': 5},
   {'action': 'free_completed', 'addr': 0x5200, 'size': 512, 'stream': 0, 'time_us': 6},
   {'action': 'free_completed', 'addr': 0x1234, 'size': 77, 'stream': 0, 'time_us': 7},
   {'action': 'segment_free', 'addr': 0x5000, 'size': 2 * MiB, 'stream': 0, 'time_us': 8},
   {'action': 'segment_free', 'addr': 0x6000, 'size': 2 * MiB, 'stream': 0, 'time_us': 9},
   {'action': 'segment_alloc', 'addr': 0x5000, 'size': 4 * MiB, 'stream': 0, 'time_us': 10},
   {'action': 'alloc', 'addr': 0x5000 + 3 * MiB, 'size': 5, 'stream': 0, 'time_us': 11},
   {'action': 'oom', 'device_free': 95682560, 'size': 5308694528, 'stream': 0, 'time_us': 12, 'compile_context': 'N/A', 'user_metadata': ''},
   {'action': 'annotate', 'addr': base + 2048, 'size': 0, 'stream': 0, 'time_us': 13, 'user_metadata': 'tag {"k": 1}'},
   {'action': 'segment_map', 'addr': 0x9000, 'size': 2 * MiB, 'stream': 7, 'time_us': 14, 'compile_context': 'N/A', 'user_metadata': "it's", 'frames': B},
   {'action': 'snapshot', 'addr': 0, 'size': 123, 'stream': 0, 'time_us': 15},
   {'action': 'weird', 'addr': 1, 'size': 2, 'stream': -3, 'extra_f': 0.1, 'extra_t': (1,), 'extra_n': None, 'extra_b': b"a'\x00", 'extra_big': 2 ** 64},
 ] + [{'action': 'alloc', 'addr': 0x100000 + i * 512, 'size': 512, 'stream': 0} for i in range(30)],
 [],
 [{'frames': B, 'cpp_frames': ['c++ frame'], 'action': 'segment_unmap', 'addr': 5, 'size': 6, 'stream': 0}],
 ],
}
out = sys.argv[1]
open(out + ".stats.txt", "w").write(mv.segsum(snap) + "\n")
open(out + ".trace.txt", "w").write(mv.trace(snap) + "\n")
open(out + ".segments.txt", "w").write(mv.segments(snap, format_flamegraph=lambda x: x))
open(out + ".memory.txt", "w").write(mv.memory(snap, format_flamegraph=lambda x: x))
