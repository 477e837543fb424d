//! A runnable tour: discovery, the one-DEVICE idiom, meta initialisation, the `.to()` rules and
//! a few training steps of a linear classifier with a hand-written backward pass.
//!
//! `cargo run -p berth --example tour`

use berth::nn::{Linear, Module};
use berth::{DType, Device, Tensor};

fn main() -> berth::Result<()> {
    println!(
        "CUDA available: {} ({} devices)",
        berth::cuda::is_available(),
        berth::cuda::device_count()
    );
    if let Some(reason) = berth::cuda::unavailable_reason() {
        println!("  reason: {reason}");
    }
    let device = Device::best();
    println!("DEVICE = {device}");

    // Shapes on meta, then materialise.
    let mut layer = Linear::new(20, 3, Device::Meta)?;
    println!(
        "meta weight {:?}, {} bytes described, none allocated",
        layer.weight.shape(),
        layer.weight.nbytes()
    );
    layer.to_empty(Device::Cpu)?;
    let mut layer = Linear::new(20, 3, Device::Cpu)?;

    // A toy problem: the class is the argmax of the first 3 features.
    berth::manual_seed(0);
    let x = Tensor::randn(&[256, 20], DType::F32, Device::Cpu)?;
    let y = x.narrow(1, 0, 3)?.argmax_dim(1, false)?;
    layer.to_device(device).ok();
    let (x, y) = (
        x.to_device(layer.weight.device())?,
        y.to_device(layer.weight.device())?,
    );
    for step in 0..=100 {
        let logits = layer.forward(&x)?;
        let loss = logits.cross_entropy(&y)?;
        let g = logits.cross_entropy_backward(&y)?; // [N, 3]
        let gw = g.t()?.matmul(&x)?; // [3, 20]
        let gb = g.sum_dim(0, false)?;
        layer.weight.add_scaled_(&gw, -0.5)?;
        if let Some(b) = &layer.bias {
            b.add_scaled_(&gb, -0.5)?;
        }
        if step % 25 == 0 {
            let acc = logits.argmax_dim(1, false)?.eq(&y)?.sum()?.item::<i64>()? as f64 / 256.0;
            println!(
                "step {step:3}: loss {:.4}, accuracy {:.3}",
                loss.item::<f32>()?,
                acc
            );
        }
    }
    Ok(())
}
