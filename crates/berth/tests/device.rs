//! `Device`: PyTorch's grammar, round-tripping `Display`, and typed errors for bad strings and
//! unusable devices.

use berth::{Device, DeviceKind, Error};

#[test]
fn parses_every_accepted_form_and_round_trips() {
    for (s, kind, index) in [
        ("cpu", DeviceKind::Cpu, None),
        ("cuda", DeviceKind::Cuda, None),
        ("cuda:0", DeviceKind::Cuda, Some(0)),
        ("cuda:12", DeviceKind::Cuda, Some(12)),
        ("mps", DeviceKind::Mps, None),
        ("meta", DeviceKind::Meta, None),
    ] {
        let d: Device = s.parse().unwrap();
        assert_eq!((d.kind(), d.index()), (kind, index), "{s}");
        assert_eq!(d.to_string(), s);
    }
}

#[test]
fn bad_strings_are_typed_errors_naming_the_string_and_the_accepted_forms() {
    for s in [
        "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "gpu", "CUDA", "", "cuda:01", "cpu:0 ",
    ] {
        let e = s.parse::<Device>().unwrap_err();
        assert_eq!(e.input, s);
        let msg = e.to_string();
        assert!(msg.contains(&format!("{s:?}")), "{msg}");
        assert!(msg.contains("cpu, cuda, cuda:<index>, mps, meta"), "{msg}");
    }
    let gpu = "gpu".parse::<Device>().unwrap_err();
    assert!(gpu.reason.contains("unknown device type"), "{gpu}");
    // Converts into berth::Error with `?`.
    let as_berth: Error = "cuda:x".parse::<Device>().unwrap_err().into();
    assert!(matches!(as_berth, Error::ParseDevice(_)));
}

#[test]
fn mps_parses_but_using_it_is_not_available_on_this_platform() {
    let mps: Device = "mps".parse().unwrap();
    let e = berth::Tensor::zeros(&[2], berth::DType::F32, mps).unwrap_err();
    assert!(matches!(e, Error::DeviceNotAvailable { .. }), "{e:?}");
    assert!(
        e.to_string().contains("not available on this platform"),
        "{e}"
    );
}

#[test]
fn best_is_cpu_without_cuda_and_cuda0_with_it() {
    let want = if berth::cuda::is_available() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    };
    assert_eq!(Device::best(), want);
}

#[test]
fn cuda_1_without_a_gpu_is_a_typed_error_not_a_panic() {
    if berth::cuda::is_available() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let d: Device = "cuda:1".parse().unwrap();
    let e = berth::Tensor::zeros(&[2], berth::DType::F32, d).unwrap_err();
    assert!(matches!(e, Error::Cuda(_)), "{e:?}");
    assert!(e.to_string().contains("not available"), "{e}");
}

#[test]
fn index_0_of_the_single_devices_parses_to_the_device_and_prints_without_it() {
    for (s, d) in [
        ("cpu:0", Device::Cpu),
        ("mps:0", Device::Mps),
        ("meta:0", Device::Meta),
    ] {
        let p: Device = s.parse().unwrap();
        assert_eq!(p, d, "{s}");
        assert_eq!(p.index(), None, "{s}");
        assert_eq!(p.to_string(), s.trim_end_matches(":0"));
    }
    let x = berth::Tensor::zeros(&[2], berth::DType::F32, "cpu:0".parse().unwrap()).unwrap();
    assert_eq!(x.device(), Device::Cpu);
}

#[test]
fn another_index_of_a_single_device_is_a_typed_error_naming_the_valid_forms() {
    for (s, name, i) in [
        ("cpu:1", "cpu", 1),
        ("meta:2", "meta", 2),
        ("mps:7", "mps", 7),
    ] {
        let e = s.parse::<Device>().unwrap_err();
        assert_eq!(e.input, s);
        assert_eq!(
            e.reason,
            format!(
                "berth has a single {name} device, so index {i} does not exist; use `{name}` or \
                 `{name}:0`"
            )
        );
    }
    // The grammar's other rules still hold for these kinds.
    assert!("cpu:00"
        .parse::<Device>()
        .unwrap_err()
        .reason
        .contains("leading zero"));
    assert!("cpu:".parse::<Device>().is_err());
}
