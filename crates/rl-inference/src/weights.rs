//! Reading a weight update: a full broadcast (`model.safetensors`) as it is, or a LoRA adapter
//! directory (`adapter_config.json`, PEFT's format) over the served model's base weights. The CPU
//! runtime computes the adapters over the base it packed, so only they are read; for any other
//! runtime they are merged here, off the engine thread, into the base weights read from the
//! model's directory once, at the first adapter, and kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use rl_model::{AdapterUpdate, ModelConfig};
use tokio::sync::OnceCell;

use crate::error::{Error, Result};

type Tensors = HashMap<String, Tensor>;

/// A weight update as read.
#[derive(Debug)]
pub(crate) enum Update {
    /// Full weights.
    Full(Tensors),
    /// Adapters to compute over the base weights.
    Adapter(AdapterUpdate),
}

/// Where updates come from and the base weights adapters apply to.
#[derive(Debug)]
pub(crate) struct WeightSource {
    cfg: ModelConfig,
    /// The served model's directory (the base of every adapter); none: adapters are refused.
    base_dir: Option<PathBuf>,
    base: OnceCell<Arc<Tensors>>,
    /// Whether adapters are merged into the base here (a runtime that cannot compute them apart).
    merge: bool,
}

impl WeightSource {
    pub(crate) fn new(cfg: ModelConfig, base_dir: Option<PathBuf>, merge: bool) -> Self {
        WeightSource { cfg, base_dir, base: OnceCell::new(), merge }
    }

    /// Whether adapters are merged into the base weights on reading.
    pub(crate) fn merges(&self) -> bool {
        self.merge
    }

    pub(crate) fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The tensors of the update in `dir`, read on a blocking thread within `limit` (a stuck disk
    /// fails this call, never the engine).
    pub(crate) async fn read(&self, dir: &Path, limit: Duration) -> Result<Update> {
        let timeout = |what: &str| {
            Error::Timeout(format!("reading {what} in {} took longer than {:.0}s", dir.display(), limit.as_secs_f64()))
        };
        if !rl_model::is_adapter_dir(dir) {
            let source = dir.to_owned();
            let read = blocking(limit, move || rl_model::read_weights(&source, &Device::Cpu));
            return read.await.ok_or_else(|| timeout("the weights"))?.map(Update::Full);
        }
        let (cfg, source) = (self.cfg.clone(), dir.to_owned());
        if !self.merge {
            // The runtime computes the adapters over the base it holds: only they are read.
            let read = blocking(limit, move || {
                let (lora, adapters) = rl_model::read_adapter_dir(&cfg, &source, &Device::Cpu)?;
                Ok(Update::Adapter(AdapterUpdate { lora, adapters, base: None }))
            });
            return read.await.ok_or_else(|| timeout("the adapter"))?;
        }
        let base_dir = self.base_dir.clone().ok_or_else(|| {
            Error::BadRequest(String::from("this server has no base model directory to apply a LoRA adapter to"))
        })?;
        let base = self
            .base
            .get_or_try_init(|| async {
                let read = blocking(limit, move || rl_model::read_weights(&base_dir, &Device::Cpu).map(Arc::new));
                read.await.ok_or_else(|| timeout("the base weights"))?
            })
            .await?
            .clone();
        let merge = blocking(limit, move || {
            let (lora, adapters) = rl_model::read_adapter_dir(&cfg, &source, &Device::Cpu)?;
            Ok(Update::Full(rl_model::merge_adapters(&cfg, &lora, &base, &adapters)?))
        });
        merge.await.ok_or_else(|| timeout("the adapter"))?
    }
}

/// `f` on a blocking thread; `None` past `limit`. Its model errors are the client's (a bad
/// directory), a panicked reader is the engine's.
async fn blocking<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> rl_model::Result<T> + Send + 'static,
) -> Option<Result<T>> {
    match tokio::time::timeout(limit, tokio::task::spawn_blocking(f)).await {
        Err(_) => None,
        Ok(Err(e)) => Some(Err(Error::Engine(format!("the weight reader failed: {e}")))),
        Ok(Ok(read)) => Some(read.map_err(|e| Error::BadRequest(format!("cannot load weights: {e}")))),
    }
}
