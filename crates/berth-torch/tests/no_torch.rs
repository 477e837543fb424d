//! Runs `no_torch.py` (`berth_torch`'s Python code with PyTorch made unimportable) when python3
//! is present; reports a skip otherwise. Newcomer defect 20: `use_allocator("bogus")` raised
//! `ModuleNotFoundError` instead of the documented `ValueError` where PyTorch was missing.
use std::path::PathBuf;
use std::process::Command;

#[test]
fn use_allocator_without_pytorch_says_what_is_wrong() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 not found");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("tests/no_torch.py"))
        .arg(root.join("python"))
        .env_remove("BERTH_TORCH_ALLOCATOR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("no torch: ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
