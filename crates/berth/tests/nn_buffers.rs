//! `nn` buffers (issue 32 item 5): persistent buffers are in the state dict and loaded,
//! non-persistent ones are not; both follow `to_device` / `to_empty` and are computed again by
//! `reset_parameters`. The missing and unexpected keys are PyTorch's for the same module,
//! reasoned from `Module._load_from_state_dict`
//! (<https://github.com/pytorch/pytorch/blob/main/torch/nn/modules/module.py>): it matches keys
//! against `_parameters` and the `_buffers` not in `_non_persistent_buffers_set` (missing when
//! absent), and a key under a module's prefix whose first segment is neither a child module nor
//! such a local name is unexpected; `load_state_dict` collects the unexpected keys whether or
//! not `strict` is set, and only raises on them when it is.

use berth::nn::{self, Linear, Module, PositionalEncoding, ReLU, Sequential, StateDict};
use berth::{DType, Device, Error, Generator, Tensor};

use crate::util::{close, v};

/// `Linear(3, 4)`, a positional table of 4 features for 6 positions, `ReLU`.
fn model(persistent: bool, device: Device, seed: u64) -> Sequential {
    let mut g = Generator::new(seed);
    Sequential::new()
        .push(Linear::new_with(3, 4, true, DType::F32, device, &mut g).unwrap())
        .push(PositionalEncoding::new(4, 6, persistent, device).unwrap())
        .push(ReLU)
}

fn keys(sd: &StateDict) -> Vec<&str> {
    sd.keys().map(String::as_str).collect()
}

fn not_strict() -> nn::LoadOptions {
    nn::LoadOptions {
        strict: false,
        assign: false,
    }
}

#[test]
fn the_table_holds_sin_and_cos_of_the_position_over_10000_powers() {
    let pe = PositionalEncoding::new(4, 6, false, Device::Cpu).unwrap();
    assert_eq!(pe.pe().shape(), &[6, 4]);
    let t = v(pe.pe());
    // Position 0: sin 0, cos 0; position 1: rates 1 and 10000^(-2/4) = 1/100.
    close(&t[..4], &[0.0, 1.0, 0.0, 1.0], 0.0);
    close(
        &t[4..8],
        &[1f32.sin(), 1f32.cos(), 0.01f32.sin(), 0.01f32.cos()],
        1e-7,
    );
    close(
        &t[20..24],
        &[5f32.sin(), 5f32.cos(), 0.05f32.sin(), 0.05f32.cos()],
        1e-6,
    );
    // forward adds pe[..seq] to every batch row.
    let x = Tensor::zeros(&[2, 3, 4], DType::F32, Device::Cpu).unwrap();
    let y = v(&pe.forward(&x).unwrap());
    close(&y[..12], &t[..12], 0.0);
    close(&y[12..], &t[..12], 0.0);
    for bad in [&[7usize, 4][..], &[3, 5], &[4]] {
        let x = Tensor::zeros(bad, DType::F32, Device::Cpu).unwrap();
        let e = pe.forward(&x).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    op: "PositionalEncoding",
                    ..
                }
            ),
            "{e:?}"
        );
    }
    assert!(matches!(
        PositionalEncoding::new_with(4, 6, true, DType::I64, Device::Cpu),
        Err(Error::UnsupportedDType { .. })
    ));
}

#[test]
fn only_persistent_buffers_are_in_the_state_dict() {
    let m = model(false, Device::Cpu, 0);
    let names: Vec<(String, bool)> = m
        .named_buffers()
        .into_iter()
        .map(|b| (b.name, b.persistent))
        .collect();
    assert_eq!(names, [("1.pe".to_string(), false)]);
    // PyTorch's state_dict() skips `_non_persistent_buffers_set`.
    assert_eq!(keys(&m.state_dict().unwrap()), ["0.bias", "0.weight"]);
    let p = model(true, Device::Cpu, 0);
    let sd = p.state_dict().unwrap();
    assert_eq!(keys(&sd), ["0.bias", "0.weight", "1.pe"]);
    assert_eq!(v(&sd["1.pe"]), v(p.named_buffers()[0].tensor));
}

#[test]
fn a_key_naming_a_non_persistent_buffer_is_unexpected_as_in_pytorch() {
    // The checkpoint of the persistent model, its table zeroed so a load would show.
    let mut ckpt = model(true, Device::Cpu, 1).state_dict().unwrap();
    ckpt.insert(
        "1.pe".into(),
        Tensor::zeros(&[6, 4], DType::F32, Device::Cpu).unwrap(),
    );
    let mut m = model(false, Device::Cpu, 0);
    let table = v(m.named_buffers()[0].tensor);
    // PyTorch: at module "1" (prefix "1."), "pe" is neither a child nor a parameter or
    // persistent buffer, so `unexpected_keys == ["1.pe"]`; nothing is missing. Strict raises
    // "Unexpected key(s) in state_dict: "1.pe"" before loading anything.
    let e = m.load_state_dict(&ckpt).unwrap_err();
    assert!(
        matches!(&e, Error::UnexpectedKeys { keys } if keys == &["1.pe"]),
        "{e:?}"
    );
    let keys = m.load_state_dict_with(&ckpt, not_strict()).unwrap();
    assert_eq!(keys.missing_keys, Vec::<String>::new());
    assert_eq!(keys.unexpected_keys, ["1.pe"]);
    assert_eq!(
        v(m.named_buffers()[0].tensor),
        table,
        "the buffer is not loaded"
    );
    assert_eq!(
        v(m.named_parameters()[0].1),
        v(&ckpt["0.weight"]),
        "parameters are"
    );
}

#[test]
fn a_persistent_buffer_is_loaded_and_missing_when_absent() {
    let mut ckpt = model(true, Device::Cpu, 1).state_dict().unwrap();
    ckpt.insert(
        "1.pe".into(),
        Tensor::zeros(&[6, 4], DType::F32, Device::Cpu).unwrap(),
    );
    let mut m = model(true, Device::Cpu, 0);
    m.load_state_dict(&ckpt).unwrap();
    assert_eq!(v(m.named_buffers()[0].tensor), vec![0.0; 24], "loaded");
    // The non-persistent model's checkpoint lacks "1.pe": PyTorch appends it to missing_keys
    // (a persistent buffer is in `local_name_params`) and reports no unexpected key.
    let small = model(false, Device::Cpu, 1).state_dict().unwrap();
    let e = m.load_state_dict(&small).unwrap_err();
    assert!(
        matches!(&e, Error::MissingKey { key, .. } if key == "1.pe"),
        "{e:?}"
    );
    let keys = m.load_state_dict_with(&small, not_strict()).unwrap();
    assert_eq!(keys.missing_keys, ["1.pe"]);
    assert_eq!(keys.unexpected_keys, Vec::<String>::new());
    // A wrong shape is an error even when not strict (PyTorch's size-mismatch message).
    ckpt.insert(
        "1.pe".into(),
        Tensor::zeros(&[5, 4], DType::F32, Device::Cpu).unwrap(),
    );
    let e = m.load_state_dict_with(&ckpt, not_strict()).unwrap_err();
    assert!(
        matches!(&e, Error::StateDictShape { key, .. } if key == "1.pe"),
        "{e:?}"
    );
}

#[test]
fn buffers_follow_moves_to_empty_and_reset() {
    for persistent in [false, true] {
        let mut m = model(persistent, Device::Cpu, 3);
        m.to_device(Device::Meta).unwrap();
        let devices = |m: &Sequential| -> Vec<Device> {
            let mut d: Vec<Device> = m.parameters().iter().map(|p| p.device()).collect();
            d.extend(m.named_buffers().iter().map(|b| b.tensor.device()));
            d
        };
        assert_eq!(devices(&m), [Device::Meta; 3], "persistent {persistent}");
        // Built on meta: the buffer has its shape and no memory.
        let mut built = model(persistent, Device::Meta, 3);
        let b = &built.named_buffers()[0];
        assert_eq!(
            (b.tensor.device(), b.tensor.shape()),
            (Device::Meta, &[6usize, 4][..])
        );
        // to_empty then reset_parameters: the values a CPU-built model has.
        built.to_empty(Device::Cpu).unwrap();
        assert_eq!(devices(&built), [Device::Cpu; 3]);
        built.reset_parameters(&mut Generator::new(3)).unwrap();
        let want = model(persistent, Device::Cpu, 3);
        assert_eq!(
            v(built.named_buffers()[0].tensor),
            v(want.named_buffers()[0].tensor)
        );
        assert_eq!(v(built.parameters()[0]), v(want.parameters()[0]));
        // reset_parameters on meta keeps the table on meta.
        let mut meta = model(persistent, Device::Meta, 3);
        meta.reset_parameters(&mut Generator::new(3)).unwrap();
        assert_eq!(meta.named_buffers()[0].tensor.device(), Device::Meta);
    }
}

#[test]
fn loading_into_a_meta_buffer_errors_or_assigns() {
    let ckpt = PositionalEncoding::new(4, 6, true, Device::Cpu)
        .unwrap()
        .state_dict()
        .unwrap();
    let mut meta = PositionalEncoding::new(4, 6, true, Device::Meta).unwrap();
    assert!(matches!(meta.state_dict(), Err(Error::MetaNoData { .. })));
    let e = meta.load_state_dict(&ckpt).unwrap_err();
    assert!(
        matches!(&e, Error::LoadIntoMeta { key } if key == "pe"),
        "{e:?}"
    );
    assert!(meta.pe().device().is_meta(), "nothing changed");
    let assign = nn::LoadOptions {
        strict: true,
        assign: true,
    };
    meta.load_state_dict_with(&ckpt, assign).unwrap();
    assert!(
        meta.pe().shares_storage(&ckpt["pe"]),
        "the checkpoint's own tensor"
    );
    assert!(!meta.pe().requires_grad());
    // A non-persistent meta buffer is not part of loading at all: a meta model with only
    // such a buffer loads its (empty) state dict and keeps the buffer on meta.
    let mut np = PositionalEncoding::new(4, 6, false, Device::Meta).unwrap();
    assert_eq!(np.state_dict().unwrap().len(), 0);
    np.load_state_dict(&StateDict::new()).unwrap();
    assert!(np.pe().device().is_meta());
}

/// With `assign`, a parameter keeps its `requires_grad` (PyTorch wraps the checkpoint's tensor
/// as `Parameter(input_param, requires_grad=param.requires_grad)`); the state dict's tensors
/// are detached, so a plain take would drop it.
#[test]
fn assign_keeps_each_parameters_requires_grad() {
    let ckpt = Linear::new(3, 2, Device::Cpu)
        .unwrap()
        .state_dict()
        .unwrap();
    assert!(ckpt.values().all(|t| !t.requires_grad()));
    let mut meta = Linear::new(3, 2, Device::Meta).unwrap();
    let assign = nn::LoadOptions {
        strict: true,
        assign: true,
    };
    meta.load_state_dict_with(&ckpt, assign).unwrap();
    assert!(meta.parameters().iter().all(|p| p.requires_grad()));
}
