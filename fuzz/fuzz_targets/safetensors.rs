//! Safetensors state dicts (`berth eval --load`, `berth::nn::load_state_dict_bytes`): loading
//! never panics; every tensor holds exactly its shape's bytes; the dict loads (or is refused,
//! typed) into an `nn::Linear` shaped after its `weight` and into a fixed one; and `berth eval`'s
//! MLP loader (`hidden_of`, then `Mlp::new` and `load_state_dict`) checks the shapes before it
//! builds anything, then runs a forward pass.
#![no_main]

use berth::nn::{load_state_dict_bytes, Linear, Module};
use berth::{DType, Device, Generator, Tensor};
use libfuzzer_sys::fuzz_target;

/// `berth eval`'s model and state-dict check, compiled from the CLI's own source.
#[allow(dead_code, missing_docs)]
#[path = "../../crates/berth-cli/src/train/mlp.rs"]
mod mlp;

/// Largest layer built, in elements (the target's own allocations stay small).
const MAX_ELEMENTS: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    if data.len() > 1 << 20 {
        return;
    }
    let Ok(state) = load_state_dict_bytes(data) else {
        return;
    };
    for (name, t) in &state {
        let numel = t.shape().iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        assert_eq!(numel, Some(t.numel()), "{name}: shape {:?}", t.shape());
        assert_eq!(t.device(), Device::Cpu);
        let _ = t.to_vec_f64();
    }
    let mut g = Generator::new(0);
    // A layer shaped after the file's `weight`, when it is a small matrix.
    if let Some([out, inp]) = state.get("weight").map(|w| w.shape()) {
        if out.checked_mul(*inp).is_some_and(|n| n <= MAX_ELEMENTS) {
            let bias = state.contains_key("bias");
            let mut layer = Linear::new_with(*inp, *out, bias, DType::F32, Device::Cpu, &mut g)
                .expect("a small CPU layer");
            if layer.load_state_dict(&state).is_ok() {
                let x = Tensor::ones(&[2, *inp], DType::F32, Device::Cpu).expect("small");
                let y = layer.forward(&x).expect("forward of a loaded layer");
                assert_eq!(y.shape(), &[2, *out]);
            }
        }
    }
    let mut fixed = Linear::new_with(4, 3, true, DType::F32, Device::Cpu, &mut g).expect("small");
    let _ = fixed.load_state_dict(&state);
    // `berth eval --load`: shapes first, then the model.
    if let Ok(hidden) = mlp::hidden_of(&state) {
        assert!(hidden >= 1);
        if hidden <= 64 {
            let mut model = mlp::Mlp::new(hidden, Device::Cpu, &mut g).expect("a small model");
            let loaded = model.load_state_dict(&state);
            // Strict loading also refuses extra keys, which `hidden_of` does not look at.
            assert!(
                loaded.is_ok() || state.len() > 4,
                "hidden_of accepted the shapes, but loading failed: {loaded:?}"
            );
            let x = Tensor::zeros(&[1, mlp::INPUTS], DType::F32, Device::Cpu).expect("small");
            let y = model.forward(&x).expect("forward of a loaded model");
            assert_eq!(y.shape(), &[1, mlp::CLASSES]);
        }
    }
});
