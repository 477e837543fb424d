//! The exported C functions under the `pytorch` policy, over simulated devices.
mod common;

#[test]
fn c_hooks_under_pytorch_policy() {
    common::run_all("pytorch");
}
