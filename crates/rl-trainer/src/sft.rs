//! Supervised fine-tuning: conversations rendered with the model's chat template, loss on the
//! tokens of the selected roles (assistant by default: the reply and its end-of-turn token, never
//! the `<|im_start|>assistant` scaffold), packed into rows of `seq_len`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use candle_core::Device;
use rl_configs::{BalanceSignal, LossConfig, LossMaskConfig, SftConfig, SftDataConfig, SftValConfig};
use rl_model::{CausalLm, ChatTemplate, ModelConfig, Pass, TemplateMessage, Tok, Trainable, read_config};
use rl_run::RunDir;
use rl_run::{SftRow, append_jsonl, group_exact_key, group_share_key, group_val_loss_key, retain_jsonl};

use crate::MicroBatch;
use crate::checkpoint::{find_checkpoint, write_checkpoint};
use crate::error::{Error, Result};
use crate::greedy_exact::{ExactCount, greedy_exact};
use crate::loss::{micro_loss, step_counts};
use crate::optim::{Optimizer, clip_factor, global_norm, lr_at};
use crate::sft_groups::{Picker, SftGroup, resumed_cursor, shares_from_lags, take_rows};
use crate::sft_rows::{SftExample, pack};
use crate::train::{StepId, device, step_gradients, synced_since};
use crate::weights::{Source, Trained};

fn trains(role: &str, m: &LossMaskConfig) -> bool {
    match role {
        "system" => m.system,
        "user" => m.user,
        "assistant" => m.assistant,
        "tool" => m.tool,
        _ => false,
    }
}

/// Tokenizes a conversation and marks the tokens of the roles `mask` selects, from message
/// `first_trained` on (earlier messages are a prompt: context only, whatever their role).
///
/// A message's tokens run from the end of the conversation before it (with the generation
/// scaffold for assistant turns) to the end of the conversation including it, through its
/// end-of-turn token. Both ends are found in one encoding of the whole conversation by byte
/// offsets when the template renders each prefix as a prefix of the whole and the tokens break at
/// both ends (one encode where re-encoding every prefix took seven for a three-turn episode);
/// otherwise every prefix is encoded and must be a token prefix of the whole.
pub fn tokenize(
    tok: &Tok,
    template: &ChatTemplate,
    msgs: &[TemplateMessage],
    tools: &[serde_json::Value],
    first_trained: usize,
    mask: &LossMaskConfig,
) -> Result<SftExample> {
    let text = template.render(msgs, tools, false)?;
    let (ids, offsets) = tok.encode_with_offsets(&text)?;
    let spans = match spans_by_offsets(template, msgs, tools, first_trained, mask, &text, &offsets)? {
        Some(spans) => spans,
        None => spans_by_prefixes(tok, template, msgs, tools, first_trained, mask, &ids)?,
    };
    Ok(SftExample { mask: mask_of(&ids, &spans, &tok.stop_ids), ids })
}

/// Per trained message, its token range `[start, end)` (scaffold excluded, end-of-turn included).
type Spans = Vec<(usize, usize)>;

/// The trained mask: each span through its last end-of-turn token (not the newline the template
/// adds after it), or whole when it has none.
fn mask_of(ids: &[u32], spans: &[(usize, usize)], end_ids: &[u32]) -> Vec<bool> {
    let mut trained = vec![false; ids.len()];
    for &(start, end) in spans {
        let span_end = (start..end).rev().find(|&i| end_ids.contains(&ids[i])).map_or(end, |i| i + 1);
        for t in &mut trained[start..span_end] {
            *t = true;
        }
    }
    trained
}

/// The text rendered before message `k`'s trained part: the conversation up to it (with the
/// assistant header when it is an assistant turn). Templates cannot render an empty conversation
/// (they read `messages[0]`), so for the first message it is the text before its content: the
/// common prefix of two renderings whose contents differ in their first character.
fn text_before(
    template: &ChatTemplate,
    msgs: &[TemplateMessage],
    k: usize,
    tools: &[serde_json::Value],
) -> Result<String> {
    if k > 0 {
        return Ok(template.render(&msgs[..k], tools, msgs[k].role == "assistant")?);
    }
    let with = |first: char| {
        let m = TemplateMessage { content: format!("{first}{}", msgs[0].content), ..msgs[0].clone() };
        template.render(&[m], tools, false)
    };
    let (a, b) = (with('a')?, with('b')?);
    let common = a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or(a.len(), |((i, _), _)| i);
    Ok(a[..common].to_owned())
}

/// The trained messages' rendered byte ranges in `text`: `None` when a prefix is not rendered as
/// a prefix of the whole (the caller then re-encodes every prefix, which reports that case).
fn byte_spans(
    template: &ChatTemplate,
    msgs: &[TemplateMessage],
    tools: &[serde_json::Value],
    first_trained: usize,
    mask: &LossMaskConfig,
    text: &str,
) -> Result<Option<Spans>> {
    let mut spans = Vec::new();
    for (k, m) in msgs.iter().enumerate().skip(first_trained) {
        if !trains(&m.role, mask) {
            continue;
        }
        let before = text_before(template, msgs, k, tools)?;
        let upto = template.render(&msgs[..=k], tools, false)?;
        if !upto.starts_with(&before) || !text.starts_with(&upto) {
            return Ok(None);
        }
        spans.push((before.len(), upto.len()));
    }
    Ok(Some(spans))
}

/// Token spans from byte offsets: `None` unless every span's ends fall between two tokens (the
/// token before ends there and the next starts there).
fn spans_by_offsets(
    template: &ChatTemplate,
    msgs: &[TemplateMessage],
    tools: &[serde_json::Value],
    first_trained: usize,
    mask: &LossMaskConfig,
    text: &str,
    offsets: &[(usize, usize)],
) -> Result<Option<Spans>> {
    let Some(bytes) = byte_spans(template, msgs, tools, first_trained, mask, text)? else {
        return Ok(None);
    };
    let token_at = |b: usize| -> Option<usize> {
        if b == 0 {
            return Some(0);
        }
        if b == text.len() {
            return (offsets.last().is_some_and(|o| o.1 == b)).then_some(offsets.len());
        }
        let i = offsets.iter().position(|o| o.0 == b)?;
        (i > 0 && offsets[i - 1].1 == b).then_some(i)
    };
    Ok(bytes.iter().map(|&(from, to)| Some((token_at(from)?, token_at(to)?))).collect())
}

/// Token spans by encoding every prefix, each of which must be a token prefix of the whole.
fn spans_by_prefixes(
    tok: &Tok,
    template: &ChatTemplate,
    msgs: &[TemplateMessage],
    tools: &[serde_json::Value],
    first_trained: usize,
    mask: &LossMaskConfig,
    ids: &[u32],
) -> Result<Spans> {
    let mut spans = Vec::new();
    for (k, m) in msgs.iter().enumerate().skip(first_trained) {
        if !trains(&m.role, mask) {
            continue;
        }
        let before = tok.encode(&text_before(template, msgs, k, tools)?)?;
        let upto = tok.encode(&template.render(&msgs[..=k], tools, false)?)?;
        if !upto.starts_with(&before) || !ids.starts_with(&upto) {
            return Err(Error::Unsupported(String::from(
                "the chat template does not render conversations as extensions of their prefixes; cannot locate message tokens",
            )));
        }
        spans.push((before.len(), upto.len()));
    }
    Ok(spans)
}

/// One SFT step's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct SftReport {
    /// The step (1-indexed).
    pub step: u64,
    /// Mean negative log-likelihood per trained token.
    pub loss: f64,
    /// Validation loss, on validation steps.
    pub val_loss: Option<f64>,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Tokens processed per second.
    pub tokens_per_s: f64,
    /// With balanced groups, on the steps that re-weighed them: each group's measures and new
    /// share.
    pub reweighed: Vec<GroupWeighing>,
}

/// One data group's re-weighing (`data.balance`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupWeighing {
    /// The group's name.
    pub name: String,
    /// Loss per trained token on its held-out examples.
    pub val_loss: f64,
    /// With `signal = "exact"`: the share of its held-out replies decoded greedily token for token.
    pub exact: Option<f64>,
    /// Its share of the examples from this step on.
    pub share: f64,
}

/// Supervised fine-tuning over tokenized examples.
#[derive(Debug)]
pub struct SftTrainer {
    cfg: SftConfig,
    model_cfg: ModelConfig,
    vars: Trainable,
    model: CausalLm,
    opt: Optimizer,
    /// The next step.
    pub step: u64,
    src: PathBuf,
}

impl SftTrainer {
    /// Loads the model of `cfg.model.path` (or the checkpoint to resume from).
    pub fn new(cfg: &SftConfig) -> Result<Self> {
        let src =
            cfg.model.path.clone().ok_or_else(|| {
                Error::Unsupported(String::from("model.path must name the model directory to fine-tune"))
            })?;
        let dev: Device = device(cfg.device)?;
        let model_cfg = read_config(&src)?;
        let run = RunDir::new(cfg.run_dir());
        let (resume_dir, step, opt) = match &cfg.resume {
            Some(r) => {
                let (s, ckpt) = find_checkpoint(&run, r.step)?;
                // Rows of steps after the checkpoint are trained again: drop them, not duplicate them.
                let kept = retain_jsonl(&run.metrics(), |row| row["step"].as_u64().is_some_and(|step| step <= s))?;
                if let Some(torn) = kept.torn {
                    tracing::warn!(file = %run.metrics().display(), torn = %torn, "cut a torn last line left by a crash");
                }
                (Some(ckpt.clone()), s + 1, Optimizer::load(&cfg.optim, &ckpt, &dev)?)
            }
            None => (None, 1, Optimizer::new(&cfg.optim)),
        };
        let from = Source { src: &src, resume: resume_dir.as_deref(), lora: cfg.lora.as_ref(), seed: cfg.seed };
        let (vars, model) = crate::weights::load(&model_cfg, from, &dev, cfg.dtype)?;
        let mut opt = opt;
        opt.regroup(&vars.groups())?;
        Ok(SftTrainer { cfg: cfg.clone(), model_cfg, vars, model, opt, step, src })
    }

    /// Tokenizer and chat template of the model being trained.
    pub fn tokenizer(&self) -> Result<(Tok, ChatTemplate)> {
        Ok((Tok::load(&self.src)?, ChatTemplate::load(&self.src)?))
    }

    /// Mean NLL per trained token over `rows` (no gradient).
    pub fn eval_loss(&self, rows: &[MicroBatch]) -> Result<f64> {
        let counts = step_counts(rows)?;
        let mut total = 0.0;
        for r in rows {
            let (_, s) = micro_loss(&self.model, r, &LossConfig::default(), counts, Pass::Eval)?;
            total += s.ce_loss;
        }
        Ok(total)
    }

    /// Trains `max_steps` steps of `batch_size` examples each (in a seeded order, reshuffled every
    /// epoch), validating every `val.interval` steps; writes `<run>/metrics.jsonl`. Once `interrupt` is
    /// set (Ctrl-C), ends after the step under way, checkpointing it when checkpoints are on.
    pub fn run(
        &mut self,
        train: &[SftGroup],
        val: &[SftExample],
        interrupt: &AtomicBool,
        mut on_step: impl FnMut(&SftReport),
    ) -> Result<SftEnd> {
        if train.is_empty() || train.iter().any(|g| g.train.is_empty()) {
            return Err(Error::Unsupported(String::from("no SFT training examples (or a data group without any)")));
        }
        let run = RunDir::new(self.cfg.run_dir());
        let seq_len = self.cfg.seq_len as usize;
        let val_rows = pack(val, seq_len);
        let balance = match &self.cfg.data {
            SftDataConfig::Task { balance: Some(b), .. } if train.len() > 1 => Some(b.clone()),
            _ => None,
        };
        let group_val_rows: Vec<Vec<MicroBatch>> = train.iter().map(|g| pack(&g.val, seq_len)).collect();
        let mut shares = self.resumed_shares(&run, train)?;
        let bs = self.cfg.batch_size() as usize;
        let mut picker = Picker::new(train, self.cfg.seed);
        // With `batch_rows` a step's examples are those that fill its rows, so where the next
        // step starts depends on the steps before it (their counts are in the metrics).
        let mut next = if self.cfg.batch_rows.is_some() { resumed_cursor(&run, self.step)? } else { 0 };
        while self.step <= self.cfg.max_steps {
            let start = Instant::now();
            let mut reweighed = Vec::new();
            if let Some(b) = &balance
                && (self.step - 1).is_multiple_of(b.interval)
            {
                let losses = group_val_rows.iter().map(|rows| self.eval_loss(rows)).collect::<Result<Vec<f64>>>()?;
                let exact = match b.signal {
                    BalanceSignal::Loss => None,
                    BalanceSignal::Exact => Some(self.greedy_exact(train)?),
                };
                let lags = match &exact {
                    None => losses.clone(),
                    Some(counts) => counts.iter().map(ExactCount::lag).collect(),
                };
                shares = shares_from_lags(&lags, b.power, b.min_share);
                reweighed = train
                    .iter()
                    .enumerate()
                    .map(|(i, g)| GroupWeighing {
                        name: g.name.clone(),
                        val_loss: losses[i],
                        exact: exact.as_ref().map(|c| c[i].rate()),
                        share: shares[i],
                    })
                    .collect();
            }
            let batch: Vec<SftExample> = match self.cfg.batch_rows {
                None => {
                    let first = (self.step as usize - 1) * bs;
                    (first..first + bs).map(|i| picker.pick(&shares, i).clone()).collect()
                }
                Some(rows) => take_rows(&mut picker, &shares, &mut next, rows as usize, seq_len),
            };
            let rows = pack(&batch, seq_len);
            let counts = step_counts(&rows)?;
            let (grads, stats, mut times) = step_gradients(
                &self.model,
                &self.vars,
                &rows,
                &LossConfig::default(),
                counts,
                StepId { step: self.step, seed: self.cfg.seed },
            )?;
            let (loss, tokens) = (stats.ce_loss, rows.iter().map(|r| r.input_ids.len()).sum::<usize>());
            let update = Instant::now();
            let grad_norm = global_norm(&grads)?;
            let lr = lr_at(&self.cfg.scheduler, self.cfg.optim.lr(), self.opt.steps, Some(self.cfg.max_steps));
            self.opt.step(&self.vars.vars, &grads, lr, clip_factor(grad_norm, self.cfg.optim.max_norm()))?;
            times.optimizer_s = synced_since(self.model.device(), update)?;
            let val_loss = match &self.cfg.val {
                Some(v)
                    if !val_rows.is_empty()
                        && (self.step.is_multiple_of(v.interval) || self.step == self.cfg.max_steps) =>
                {
                    Some(self.eval_loss(&val_rows)?)
                }
                _ => None,
            };
            let mut group_metrics = std::collections::BTreeMap::new();
            if train.len() > 1 {
                for (g, s) in train.iter().zip(&shares) {
                    group_metrics.insert(group_share_key(&g.name), *s);
                }
                for w in &reweighed {
                    group_metrics.insert(group_val_loss_key(&w.name), w.val_loss);
                    if let Some(e) = w.exact {
                        group_metrics.insert(group_exact_key(&w.name), e);
                    }
                }
            }
            let report = SftReport {
                step: self.step,
                loss,
                val_loss,
                grad_norm,
                lr,
                tokens_per_s: tokens as f64 / start.elapsed().as_secs_f64(),
                reweighed,
            };
            let row = SftRow {
                step: report.step,
                loss,
                grad_norm,
                lr,
                tokens: tokens as u64,
                samples: Some(batch.len() as u64),
                tokens_per_s: report.tokens_per_s,
                forward_s: times.forward_s,
                backward_s: times.backward_s,
                optimizer_s: times.optimizer_s,
                val_loss,
                groups: group_metrics,
            };
            append_jsonl(&run.metrics(), &row)?;
            let stop = match (&self.cfg.val, val_loss) {
                (Some(SftValConfig { stop_below: Some(t), .. }), Some(v)) => v <= *t,
                _ => false,
            };
            let interrupted = stop_flag(interrupt);
            if let Some(c) = &self.cfg.ckpt
                && (self.step.is_multiple_of(c.interval) || self.step == self.cfg.max_steps || stop || interrupted)
            {
                let trained = Trained { vars: &self.vars, base: &self.src, dtype: None };
                write_checkpoint(&run, self.step, &trained, &self.opt, c.keep_last)?;
            }
            on_step(&report);
            if stop {
                tracing::info!(step = self.step, val_loss, "validation loss reached val.stop_below: stopping");
                break;
            }
            if interrupted {
                let checkpoint = self.cfg.ckpt.as_ref().map(|_| run.trainer_checkpoint(self.step));
                return Ok(SftEnd::Interrupted { step: self.step, checkpoint });
            }
            self.step += 1;
        }
        Ok(SftEnd::Finished)
    }

    /// Each group's held-out replies decoded greedily (with LoRA, the adapters computed unmerged).
    fn greedy_exact(&self, train: &[SftGroup]) -> Result<Vec<ExactCount>> {
        train.iter().map(|g| greedy_exact(&self.model, &g.val)).collect()
    }

    /// The groups' shares in force: equal at the start; on resume, those of the last step kept in
    /// the run's metrics (a re-weighing between checkpoints is not repeated, so a resumed run
    /// draws what the uninterrupted one drew).
    fn resumed_shares(&self, run: &RunDir, train: &[SftGroup]) -> Result<Vec<f64>> {
        let equal = vec![1.0 / train.len() as f64; train.len()];
        if self.step == 1 || train.len() == 1 {
            return Ok(equal);
        }
        let rows: Vec<SftRow> = match rl_run::read_jsonl(&run.metrics()) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(
                    "cannot read the resumed run's metrics for its data shares ({e}): starting from equal shares"
                );
                return Ok(equal);
            }
        };
        let Some(last) = rows.iter().rev().find(|r| r.step == self.step - 1) else { return Ok(equal) };
        let shares: Option<Vec<f64>> =
            train.iter().map(|g| last.groups.get(&group_share_key(&g.name)).copied()).collect();
        match shares {
            Some(s) => Ok(s),
            None => {
                tracing::warn!(
                    step = self.step - 1,
                    "the resumed run's metrics have no shares for these data groups: starting from equal shares"
                );
                Ok(equal)
            }
        }
    }

    /// Writes the fine-tuned model as an HF-format directory (tokenizer files copied from the
    /// source); with LoRA, the adapters merged into the base.
    pub fn save_model(&self, out: &std::path::Path) -> Result<()> {
        rl_model::write_model_dir(out, &self.model_cfg, &self.vars.merged(&self.model_cfg)?, &self.src)?;
        Ok(())
    }

    /// With LoRA, writes the adapters as a PEFT adapter directory at `out` and returns true.
    pub fn save_adapter(&self, out: &std::path::Path) -> Result<bool> {
        let Some(lora) = self.vars.lora() else { return Ok(false) };
        let base = std::path::absolute(&self.src).unwrap_or_else(|_| self.src.clone());
        rl_model::write_adapter_dir(out, lora, &base.to_string_lossy(), &self.vars.tensors())?;
        Ok(true)
    }

    /// The model as it is now.
    pub fn model(&self) -> &CausalLm {
        &self.model
    }
}

/// How [`SftTrainer::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SftEnd {
    /// Every step ran (or validation reached `val.stop_below`).
    Finished,
    /// Stopped after `step` on request, with that step's checkpoint when checkpoints are on.
    Interrupted {
        /// The last step trained.
        step: u64,
        /// Its checkpoint.
        checkpoint: Option<PathBuf>,
    },
}

fn stop_flag(stop: &AtomicBool) -> bool {
    stop.load(std::sync::atomic::Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rl_model::{TemplateFunction, TemplateToolCall};

    use super::*;

    /// A tiny model directory's tokenizer and chat template, with a BPE trained on `corpus` when
    /// given (the character-level tokenizer otherwise).
    fn tokenizer(corpus: Option<(&[&str], rl_model::BpePieces)>) -> (tempfile::TempDir, Tok, ChatTemplate) {
        let dir = tempfile::tempdir().unwrap();
        rl_model::init_model(dir.path(), rl_model::Preset::Tiny, 0, false).unwrap();
        if let Some((texts, pieces)) = corpus {
            let texts: Vec<String> = (0..50).flat_map(|_| texts.iter().map(|t| (*t).to_owned())).collect();
            rl_model::write_bpe_tokenizer(&dir.path().join("tokenizer.json"), texts.into_iter(), 200, pieces).unwrap();
        }
        let (tok, template) = (Tok::load(dir.path()).unwrap(), ChatTemplate::load(dir.path()).unwrap());
        (dir, tok, template)
    }

    fn message(role: &str, content: &str, call: Option<&str>) -> TemplateMessage {
        let tool_calls = call
            .map(|name| TemplateToolCall {
                kind: String::from("function"),
                function: TemplateFunction { name: name.to_owned(), arguments: String::from(r#"{"title":"Ada"}"#) },
            })
            .into_iter()
            .collect();
        TemplateMessage { role: role.to_owned(), content: content.to_owned(), tool_calls, reasoning_content: None }
    }

    /// Message texts with the edges that move token boundaries: leading and trailing whitespace,
    /// runs of newlines, words that continue a word before them, tags, and nothing at all.
    fn content() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "Ada", "Lovelace", "ada", " ", "\n", "\n\n", "  ", "<think>", "</think>", "42", ",", "sorted", "Bob",
            "<sorted>", "x", "",
        ]);
        prop::collection::vec(piece, 0..6).prop_map(|v| v.concat())
    }

    /// A conversation: an optional system turn, then user/assistant turns, some assistant turns
    /// calling a tool and followed by its result.
    fn conversation() -> impl Strategy<Value = Vec<TemplateMessage>> {
        let turn = (content(), content(), prop::bool::ANY, content());
        (prop::option::of(content()), prop::collection::vec(turn, 1..4)).prop_map(|(system, turns)| {
            let mut msgs: Vec<TemplateMessage> = system.iter().map(|s| message("system", s, None)).collect();
            for (user, reply, calls, result) in turns {
                msgs.push(message("user", &user, None));
                if calls {
                    msgs.push(message("assistant", &reply, Some("click_link")));
                    msgs.push(message("tool", &result, None));
                }
                msgs.push(message("assistant", &reply, None));
            }
            msgs
        })
    }

    /// The character tokenizer and each kind of BPE, made once for all the cases below (a model
    /// directory and a trained BPE each: most of a case's time when made per case).
    fn every_kind_of_tokenizer() -> &'static [(tempfile::TempDir, Tok, ChatTemplate)] {
        static ALL: std::sync::OnceLock<Vec<(tempfile::TempDir, Tok, ChatTemplate)>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            let corpus = [
                "<|im_start|>user\nAda Lovelace, Bob<|im_end|>",
                "<think>\n\n</think>\n\nsorted 42",
                "<answer>\nAda Lovelace\n</answer>",
            ];
            let bpe = |pieces| tokenizer(Some((&corpus, pieces)));
            vec![
                tokenizer(None),
                bpe(rl_model::BpePieces::Isolated),
                bpe(rl_model::BpePieces::Attached),
                bpe(rl_model::BpePieces::Phrases),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Spans found by byte offsets in one encoding are the spans found by encoding every
        /// prefix, for the character tokenizer and every kind of BPE, whichever roles are trained.
        #[test]
        fn offsets_find_the_spans_that_prefix_encodings_find(
            msgs in conversation(),
            first_trained in 0usize..3,
            train_user in prop::bool::ANY,
        ) {
            let mask = LossMaskConfig { user: train_user, tool: train_user, ..LossMaskConfig::default() };
            for (_dir, tok, template) in every_kind_of_tokenizer() {
                let text = template.render(&msgs, &[], false).unwrap();
                let (ids, offsets) = tok.encode_with_offsets(&text).unwrap();
                prop_assert_eq!(&ids, &tok.encode(&text).unwrap());
                let fast = spans_by_offsets(template, &msgs, &[], first_trained, &mask, &text, &offsets);
                let exact = spans_by_prefixes(tok, template, &msgs, &[], first_trained, &mask, &ids);
                match fast {
                    // A prefix the template cannot render fails both ways.
                    Err(_) => prop_assert!(exact.is_err()),
                    Ok(Some(fast)) => prop_assert_eq!(Some(fast), exact.ok(), "{:?}", text),
                    Ok(None) => {}
                }
            }
        }
    }

    /// Training user turns works from the first message on (a template cannot render the empty
    /// conversation before it): the first message from its content, later ones with their header.
    #[test]
    fn user_turns_train_from_the_first_message() {
        let (_dir, tok, template) = tokenizer(None);
        let msgs = [
            message("user", "Sort: Bob, Ada", None),
            message("assistant", "Ada, Bob", None),
            message("user", "Add: Cy", None),
            message("assistant", "Ada, Bob, Cy", None),
        ];
        let mask = LossMaskConfig { user: true, ..LossMaskConfig::default() };
        let example = tokenize(&tok, &template, &msgs, &[], 0, &mask).unwrap();
        let trained: Vec<u32> = example.ids.iter().zip(&example.mask).filter(|(_, m)| **m).map(|(i, _)| *i).collect();
        assert_eq!(
            tok.decode(&trained).unwrap(),
            "Sort: Bob, Ada<|im_end|>Ada, Bob<|im_end|><|im_start|>user\nAdd: Cy<|im_end|>Ada, Bob, Cy<|im_end|>"
        );
        let text = template.render(&msgs, &[], false).unwrap();
        let ids = tok.encode(&text).unwrap();
        let exact = spans_by_prefixes(&tok, &template, &msgs, &[], 0, &mask, &ids).unwrap();
        let (_, offsets) = tok.encode_with_offsets(&text).unwrap();
        assert_eq!(spans_by_offsets(&template, &msgs, &[], 0, &mask, &text, &offsets).unwrap(), Some(exact));
    }

    /// The fast path is the one taken for a plain multi-turn conversation (the SFT recipes' data).
    #[test]
    fn plain_conversations_take_one_encoding() {
        let (_dir, tok, template) = tokenizer(Some((&["Ada Lovelace, Bob Marley"], rl_model::BpePieces::Isolated)));
        let msgs = [
            message("user", "Sort: Bob Marley, Ada Lovelace", None),
            message("assistant", "Ada Lovelace, Bob Marley", None),
            message("user", "Now add: Cy Twombly", None),
            message("assistant", "Ada Lovelace, Bob Marley, Cy Twombly", None),
        ];
        let mask = LossMaskConfig::default();
        let text = template.render(&msgs, &[], false).unwrap();
        let (ids, offsets) = tok.encode_with_offsets(&text).unwrap();
        let spans = spans_by_offsets(&template, &msgs, &[], 0, &mask, &text, &offsets).unwrap();
        assert_eq!(spans.as_ref().map(Vec::len), Some(2));
        let example = tokenize(&tok, &template, &msgs, &[], 0, &mask).unwrap();
        let trained: String = tok
            .decode(&ids.iter().zip(&example.mask).filter(|(_, m)| **m).map(|(i, _)| *i).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(trained, "Ada Lovelace, Bob Marley<|im_end|>Ada Lovelace, Bob Marley, Cy Twombly<|im_end|>");
    }
}
