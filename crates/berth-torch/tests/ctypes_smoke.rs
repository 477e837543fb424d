//! Runs `ctypes_smoke.py` (the shared library loaded by a Python process through ctypes, as
//! PyTorch loads it) when python3 is present; reports a skip otherwise.
use std::path::PathBuf;
use std::process::Command;

/// The crate's shared library: cargo builds it beside this test executable
/// (`target/<profile>/deps/libberth_torch.so`); `cargo build` also copies it one level up.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("libberth_torch.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| deps.join("libberth_torch.so"))
}

#[test]
fn python_ctypes_loads_the_library_and_calls_the_hooks() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 not found");
        return;
    }
    let lib = library();
    assert!(lib.exists(), "{} not built", lib.display());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/ctypes_smoke.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&lib)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ctypes smoke: ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
