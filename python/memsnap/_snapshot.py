"""memsnap.open: a typed, lazy view of a snapshot, with columns instead of millions of dicts."""

import array as _array
import sys as _sys
from typing import List, NamedTuple, Optional

from . import _memsnap

try:  # NumPy is optional: columns are NumPy arrays when it is installed.
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None

_NUMPY_TYPES = {"u8": "<u8", "i8": "<i8", "u4": "<u4"}
_ARRAY_TYPES = {"u8": "Q", "i8": "q", "u4": "I"}


def _column(data, kind):
    """Little-endian column bytes as a read-only NumPy array (no copy) or an array.array."""
    if _np is not None:
        return _np.frombuffer(data, dtype=_NUMPY_TYPES[kind])
    column = _array.array(_ARRAY_TYPES[kind])
    column.frombytes(data)
    if _sys.byteorder == "big":  # pragma: no cover
        column.byteswap()
    return column


class Frame(NamedTuple):
    """One stack frame, as the snapshot's ``{'filename', 'line', 'name'}`` dict has it."""

    filename: str
    line: int
    name: str


def _frames(raw, stack_id, segments):
    if stack_id < 0:
        return []
    return [Frame(*f) for f in raw.stack(int(stack_id), segments)]


class Segments:
    """The segments (one per ``cudaMalloc``), all devices, as the file lists them.

    Columns (one value per segment): ``device``, ``address``, ``total_size``,
    ``allocated_size``, ``active_size``, ``requested_size`` (0 when the file lacks them),
    ``stream``, ``block_count``; ``segment_type`` is a list of names (``"large"``,
    ``"small"``, ``""`` when absent). :meth:`stack` gives a segment's allocation stack.
    """

    def __init__(self, raw):
        self._raw = raw
        columns = raw.segment_columns()
        self.device = _column(columns["device"], "i8")
        self.address = _column(columns["address"], "u8")
        self.total_size = _column(columns["total_size"], "u8")
        self.allocated_size = _column(columns["allocated_size"], "u8")
        self.active_size = _column(columns["active_size"], "u8")
        self.requested_size = _column(columns["requested_size"], "u8")
        self.stream = _column(columns["stream"], "i8")
        self.block_count = _column(columns["block_count"], "i8")
        self.segment_type: List[str] = columns["segment_type"]
        self._stack = _column(columns["stack"], "i8")

    def __len__(self):
        return len(self.address)

    def __repr__(self):
        return f"<memsnap.Segments: {len(self)} segments, {sum(self.total_size)} bytes reserved>"

    def stack(self, index) -> List[Frame]:
        """Frames (innermost first) of segment ``index``'s allocation; ``[]`` when none."""
        return _frames(self._raw, self._stack[index], True)


class Blocks:
    """Every block of every segment, in segment order.

    Columns: ``segment`` (index into :class:`Segments`), ``address``, ``size``,
    ``requested_size``; ``state_code`` indexes ``state_names`` (``"active_allocated"``,
    ``"active_pending_free"``, ``"inactive"``); ``state`` is the list of names.
    """

    def __init__(self, raw):
        self._raw = raw
        columns = raw.block_columns()
        self.segment = _column(columns["segment"], "i8")
        self.address = _column(columns["address"], "u8")
        self.size = _column(columns["size"], "u8")
        self.requested_size = _column(columns["requested_size"], "u8")
        self.state_code = _column(columns["state"], "u4")
        self.state_names: List[str] = columns["state_names"]
        self._stack = _column(columns["stack"], "i8")

    @property
    def state(self) -> List[str]:
        names = self.state_names
        return [names[c] for c in self.state_code]

    def __len__(self):
        return len(self.address)

    def __repr__(self):
        return f"<memsnap.Blocks: {len(self)} blocks>"

    def stack(self, index) -> List[Frame]:
        """Frames (innermost first) where block ``index`` was allocated; ``[]`` when none."""
        return _frames(self._raw, self._stack[index], True)


class Trace:
    """One device's trace (``snapshot['device_traces'][index]``), oldest event first.

    Columns: ``addr``, ``size``, ``stream``, ``time_us`` (-1 when the file has no times);
    ``action_code`` indexes ``action_names`` (``"alloc"``, ``"free_requested"``, ...);
    ``action`` is the list of names. :meth:`stack` resolves an entry's frames on demand.
    """

    def __init__(self, raw, index):
        self._raw = raw
        self.index = index
        columns = raw.trace_columns(index)
        self.addr = _column(columns["addr"], "u8")
        self.size = _column(columns["size"], "u8")
        self.stream = _column(columns["stream"], "i8")
        self.time_us = _column(columns["time_us"], "i8")
        self.action_code = _column(columns["action"], "u4")
        self.action_names: List[str] = columns["action_names"]
        self._stack = _column(columns["stack"], "i8")

    @property
    def action(self) -> List[str]:
        names = self.action_names
        return [names[c] for c in self.action_code]

    def __len__(self):
        return len(self.addr)

    def __repr__(self):
        return f"<memsnap.Trace {self.index}: {len(self)} entries>"

    def stack(self, index) -> List[Frame]:
        """Frames (innermost first) of entry ``index``; ``[]`` when it has none."""
        return _frames(self._raw, self._stack[index], False)


class Snapshot:
    """A snapshot opened with :func:`memsnap.open`.

    ``segments`` and ``blocks`` are ready as soon as ``open`` returns; ``devices``,
    ``traces``, :meth:`trace` and ``entry_count`` wait for the background decoding of the
    rest of the file (the first call only). A file that is not a snapshot raises
    :class:`memsnap.FormatError`, from ``open`` or from the first query that reaches the bad
    bytes.
    """

    def __init__(self, raw):
        self._raw = raw
        self._segments: Optional[Segments] = None
        self._blocks: Optional[Blocks] = None
        self._traces = {}

    @classmethod
    def _open(cls, path):
        return cls(_memsnap.RawSnapshot.open(path))

    @property
    def path(self) -> str:
        return self._raw.path

    @property
    def segments(self) -> Segments:
        if self._segments is None:
            self._segments = Segments(self._raw)
        return self._segments

    @property
    def blocks(self) -> Blocks:
        if self._blocks is None:
            self._blocks = Blocks(self._raw)
        return self._blocks

    @property
    def devices(self) -> List[int]:
        """Devices with a trace or a segment, ascending."""
        return self._raw.devices()

    @property
    def traces(self) -> List[Trace]:
        """Every device trace, in the file's order (empty when the file has none)."""
        return [self.trace(i) for i in range(self._raw.trace_count())]

    def trace(self, device: int = 0) -> Trace:
        """The trace of ``device`` (its index in ``device_traces``)."""
        if device not in self._traces:
            self._traces[device] = Trace(self._raw, device)
        return self._traces[device]

    @property
    def entry_count(self) -> int:
        """Trace entries over all devices."""
        return sum(len(t) for t in self.traces)

    @property
    def stack_count(self) -> int:
        """Distinct stacks of the whole snapshot."""
        return self._raw.stack_count()

    def is_decoded(self) -> bool:
        """Whether the background decoding has finished (queries will not wait)."""
        return self._raw.is_decoded()

    def wait(self) -> "Snapshot":
        """Waits for the background decoding; raises :class:`memsnap.FormatError` if the rest
        of the file is bad."""
        self._raw.wait()
        return self

    def __repr__(self):
        state = "decoded" if self.is_decoded() else "decoding"
        return f"<memsnap.Snapshot {self.path!r}: {len(self.segments)} segments, {state}>"
