//! Python pickles of plain data, and PyTorch memory snapshots stored in them.
//!
//! PyTorch's `torch.cuda.memory._dump_snapshot(path)` pickles the dict returned by
//! `torch.cuda.memory._snapshot()`, and `pytorch.org/memory_viz` reads that file. This module
//! reads and writes such files without Python:
//!
//! - [`from_slice`] decodes any pickle of dicts, lists, tuples, `str`, `bytes`, `int`, `float`,
//!   `bool` and `None` (protocols 0-5) into a [`PickleValue`] tree; malformed or truncated input
//!   is a [`PickleError`] naming the byte offset and opcode, never a panic.
//! - [`to_vec`] encodes a [`PickleValue`] as protocol 4, which `pickle.load` reads.
//!
//! - [`dump_snapshot`] / [`load_snapshot`] convert a [`crate::MemorySnapshot`] to and from the
//!   exact structure `_dump_snapshot` writes.

mod decode;
mod error;
mod opcodes;
mod reader;
mod snapshot;
mod value;
mod writer;

pub use error::PickleError;

/// Whether a file starting with byte `first` is a pickle rather than JSON, for readers that
/// accept both: `PROTO` (0x80, protocols 2 and later), or the first opcode of a protocol-0 or
/// protocol-1 pickle of a dict or list (`(` MARK, `}` `EMPTY_DICT`, `]` `EMPTY_LIST`), none of
/// which can start a JSON document. `berth replay` and `berth memviz` both read such files
/// with [`load_snapshot`] (newcomer defect 15: replay refused the protocol-0 pickles memviz
/// read).
pub fn starts_like_pickle(first: u8) -> bool {
    matches!(first, 0x80 | b'(' | b'}' | b']')
}
pub use reader::{from_slice, memory_budget, BUDGET_FLOOR_BYTES, MAX_DEPTH, MAX_EXPANSION};
pub use snapshot::{
    dump_snapshot, dump_snapshot_with_history, load_snapshot, load_snapshot_with_history,
    snapshot_from_value, snapshot_to_value, HISTORY_RECORDED_KEY,
};
#[cfg(feature = "trace")]
pub use snapshot::{load_trace_pickle, snapshot_trace};
pub use value::PickleValue;
pub use writer::{to_vec, PROTOCOL};
