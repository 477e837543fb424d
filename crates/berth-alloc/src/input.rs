//! Reading an input file whole, with a size cap.
//!
//! Note [Bounded reads]: a snapshot pickle, a safetensors file or a piped trace is read into
//! memory before it is decoded. A regular file's size is known before it is read; a character
//! device or a pipe has none, and `/dev/zero` given to `berth memviz`, `berth replay` or
//! `berth eval --load` was read until the process was killed (newcomer defect 8). Every such
//! read is capped at [`max_input_bytes`] (1 GiB unless `BERTH_MAX_INPUT_BYTES` says otherwise):
//! a regular file over the cap is refused before a byte is read, a stream once it passes the
//! cap, and the error names the cap and the variable that raises it.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The cap of [`max_input_bytes`] when `BERTH_MAX_INPUT_BYTES` is unset (1 GiB).
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 30;

/// The environment variable that sets [`max_input_bytes`] (a number of bytes).
pub const MAX_INPUT_BYTES_VAR: &str = "BERTH_MAX_INPUT_BYTES";

/// The most bytes of one input file berth reads whole, in bytes: `BERTH_MAX_INPUT_BYTES` if it
/// holds a positive integer, else [`DEFAULT_MAX_INPUT_BYTES`].
pub fn max_input_bytes() -> u64 {
    std::env::var(MAX_INPUT_BYTES_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(DEFAULT_MAX_INPUT_BYTES)
}

/// Why an input file could not be read whole.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file holds more than the cap (a stream such as `/dev/zero` may never end).
    #[error("{path} holds more than {max_bytes} bytes, the most berth reads of one input file ({what}); set {MAX_INPUT_BYTES_VAR}=<bytes> to raise the cap")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap, in bytes.
        max_bytes: u64,
        /// `"a regular file of N bytes"` or `"a stream, read up to the cap"`.
        what: String,
    },
}

/// Reads `path` whole, refusing more than `max_bytes` bytes (Note [Bounded reads]).
///
/// # Errors
/// [`InputError::Io`] when the file cannot be opened or read; [`InputError::TooLarge`] when a
/// regular file is larger than `max_bytes` (nothing is read) or a stream yields more.
pub fn read_capped(path: &Path, max_bytes: u64) -> Result<Vec<u8>, InputError> {
    let (file, _) = open_capped(path, max_bytes)?;
    read_rest_capped(file, path, Vec::new(), max_bytes)
}

/// Opens `path` for a capped read: the file and its length when it is a regular file
/// (`None` for a stream), refusing a regular file over `max_bytes` before reading anything.
///
/// # Errors
/// As [`read_capped`].
pub fn open_capped(
    path: &Path,
    max_bytes: u64,
) -> Result<(std::fs::File, Option<u64>), InputError> {
    let io = |source| InputError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_file() && meta.len() > max_bytes {
        return Err(InputError::TooLarge {
            path: path.to_owned(),
            max_bytes,
            what: format!("a regular file of {} bytes", meta.len()),
        });
    }
    Ok((file, meta.is_file().then_some(meta.len())))
}

/// The rest of `reader` (the file at `path`, for errors) after the bytes `head` already read
/// from it, refusing more than `max_bytes` bytes in all: for a stream whose first bytes were
/// read to decide what it is (Note [Bounded reads]).
///
/// # Errors
/// [`InputError::Io`] when the read fails; [`InputError::TooLarge`] past `max_bytes`.
pub fn read_rest_capped(
    reader: impl Read,
    path: &Path,
    head: Vec<u8>,
    max_bytes: u64,
) -> Result<Vec<u8>, InputError> {
    let mut out = head;
    let left = max_bytes.saturating_sub(out.len() as u64).saturating_add(1);
    reader
        .take(left)
        .read_to_end(&mut out)
        .map_err(|source| InputError::Io {
            path: path.to_owned(),
            source,
        })?;
    if out.len() as u64 > max_bytes {
        return Err(InputError::TooLarge {
            path: path.to_owned(),
            max_bytes,
            what: "a stream, read up to the cap".to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_read_only_to_the_cap() {
        let err = read_capped(Path::new("/dev/zero"), 1000).unwrap_err();
        assert!(
            matches!(&err, InputError::TooLarge { max_bytes: 1000, what, .. } if what.contains("stream")),
            "{err:?}"
        );
        assert!(err.to_string().contains("BERTH_MAX_INPUT_BYTES"), "{err}");
    }

    #[test]
    fn a_regular_file_over_the_cap_is_refused_unread_and_one_within_is_read() {
        let path = std::env::temp_dir().join(format!("berth-input-{}", std::process::id()));
        std::fs::write(&path, [7u8; 100]).unwrap();
        let err = read_capped(&path, 99).unwrap_err();
        assert!(
            matches!(&err, InputError::TooLarge { max_bytes: 99, what, .. } if what == "a regular file of 100 bytes"),
            "{err:?}"
        );
        assert_eq!(read_capped(&path, 100).unwrap(), vec![7u8; 100]);
        std::fs::remove_file(&path).ok();
    }
}
