//! Device strings (`--device`, `Device::from_str`): parsing never panics, a parsed device
//! displays in canonical form and parses back to itself, and `Device::new` agrees with the
//! parser.
#![no_main]

use berth::{Device, DeviceKind};
use libfuzzer_sys::fuzz_target;

const KINDS: [DeviceKind; 4] = [
    DeviceKind::Cpu,
    DeviceKind::Cuda,
    DeviceKind::Mps,
    DeviceKind::Meta,
];

fuzz_target!(|data: &[u8]| {
    if data.len() > 256 {
        return;
    }
    // Any parts: what `Device::new` accepts displays and parses back to it.
    if let [k, hi, lo, flag, ..] = *data {
        let kind = KINDS[usize::from(k) % KINDS.len()];
        let index = (flag & 1 == 1).then_some(u16::from_be_bytes([hi, lo]));
        if let Ok(d) = Device::new(kind, index) {
            assert_eq!(
                d.to_string().parse::<Device>(),
                Ok(d),
                "Device::new({kind:?}, {index:?})"
            );
        }
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = s.parse::<Device>() {
        let shown = d.to_string();
        assert_eq!(
            shown.parse::<Device>(),
            Ok(d),
            "{s:?} displays as {shown:?}"
        );
        // Canonical: the input itself, or the input without a redundant `:0` (`cpu:0` is `cpu`).
        assert!(
            shown == s || format!("{shown}:0") == s,
            "{s:?} parses to {d:?}, which displays as {shown:?}"
        );
        assert_eq!(Device::new(d.kind(), d.index()), Ok(d), "{s:?}");
        assert_eq!(Device::try_from(s), Ok(d));
    }
});
