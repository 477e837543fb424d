//! Under `paged` the private-pool functions of the full allocator answer -1 with a message
//! that names what is missing and what to use instead; the rest works.

use berth_torch::abi::*;
use berth_torch::allocator_abi::*;
use std::ffi::{c_void, CString};

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` is valid for its length.
    let n = unsafe { berth_torch_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8(buf).unwrap()
}

#[test]
fn private_pools_under_paged_say_why_not() {
    assert_eq!(berth_torch_simulate(1 << 30), 0);
    let (p, o) = (CString::new("paged").unwrap(), CString::new("").unwrap());
    // SAFETY: both are NUL-terminated.
    assert_eq!(unsafe { berth_torch_install(p.as_ptr(), o.as_ptr()) }, 0);
    assert_eq!(berth_torch_create_or_incref_pool(0, 0, 1), -1);
    let e = last_error();
    assert!(
        e.contains("private pools") && e.contains("\"pytorch\""),
        "{e}"
    );
    // SAFETY: no filter, no context.
    let rc =
        unsafe { berth_torch_begin_allocate_to_pool(0, 0, 1, None, std::ptr::null_mut(), None) };
    assert_eq!(rc, -1);
    assert_eq!(berth_torch_pool_use_count(0, 0, 1), 0);
    // Statistics and the largest cached block still answer.
    let a = berth_torch_try_alloc(1 << 20, 0, std::ptr::null_mut::<c_void>());
    assert!(!a.is_null(), "{}", last_error());
    berth_torch_free(a, 1 << 20, 0, std::ptr::null_mut());
    assert!(berth_torch_largest_cached_block(0) >= 1 << 20);
    assert_eq!(berth_torch_reset_peak_stats(0), 0);
}
