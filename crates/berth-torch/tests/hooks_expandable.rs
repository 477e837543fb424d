//! The exported C functions under the `expandable` policy, over simulated devices.
mod common;

#[test]
fn c_hooks_under_expandable_policy() {
    common::run_all("expandable");
}
