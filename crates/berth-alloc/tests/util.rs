//! Shared helpers for the tests.

use std::path::PathBuf;

/// The five real PyTorch 2.11 allocator traces checked in under `tests/data`.
pub const TRACES: [&str; 5] = [
    "bert_varlen_train",
    "gpt2_generate",
    "gpt2_train",
    "resnet50_train",
    "two_stream_pipeline",
];

/// Path of a trace: `tests/data` (always present), else a `shared/traces` directory beside
/// the checkout.
pub fn trace_path(name: &str) -> Option<PathBuf> {
    let file = format!("{name}.trace.json.gz");
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(&file);
    if local.exists() {
        return Some(local);
    }
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(&file);
    if shared.exists() {
        return Some(shared);
    }
    eprintln!("skipping: trace {file} found neither in tests/data nor in ../../../shared/traces");
    None
}

pub const MIB: u64 = 1 << 20;
