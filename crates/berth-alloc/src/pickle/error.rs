//! [`PickleError`]: everything that can be wrong with a pickle or a snapshot inside one.

/// A pickle could not be read, or its content is not a PyTorch memory snapshot.
///
/// Every reader error names the byte offset of the offending opcode and the opcode's name
/// (as Python's `pickletools` spells it), so a truncated or corrupted file can be located with
/// `python3 -m pickletools FILE`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PickleError {
    /// The input ends inside an opcode's argument.
    #[error(
        "pickle truncated: opcode {opcode} at byte {offset} needs {needed} more bytes, \
         but the input ends at byte {len}"
    )]
    Truncated {
        /// Byte offset of the opcode whose argument is cut off.
        offset: usize,
        /// Name of the opcode.
        opcode: &'static str,
        /// How many bytes past the end of the input the argument extends, in bytes.
        needed: usize,
        /// Length of the input, in bytes.
        len: usize,
    },
    /// The input ends before a `STOP` opcode (`.`) finished the pickle.
    #[error(
        "pickle truncated: the input ends at byte {offset} without a STOP opcode ('.'); \
         a complete pickle ends with STOP"
    )]
    MissingStop {
        /// Length of the input, in bytes.
        offset: usize,
    },
    /// A byte that is not an opcode of any pickle protocol (0-5).
    #[error(
        "malformed pickle: byte 0x{byte:02x} at byte {offset} is not a pickle opcode \
         (protocols 0-5); the file is corrupt or not a pickle"
    )]
    UnknownOpcode {
        /// Byte offset of the unknown opcode.
        offset: usize,
        /// The byte found.
        byte: u8,
    },
    /// A valid opcode that builds something other than plain data (classes, objects, buffers).
    #[error(
        "unsupported pickle: opcode {opcode} at byte {offset} builds {what}; berth reads only \
         plain data (dict, list, tuple, str, bytes, int, float, bool, None)"
    )]
    Unsupported {
        /// Byte offset of the opcode.
        offset: usize,
        /// Name of the opcode.
        opcode: &'static str,
        /// What the opcode would have built.
        what: &'static str,
    },
    /// A known opcode used in a way no valid pickle does (empty stack, no MARK, wrong type, bad
    /// memo index, invalid UTF-8, ...).
    #[error("malformed pickle: opcode {opcode} at byte {offset}: {reason}")]
    Malformed {
        /// Byte offset of the opcode.
        offset: usize,
        /// Name of the opcode.
        opcode: &'static str,
        /// What was wrong and what was expected.
        reason: String,
    },
    /// The pickle decoded, but a field of the snapshot it should hold is missing or has the
    /// wrong type or value.
    #[error("not a PyTorch memory snapshot: field `{path}`: expected {expected}, found {found}")]
    Schema {
        /// Where in the snapshot, as a Python-like path (`segments[3].blocks[0].state`).
        path: String,
        /// What was expected there.
        expected: String,
        /// What was found (a type name or a value).
        found: String,
    },
}
