//! The tables' Arrow schemas and row builders.
//!
//! Every integer is `Int64` (Spark and Trino have no unsigned 64-bit type), times are
//! `Timestamp(µs, UTC)` (the trace's `time_us`), names are `Utf8`. A builder collects rows and
//! hands them over as a [`RecordBatch`] every [`BATCH_ROWS`] rows, so no table is held whole.

use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Int64Builder, ListBuilder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef, TimeUnit};

/// Rows per record batch handed to the Parquet writer.
pub(crate) const BATCH_ROWS: usize = 64 * 1024;

/// The tables of an export, in the order they are documented.
pub const TABLES: [&str; 7] = [
    "snapshots",
    "devices",
    "allocations",
    "steps",
    "segments",
    "frames",
    "stacks",
];

fn i64_field(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Int64, nullable)
}

fn time_field(name: &str) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        true,
    )
}

fn str_field(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable)
}

fn bool_field(name: &str) -> Field {
    Field::new(name, DataType::Boolean, false)
}

fn time_builder() -> TimestampMicrosecondBuilder {
    TimestampMicrosecondBuilder::new().with_timezone("UTC")
}

/// The schema of a table (one of [`TABLES`]).
pub fn schema(table: &str) -> Option<SchemaRef> {
    let fields = match table {
        "snapshots" => vec![
            i64_field("rank", false),
            str_field("file", false),
            str_field("encoding", false),
            Field::new(
                "devices",
                DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))),
                false,
            ),
            i64_field("entries", false),
            i64_field("segments", false),
            i64_field("frames", false),
            i64_field("stacks", false),
        ],
        "devices" => vec![
            i64_field("rank", false),
            i64_field("device", false),
            i64_field("entries", false),
            i64_field("allocations", false),
            i64_field("peak_bytes", true),
            i64_field("peak_event", true),
            time_field("peak_time"),
            i64_field("peak_reserved_bytes", true),
            i64_field("before_window_bytes", false),
            bool_field("truncated"),
            i64_field("ooms", false),
            str_field("step_method", false),
            i64_field("steps", false),
        ],
        "allocations" => vec![
            i64_field("rank", false),
            i64_field("device", false),
            i64_field("addr", false),
            i64_field("size", false),
            i64_field("block_size", true),
            i64_field("stream", false),
            str_field("origin", false),
            i64_field("alloc_event", true),
            time_field("alloc_time"),
            i64_field("free_requested_event", true),
            time_field("free_requested_time"),
            i64_field("free_completed_event", true),
            time_field("free_completed_time"),
            bool_field("alive_at_end"),
            i64_field("stack_id", true),
            i64_field("site_frame_id", true),
            str_field("site", false),
            str_field("phase", true),
            i64_field("step", true),
            str_field("category", false),
        ],
        "steps" => vec![
            i64_field("rank", false),
            i64_field("device", false),
            i64_field("step", false),
            bool_field("partial"),
            bool_field("warmup"),
            i64_field("start_event", false),
            i64_field("end_event", false),
            time_field("start_time"),
            time_field("end_time"),
            i64_field("peak_event", false),
            time_field("peak_time"),
            i64_field("peak_bytes", false),
            i64_field("start_bytes", false),
            i64_field("end_bytes", false),
            i64_field("min_bytes", false),
            i64_field("forward_start_event", true),
            time_field("forward_start_time"),
            i64_field("backward_start_event", true),
            time_field("backward_start_time"),
            i64_field("optimizer_start_event", true),
            time_field("optimizer_start_time"),
            i64_field("outliving_bytes", false),
            i64_field("optimizer_state_bytes", false),
        ],
        "segments" => vec![
            i64_field("rank", false),
            i64_field("device", false),
            i64_field("address", false),
            i64_field("total_size", false),
            i64_field("allocated_size", false),
            i64_field("stream", false),
            str_field("segment_type", true),
            Field::new("is_expandable", DataType::Boolean, true),
            i64_field("blocks", false),
        ],
        "frames" => vec![
            i64_field("frame_id", false),
            str_field("filename", false),
            i64_field("line", true),
            str_field("name", false),
        ],
        "stacks" => vec![
            i64_field("stack_id", false),
            i64_field("depth", false),
            i64_field("frame_id", false),
        ],
        _ => return None,
    };
    Some(Arc::new(Schema::new(fields)))
}

/// A growing batch of rows of one table.
pub(crate) trait Rows {
    fn len(&self) -> usize;
    /// The rows so far as columns (in schema order); the builder is empty afterwards.
    fn take(&mut self) -> Vec<ArrayRef>;
}

pub(crate) fn batch(schema: &SchemaRef, rows: &mut dyn Rows) -> Result<RecordBatch, ArrowError> {
    RecordBatch::try_new(schema.clone(), rows.take())
}

macro_rules! rows {
    ($name:ident { $($field:ident: $ty:ty = $init:expr),* $(,)? }) => {
        pub(crate) struct $name {
            $(pub $field: $ty,)*
        }
        impl $name {
            pub fn new() -> Self {
                $name { $($field: $init,)* }
            }
        }
        impl Rows for $name {
            fn len(&self) -> usize {
                rows!(@first self $($field)*)
            }
            fn take(&mut self) -> Vec<ArrayRef> {
                vec![$(Arc::new(self.$field.finish()) as ArrayRef,)*]
            }
        }
    };
    (@first $self:ident $first:ident $($rest:ident)*) => {
        $self.$first.len()
    };
}

rows!(SnapshotRows {
    rank: Int64Builder = Int64Builder::new(),
    file: StringBuilder = StringBuilder::new(),
    encoding: StringBuilder = StringBuilder::new(),
    devices: ListBuilder<Int64Builder> = ListBuilder::new(Int64Builder::new()),
    entries: Int64Builder = Int64Builder::new(),
    segments: Int64Builder = Int64Builder::new(),
    frames: Int64Builder = Int64Builder::new(),
    stacks: Int64Builder = Int64Builder::new(),
});

rows!(DeviceRows {
    rank: Int64Builder = Int64Builder::new(),
    device: Int64Builder = Int64Builder::new(),
    entries: Int64Builder = Int64Builder::new(),
    allocations: Int64Builder = Int64Builder::new(),
    peak_bytes: Int64Builder = Int64Builder::new(),
    peak_event: Int64Builder = Int64Builder::new(),
    peak_time: TimestampMicrosecondBuilder = time_builder(),
    peak_reserved_bytes: Int64Builder = Int64Builder::new(),
    before_window_bytes: Int64Builder = Int64Builder::new(),
    truncated: BooleanBuilder = BooleanBuilder::new(),
    ooms: Int64Builder = Int64Builder::new(),
    step_method: StringBuilder = StringBuilder::new(),
    steps: Int64Builder = Int64Builder::new(),
});

rows!(AllocationRows {
    rank: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    device: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    addr: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    size: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    block_size: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    stream: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    origin: StringBuilder = StringBuilder::new(),
    alloc_event: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    alloc_time: TimestampMicrosecondBuilder = time_builder(),
    free_requested_event: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    free_requested_time: TimestampMicrosecondBuilder = time_builder(),
    free_completed_event: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    free_completed_time: TimestampMicrosecondBuilder = time_builder(),
    alive_at_end: BooleanBuilder = BooleanBuilder::with_capacity(BATCH_ROWS),
    stack_id: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    site_frame_id: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    site: StringBuilder = StringBuilder::new(),
    phase: StringBuilder = StringBuilder::new(),
    step: Int64Builder = Int64Builder::with_capacity(BATCH_ROWS),
    category: StringBuilder = StringBuilder::new(),
});

rows!(StepRows {
    rank: Int64Builder = Int64Builder::new(),
    device: Int64Builder = Int64Builder::new(),
    step: Int64Builder = Int64Builder::new(),
    partial: BooleanBuilder = BooleanBuilder::new(),
    warmup: BooleanBuilder = BooleanBuilder::new(),
    start_event: Int64Builder = Int64Builder::new(),
    end_event: Int64Builder = Int64Builder::new(),
    start_time: TimestampMicrosecondBuilder = time_builder(),
    end_time: TimestampMicrosecondBuilder = time_builder(),
    peak_event: Int64Builder = Int64Builder::new(),
    peak_time: TimestampMicrosecondBuilder = time_builder(),
    peak_bytes: Int64Builder = Int64Builder::new(),
    start_bytes: Int64Builder = Int64Builder::new(),
    end_bytes: Int64Builder = Int64Builder::new(),
    min_bytes: Int64Builder = Int64Builder::new(),
    forward_start_event: Int64Builder = Int64Builder::new(),
    forward_start_time: TimestampMicrosecondBuilder = time_builder(),
    backward_start_event: Int64Builder = Int64Builder::new(),
    backward_start_time: TimestampMicrosecondBuilder = time_builder(),
    optimizer_start_event: Int64Builder = Int64Builder::new(),
    optimizer_start_time: TimestampMicrosecondBuilder = time_builder(),
    outliving_bytes: Int64Builder = Int64Builder::new(),
    optimizer_state_bytes: Int64Builder = Int64Builder::new(),
});

rows!(SegmentRows {
    rank: Int64Builder = Int64Builder::new(),
    device: Int64Builder = Int64Builder::new(),
    address: Int64Builder = Int64Builder::new(),
    total_size: Int64Builder = Int64Builder::new(),
    allocated_size: Int64Builder = Int64Builder::new(),
    stream: Int64Builder = Int64Builder::new(),
    segment_type: StringBuilder = StringBuilder::new(),
    is_expandable: BooleanBuilder = BooleanBuilder::new(),
    blocks: Int64Builder = Int64Builder::new(),
});

rows!(FrameRows {
    frame_id: Int64Builder = Int64Builder::new(),
    filename: StringBuilder = StringBuilder::new(),
    line: Int64Builder = Int64Builder::new(),
    name: StringBuilder = StringBuilder::new(),
});

rows!(StackRows {
    stack_id: Int64Builder = Int64Builder::new(),
    depth: Int64Builder = Int64Builder::new(),
    frame_id: Int64Builder = Int64Builder::new(),
});
