//! Installing with a setting PyTorch accepts but ignores says so at install (not at the first
//! allocation), once, through berth's warning channel, which the Python package shows with
//! `warnings.warn`.

use berth_alloc::warnings::said_for;
use berth_torch::abi::*;
use std::ffi::CString;

#[test]
fn install_says_what_a_setting_will_not_do() {
    assert_eq!(berth_torch_simulate(1 << 30), 0);
    let (p, o) = (
        CString::new("pytorch").unwrap(),
        CString::new("garbage_collection_threshold:0.7").unwrap(),
    );
    assert!(said_for("alloc-conf-gc-threshold-without-fraction").is_none());
    // SAFETY: both are NUL-terminated.
    assert_eq!(unsafe { berth_torch_install(p.as_ptr(), o.as_ptr()) }, 0);
    let m = said_for("alloc-conf-gc-threshold-without-fraction").expect("said at install");
    assert!(m.contains("0.7") && m.contains("memory fraction"), "{m}");
}
