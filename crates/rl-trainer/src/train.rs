//! The RL training loop: for each step, wait for its batch, accumulate gradients over its packed
//! rows, clip, update, broadcast the new weights, log metrics, checkpoint.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use rl_configs::TrainerConfig;
use rl_model::{CausalLm, ModelConfig, Pass, Trainable, read_config};
use rl_proto::train::v1::TrainBatch;
use rl_run::RunDir;
use rl_run::{TrainerRow, append_jsonl, retain_jsonl};

use crate::batch::wait_for_batch;
use crate::checkpoint::{clean_broadcasts, find_checkpoint, write_broadcast, write_checkpoint};
use crate::error::{Error, Result};
use crate::loss::{LossStats, micro_loss, step_counts};
use crate::optim::{Optimizer, clip_factor, global_norm, lr_at};
use crate::weights::{Source, Trained};

/// The device a config asks for (CUDA only in builds with the `cuda` feature).
pub fn device(cfg: rl_configs::Device) -> Result<Device> {
    Ok(rl_model::open_device(cfg)?)
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The step trained.
    pub step: u64,
    /// Loss and statistics.
    pub stats: LossStats,
    /// rl and ce member counts.
    pub rl_tokens: usize,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Seconds of forward, backward and update.
    pub train_s: f64,
    /// How those seconds split.
    pub times: StepTimes,
    /// No token of the batch was in any loss: no gradient, no optimizer step (AdamW's momentum
    /// and weight decay would otherwise still move the weights).
    pub optimizer_skipped: bool,
}

impl StepReport {
    /// The metrics row of this step.
    pub fn row(&self, wait_s: f64) -> TrainerRow {
        let s = &self.stats;
        let per = |x: f64, n: usize| if n == 0 { 0.0 } else { x / n as f64 };
        TrainerRow {
            step: self.step,
            loss: s.rl_loss + s.ce_loss,
            loss_rl: s.rl_loss,
            loss_ce: s.ce_loss,
            mismatch_kl: per(s.mismatch_kl, s.rl_tokens),
            entropy: per(s.entropy, s.entropy_tokens),
            masked_low: per(s.masked_low as f64, s.rl_tokens),
            masked_high: per(s.masked_high as f64, s.rl_tokens),
            rl_tokens: self.rl_tokens as u64,
            tokens: self.tokens as u64,
            grad_norm: self.grad_norm,
            lr: self.lr,
            tokens_per_s: self.tokens as f64 / self.train_s.max(1e-9),
            step_time_s: self.train_s,
            forward_s: self.times.forward_s,
            backward_s: self.times.backward_s,
            optimizer_s: self.times.optimizer_s,
            wait_s,
            optimizer_skipped: self.optimizer_skipped,
        }
    }
}

/// An RL trainer: weights as variables, the optimizer, and where the run lives.
#[derive(Debug)]
pub struct RlTrainer {
    cfg: TrainerConfig,
    model_cfg: ModelConfig,
    vars: Trainable,
    model: CausalLm,
    opt: Optimizer,
    /// The next step to train.
    pub step: u64,
    device: Device,
}

impl RlTrainer {
    /// Loads the starting weights (or the checkpoint to resume from).
    pub fn new(cfg: &TrainerConfig) -> Result<Self> {
        let dir = cfg.model.path.clone().ok_or_else(|| {
            Error::Unsupported(String::from("trainer.model.path must name the starting model directory"))
        })?;
        let device = device(cfg.device)?;
        let model_cfg = read_config(&dir)?;
        let (resume_dir, step, opt) = match &cfg.resume {
            Some(r) => {
                let run = RunDir::new(&cfg.output_dir);
                let (s, ckpt) = find_checkpoint(&run, r.step)?;
                // Steps after the checkpoint are trained again: their rows go, not duplicate.
                let kept =
                    retain_jsonl(&run.trainer_metrics(), |row| row["step"].as_u64().is_some_and(|step| step <= s))?;
                if let Some(torn) = kept.torn {
                    tracing::warn!(file = %run.trainer_metrics().display(), torn = %torn, "cut a torn last line left by a crash");
                }
                let opt = Optimizer::load(&cfg.optim, &ckpt, &device)?;
                (Some(ckpt), s + 1, opt)
            }
            None => (None, 1, Optimizer::new(&cfg.optim)),
        };
        let from = Source { src: &dir, resume: resume_dir.as_deref(), lora: cfg.lora.as_ref(), seed: cfg.seed };
        let (vars, model) = crate::weights::load(&model_cfg, from, &device, cfg.dtype)?;
        if let Some(p) = cfg.lora.as_ref().map(|l| l.dropout).filter(|&p| p > 0.0) {
            tracing::info!(
                dropout = p,
                "adapter dropout in training only: the trainer's log-probabilities differ from the sampler's by it \
                 (the mismatch KL shows how much)"
            );
        }
        let mut opt = opt;
        opt.regroup(&vars.groups())?;
        Ok(RlTrainer { cfg: cfg.clone(), model_cfg, vars, model, opt, step, device })
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.cfg.output_dir
    }

    /// The architecture.
    pub fn model_config(&self) -> &ModelConfig {
        &self.model_cfg
    }

    /// Current values of what is trained: every weight, or with LoRA the adapters.
    pub fn weights(&self) -> Vec<(String, Tensor)> {
        self.vars.tensors()
    }

    /// What is trained as written into a checkpoint (`dtype` unset) or a broadcast.
    fn trained(&self, dtype: Option<DType>) -> Trained<'_> {
        Trained { vars: &self.vars, base: self.cfg.model.path.as_deref().unwrap_or(Path::new("")), dtype }
    }

    /// The weights as broadcast: in `broadcast_dtype` when set.
    fn broadcast(&self) -> Trained<'_> {
        self.trained(self.cfg.broadcast_dtype.map(rl_model::compute_dtype))
    }

    /// Trains on one batch. A batch that trains no token leaves the weights and the optimizer
    /// untouched and says so in the report.
    pub fn train_step(&mut self, batch: &TrainBatch) -> Result<StepReport> {
        let start = Instant::now();
        let counts = step_counts(&batch.micro_batches)?;
        let tokens = batch.micro_batches.iter().map(|mb| mb.input_ids.len()).sum();
        let lr = lr_at(&self.cfg.scheduler, self.cfg.optim.lr(), self.opt.steps, self.cfg.max_steps);
        if counts.rl + counts.ce == 0 {
            tracing::warn!(step = batch.step, "the batch trains no token; the optimizer step is skipped");
            return Ok(StepReport {
                step: batch.step,
                stats: LossStats::default(),
                rl_tokens: 0,
                tokens,
                grad_norm: 0.0,
                lr,
                train_s: start.elapsed().as_secs_f64(),
                times: StepTimes::default(),
                optimizer_skipped: true,
            });
        }
        let (grads, stats, mut times) = step_gradients(
            &self.model,
            &self.vars,
            &batch.micro_batches,
            &self.cfg.loss,
            counts,
            StepId { step: batch.step, seed: self.cfg.seed },
        )?;
        let update = Instant::now();
        let grad_norm = global_norm(&grads)?;
        if !grad_norm.is_finite() {
            return Err(Error::NonFinite { step: batch.step, what: String::from("gradient norm") });
        }
        self.opt.step(&self.vars.vars, &grads, lr, clip_factor(grad_norm, self.cfg.optim.max_norm()))?;
        times.optimizer_s = synced_since(&self.device, update)?;
        Ok(StepReport {
            step: batch.step,
            stats,
            rl_tokens: counts.rl,
            tokens,
            grad_norm,
            lr,
            train_s: start.elapsed().as_secs_f64(),
            times,
            optimizer_skipped: false,
        })
    }

    /// Runs until `max_steps` (or until a batch times out): writes the starting weights as
    /// `broadcasts/step_{start-1}`, then trains each step as its batch arrives.
    pub fn run(&mut self, mut on_step: impl FnMut(&StepReport)) -> Result<()> {
        let run = RunDir::new(&self.cfg.output_dir);
        write_broadcast(&run, self.step - 1, &self.broadcast())?;
        let timeout = Duration::from_secs_f64(self.cfg.batch_timeout_s);
        while self.cfg.max_steps.is_none_or(|max| self.step <= max) {
            let waited = Instant::now();
            let batch = wait_for_batch(&run, self.step, timeout)?;
            let wait_s = waited.elapsed().as_secs_f64();
            let report = self.train_step(&batch)?;
            write_broadcast(&run, self.step, &self.broadcast())?;
            let interval = self.cfg.ckpt.as_ref().map(|c| c.interval);
            clean_broadcasts(&run, self.step, interval)?;
            append_jsonl(&run.trainer_metrics(), &report.row(wait_s))?;
            let last = self.cfg.max_steps == Some(self.step);
            if let Some(ckpt) = &self.cfg.ckpt
                && (self.step.is_multiple_of(ckpt.interval) || last)
            {
                write_checkpoint(&run, self.step, &self.trained(None), &self.opt, ckpt.keep_last)?;
            }
            on_step(&report);
            self.step += 1;
        }
        Ok(())
    }

    /// The device training runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Writes the current weights (with LoRA: merged into the base) as an HF-format model
    /// directory (tokenizer files from the starting model's directory).
    pub fn save_model(&self, out: &Path) -> Result<PathBuf> {
        let src = self.cfg.model.path.clone().unwrap_or_default();
        rl_model::write_model_dir(out, &self.model_cfg, &self.vars.merged(&self.model_cfg)?, &src)?;
        Ok(out.to_owned())
    }
}

/// Where a step's training time went, in seconds (`time/forward_s`, `time/backward_s`,
/// `time/optimizer_s` in the trainer's metrics). Forward (the loss included) and backward are
/// summed over the step's rows: rows that run side by side (small models on CPU) each count, so
/// the two can add up to more than the step. Off the CPU each phase ends with a device
/// synchronisation, so a phase is its kernels' time, not the time to queue them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// The rows' forward passes and losses.
    pub forward_s: f64,
    /// Their backward passes.
    pub backward_s: f64,
    /// Gradient norm, clipping and the optimizer's update.
    pub optimizer_s: f64,
}

/// Seconds since `start` once `device` has finished the work queued on it (a no-op on the CPU).
pub(crate) fn synced_since(device: &Device, start: Instant) -> Result<f64> {
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64())
}

/// Runs every row's forward and backward pass and sums the gradients in row order (each row's loss is already
/// divided by the step's counts, so the sum is the gradient of the step's loss). Runs on a rayon
/// pool thread: the kernels' parallel loops then start without a thread hand-off per op. The
/// times' `optimizer_s` is left at 0 for the caller.
pub fn step_gradients(
    model: &CausalLm,
    vars: &Trainable,
    rows: &[rl_proto::train::v1::MicroBatch],
    loss: &rl_configs::LossConfig,
    counts: crate::loss::StepCounts,
    step: StepId,
) -> Result<(Vec<Tensor>, LossStats, StepTimes)> {
    let small = model.config().num_params() <= ROW_PARALLEL_MAX_PARAMS && model.device().is_cpu();
    let at_once = if small { rayon::current_num_threads().max(1) } else { 1 };
    rl_kernels::on_awake_pool(|| gradients_here(model, vars, rows, loss, counts, step, at_once))
}

/// A training step of a run: with a row's index it seeds that row's adapter-dropout masks, so a
/// step draws the same masks whenever it runs (a resumed run repeats the uninterrupted one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepId {
    /// The step.
    pub step: u64,
    /// The run's seed.
    pub seed: u64,
}

impl StepId {
    /// The training pass of row `row` of this step.
    pub fn pass(self, row: usize) -> Pass {
        let mut rng = rl_model::SplitMix64::new(
            self.seed
                ^ self.step.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ (row as u64).wrapping_mul(0xd1b5_4a32_d192_ed03),
        );
        Pass::Train { seed: rng.next_u64() }
    }
}

/// On CPU, models up to this many parameters run a step's rows side by side, one per pool
/// thread: at the tiny and small presets' widths one product is too small to keep two threads
/// busy (a tiny-model SFT step ran 1.68x faster on two threads than on one, where two one-thread
/// processes ran 1.71x one), and two rows at once fill the gaps (SFT 11.8k -> 12.1k tokens/s, the
/// RL trainer step of alphabet-sort 0.75-0.82 s -> 0.68-0.69 s, same runs). It holds a row's
/// activations and gradients per thread, which only small models afford (LoRA included: the
/// activations are the base model's); larger models take one row at a time, each op on every
/// thread.
const ROW_PARALLEL_MAX_PARAMS: usize = 50_000_000;

/// One row's loss gradients (by variable; `None` where the row does not reach it), statistics
/// and the seconds of its forward and backward passes.
type RowGradients = (Vec<Option<Tensor>>, LossStats, StepTimes);

fn row_gradients(
    model: &CausalLm,
    vars: &Trainable,
    mb: &rl_proto::train::v1::MicroBatch,
    loss: &rl_configs::LossConfig,
    counts: crate::loss::StepCounts,
    id: StepId,
    row: usize,
) -> Result<RowGradients> {
    let start = Instant::now();
    let (l, s) = micro_loss(model, mb, loss, counts, id.pass(row))?;
    if !(s.rl_loss + s.ce_loss).is_finite() {
        return Err(Error::NonFinite { step: id.step, what: String::from("loss") });
    }
    let forward_s = synced_since(model.device(), start)?;
    let start = Instant::now();
    let grads = l.backward()?;
    let backward_s = synced_since(model.device(), start)?;
    let times = StepTimes { forward_s, backward_s, optimizer_s: 0.0 };
    Ok((vars.vars.iter().map(|(_, var)| grads.get(var.as_tensor()).cloned()).collect(), s, times))
}

fn gradients_here(
    model: &CausalLm,
    vars: &Trainable,
    rows: &[rl_proto::train::v1::MicroBatch],
    loss: &rl_configs::LossConfig,
    counts: crate::loss::StepCounts,
    id: StepId,
    at_once: usize,
) -> Result<(Vec<Tensor>, LossStats, StepTimes)> {
    let at_once = at_once.max(1);
    let mut acc: Vec<Option<Tensor>> = vec![None; vars.vars.len()];
    let mut stats = LossStats::default();
    let mut times = StepTimes::default();
    for (c, chunk) in rows.chunks(at_once).enumerate() {
        let one = |(j, mb): (usize, &rl_proto::train::v1::MicroBatch)| {
            row_gradients(model, vars, mb, loss, counts, id, c * at_once + j)
        };
        let done: Vec<Result<RowGradients>> = if chunk.len() > 1 {
            use rayon::prelude::*;
            chunk.par_iter().enumerate().map(one).collect()
        } else {
            chunk.iter().enumerate().map(one).collect()
        };
        // Summed in row order, as one row at a time does: the same step bit for bit.
        for r in done {
            let (grads, s, t) = r?;
            stats.add(&s);
            times.forward_s += t.forward_s;
            times.backward_s += t.backward_s;
            for (slot, g) in acc.iter_mut().zip(grads) {
                if let Some(g) = g {
                    *slot = Some(match slot.take() {
                        Some(prev) => (prev + g)?,
                        None => g,
                    });
                }
            }
        }
    }
    let grads = acc
        .into_iter()
        .zip(&vars.vars)
        .map(|(g, (_, v))| g.map_or_else(|| v.as_tensor().zeros_like(), Ok))
        .collect::<candle_core::Result<Vec<Tensor>>>()?;
    Ok((grads, stats, times))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};
    use rl_proto::train::v1::MicroBatch;

    use super::*;

    /// A row of `n` tokens of one sample, every target trained with the CE weight and an advantage.
    fn row(n: usize, salt: u32) -> MicroBatch {
        let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7 + salt * 3 + 1) % 40).collect();
        MicroBatch {
            position_ids: (0..n as u32).collect(),
            seq_lens: vec![n as u32],
            loss_mask: (0..n).map(|i| i > 0).collect(),
            advantages: (0..n).map(|i| if i > 0 { 0.5 - (i % 3) as f32 * 0.4 } else { 0.0 }).collect(),
            inference_logprobs: (0..n).map(|i| if i > 0 { -2.0 - 0.01 * i as f32 } else { 0.0 }).collect(),
            temperatures: vec![1.0; n],
            ce_weights: (0..n).map(|i| if i > 0 { 0.25 } else { 0.0 }).collect(),
            env_index: vec![0; n],
            input_ids: ids,
            parents: vec![],
        }
    }

    #[test]
    fn rows_side_by_side_give_the_step_of_one_row_at_a_time_bit_for_bit() {
        // Rows long enough that the kernels inside split their products across the pool too.
        let cfg = ModelConfig { max_position_embeddings: 512, ..rl_model::micro_config(40) };
        let w = rl_model::scaled_random_weights(&cfg, 3, 10.0, DType::F32).unwrap();
        let vars = Trainable::from_tensors(&cfg, &w).unwrap();
        let model = vars.model(&cfg, &Device::Cpu).unwrap();
        let rows = [row(300, 0), row(170, 1), row(260, 2)];
        let counts = crate::loss::step_counts(&rows).unwrap();
        let loss = rl_configs::LossConfig::default();
        let id = StepId { step: 4, seed: 9 };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let run = |at_once| pool.install(|| gradients_here(&model, &vars, &rows, &loss, counts, id, at_once).unwrap());
        let ((one, s1, _), (two, s2, _)) = (run(1), run(2));
        assert_eq!((s1.ce_loss.to_bits(), s1.rl_loss.to_bits()), (s2.ce_loss.to_bits(), s2.rl_loss.to_bits()));
        assert!(s1.ce_loss > 0.0);
        for ((name, _), (a, b)) in vars.vars.iter().zip(one.iter().zip(&two)) {
            let (a, b): (Vec<f32>, Vec<f32>) =
                (a.flatten_all().unwrap().to_vec1().unwrap(), b.flatten_all().unwrap().to_vec1().unwrap());
            assert!(a.iter().any(|x| *x != 0.0), "{name} received no gradient");
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: gradients differ");
        }
    }
}
