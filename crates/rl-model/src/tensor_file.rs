//! Writing a safetensors file atomically and durably: model directories and adapter directories
//! both write their weights through it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use rl_run::{persist, temp_path};

use crate::error::{Error, Result};

/// Writes `tensors` to `path` as safetensors, atomically and durably (temp file, fsync, rename).
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let map: HashMap<String, Tensor> = tensors.iter().map(|(n, t)| (n.clone(), t.clone())).collect();
    let tmp = temp_path(path);
    if let Err(e) = candle_core::safetensors::save(&map, &tmp) {
        let _ = std::fs::remove_file(&tmp);
        // candle's error does not say which file: a full disk must name it.
        return Err(match e {
            candle_core::Error::Io(source) => Error::io(path, source),
            other => Error::Input(format!("cannot write {}: {other}", path.display())),
        });
    }
    Ok(persist(&tmp, path)?)
}
