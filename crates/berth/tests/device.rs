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

#[test]
fn device_new_builds_what_parsing_builds() {
    // Index 0 of the single cpu / mps / meta device is the index-less device.
    for (kind, d) in [
        (DeviceKind::Cpu, Device::Cpu),
        (DeviceKind::Mps, Device::Mps),
        (DeviceKind::Meta, Device::Meta),
    ] {
        assert_eq!(Device::new(kind, Some(0)).unwrap(), d);
        assert_eq!(Device::new(kind, None).unwrap(), d);
        let s = format!("{}:0", kind.as_str());
        assert_eq!(s.parse::<Device>().unwrap(), d);
        assert_eq!(d.to_string(), kind.as_str());
        // Any other index does not exist: the same typed error as parsing `cpu:1`.
        let e = Device::new(kind, Some(1)).unwrap_err();
        let parsed = format!("{}:1", kind.as_str())
            .parse::<Device>()
            .unwrap_err();
        assert_eq!(e, parsed);
    }
    let e = Device::new(DeviceKind::Cpu, Some(1)).unwrap_err();
    assert_eq!(e.input, "cpu:1");
    assert_eq!(
        e.reason,
        "berth has a single cpu device, so index 1 does not exist; use `cpu` or `cpu:0`"
    );
    // CUDA keeps its index (or none); Display is canonical and parses back.
    assert_eq!(
        Device::new(DeviceKind::Cuda, Some(0)).unwrap(),
        Device::Cuda(0)
    );
    assert_eq!(
        Device::new(DeviceKind::Cuda, Some(3)).unwrap().to_string(),
        "cuda:3"
    );
    assert_eq!(
        Device::new(DeviceKind::Cuda, None).unwrap(),
        Device::CudaCurrent
    );
    for d in [
        Device::Cpu,
        Device::Meta,
        Device::Mps,
        Device::Cuda(7),
        Device::CudaCurrent,
    ] {
        let back = Device::new(d.kind(), d.index()).unwrap();
        assert_eq!((back, back.to_string().parse::<Device>().unwrap()), (d, d));
    }
}

/// Without CUDA the memory statistics answer as PyTorch's do (`torch.cuda.memory_allocated()`
/// is 0 and `memory_stats()` `{}` while CUDA is not initialised), as `empty_cache()` already
/// did, instead of an error; with CUDA an out-of-range index is still an error (newcomer
/// defect 14).
#[test]
fn memory_statistics_without_cuda_are_zero_and_empty() {
    use berth::cuda;
    if cuda::is_available() {
        let n = cuda::device_count();
        assert!(
            cuda::memory_allocated(n + 3).is_err(),
            "out of range with a GPU"
        );
        return;
    }
    assert_eq!(cuda::memory_allocated(0).unwrap(), 0);
    assert_eq!(cuda::max_memory_reserved(0).unwrap(), 0);
    assert!(cuda::memory_stats(0).unwrap().is_empty());
    assert!(cuda::memory_snapshot(0).unwrap().segments.is_empty());
    cuda::reset_peak_memory_stats(0).unwrap();
    cuda::reset_accumulated_memory_stats(0).unwrap();
    cuda::empty_cache().unwrap();
}
