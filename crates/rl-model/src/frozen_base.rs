//! A LoRA run's frozen base weights on the CPU: each layer's flat weights held in bf16 when every
//! value already is a bf16 value (a checkpoint stored in bf16, as released models are, read in
//! f32), half the bytes with the same values; the fused layer op widens them a layer at a time.
//! And the model built over them as they are held (no f32 copy of a bf16 weight).

use std::collections::HashMap;

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::Init;
use candle_nn::var_builder::SimpleBackend;

use crate::error::Result;

/// One layer's weights (flattened, in [`crate::layout::layer_part_shapes`] order) as one flat
/// tensor: bf16 when they are bf16 on the CPU (as read from a bf16 checkpoint) or f32 tensors
/// whose every value is a bf16 value, f32 otherwise.
pub(crate) fn layer_flat(parts: &[Tensor]) -> Result<Tensor> {
    let cpu = parts.iter().all(|t| t.device().is_cpu());
    if cpu && parts.iter().all(|t| t.dtype() == DType::BF16) {
        return Ok(Tensor::cat(parts, 0)?);
    }
    let wide = parts.iter().map(|t| t.to_dtype(DType::F32)).collect::<candle_core::Result<Vec<_>>>()?;
    narrowest_exact(Tensor::cat(&wide, 0)?)
}

/// `flat` in bf16 when it lies on the CPU in f32 and every value is exactly a bf16 value
/// (lossless); unchanged otherwise.
pub(crate) fn narrowest_exact(flat: Tensor) -> Result<Tensor> {
    if !flat.device().is_cpu() || flat.dtype() != DType::F32 {
        return Ok(flat);
    }
    let exact = flat.flatten_all()?.to_vec1::<f32>()?.iter().all(|v| v.to_bits() & 0xFFFF == 0);
    Ok(if exact { flat.to_dtype(DType::BF16)? } else { flat })
}

/// A `VarBuilder` backend that hands tensors out as they are held, whatever dtype is asked
/// (the model casts each weight to its compute dtype where it uses it).
pub(crate) struct AsHeld(pub(crate) HashMap<String, Tensor>);

impl SimpleBackend for AsHeld {
    fn get(&self, s: Shape, name: &str, _: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.get_unchecked(name, dtype, dev)?;
        if t.shape() != &s {
            return Err(candle_core::Error::Msg(format!("{name} is {:?}, expected {:?}", t.dims(), s.dims())));
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.0.get(name).ok_or_else(|| candle_core::Error::Msg(format!("missing weight {name}")))?;
        t.to_device(dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_values_are_narrowed() {
        let exact = Tensor::new(&[1.0f32, -0.5, f32::from_bits(0x3b44_0000)], &Device::Cpu).unwrap();
        let narrowed = narrowest_exact(exact.clone()).unwrap();
        assert_eq!(narrowed.dtype(), DType::BF16);
        assert_eq!(narrowed.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap(), exact.to_vec1::<f32>().unwrap());
        let inexact = Tensor::new(&[1.0f32, 0.1], &Device::Cpu).unwrap();
        assert_eq!(narrowest_exact(inexact).unwrap().dtype(), DType::F32);
    }
}
