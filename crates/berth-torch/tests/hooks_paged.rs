//! The exported C functions under the `paged` policy, over simulated devices.
mod common;

#[test]
fn c_hooks_under_paged_policy() {
    common::run_all("paged");
}
