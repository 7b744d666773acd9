//! The generation engine: an actor on its own OS thread that owns the model and every KV cache.
//! Each step is one forward call of the CPU runtime that prefills the newly admitted prompts and
//! decodes one token for every running sequence together, so a request never waits for an
//! unrelated long one to finish. A request's `n` choices share its prompt's cache (prefilled once),
//! and the prompt cache lets requests starting with a recent prompt prefill only the rest.
//! Weight swaps happen between steps (and empty the prompt cache).
//!
//! Long because the loop (admit, one batched step, finish, swap weights) is one state machine:
//! its invariants — a sequence is waiting, running or answered, never two; every finished
//! sequence frees its cache; a swap happens only between steps — are checked by reading it whole.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use rl_model::{CausalLm, CpuRuntime, Rows, Runtime, Sampler, TensorRuntime, Tok, log_softmax};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::generation::{Completion, Finish, GenOutput, GenRequest, TokenEvent, TokenLogprob};
use crate::prefix_cache::PrefixCache;
use crate::structured::Guide;
use crate::weights::{Update, WeightSource};

/// `row` as the request samples from it: adjusted by its penalties for the output so far,
/// restricted to its `allowed_token_ids`, and with the end-of-sequence tokens `eos` masked while
/// the output is shorter than `min_tokens`.
fn processed<'a>(req: &GenRequest, row: &'a [f32], output: &[u32], eos: &[u32]) -> std::borrow::Cow<'a, [f32]> {
    let mask_eos = output.len() < req.min_tokens as usize;
    if req.penalties.is_off() && !mask_eos && req.allowed_token_ids.is_none() {
        return std::borrow::Cow::Borrowed(row);
    }
    let mut adjusted = row.to_vec();
    req.penalties.apply(&mut adjusted, &req.prompt, output);
    if let Some(allowed) = &req.allowed_token_ids {
        for (id, z) in adjusted.iter_mut().enumerate() {
            if allowed.binary_search(&(id as u32)).is_err() {
                *z = f32::NEG_INFINITY;
            }
        }
    }
    if mask_eos {
        for &t in eos.iter().chain(&req.stop_token_ids) {
            if let Some(z) = adjusted.get_mut(t as usize) {
                *z = f32::NEG_INFINITY;
            }
        }
    }
    std::borrow::Cow::Owned(adjusted)
}

/// Commands the engine accepts.
#[derive(Debug)]
pub(crate) enum Command {
    Generate(GenRequest, oneshot::Sender<Result<GenOutput>>),
    UpdateWeights(PathBuf, Update, oneshot::Sender<Result<u64>>),
    Pause(oneshot::Sender<()>),
    Resume(oneshot::Sender<()>),
}

/// A handle to the engine thread.
#[derive(Debug, Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command>,
    beat: Arc<Heartbeat>,
    weights: Arc<WeightSource>,
}

/// What the engine thread says about itself, read by `/health`: whether it is alive, whether it is
/// waiting for work, and when it last went round its loop (one step at most per round).
#[derive(Debug)]
struct Heartbeat {
    start: Instant,
    alive: AtomicBool,
    idle: AtomicBool,
    last_ms: AtomicU64,
    /// Requests waiting for admission and sequences decoding, as of the last loop round.
    waiting: AtomicU64,
    running: AtomicU64,
}

impl Heartbeat {
    fn beat(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Marks the engine dead when its thread ends, panics included.
struct AliveGuard(Arc<Heartbeat>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Relaxed);
    }
}

struct Running {
    tx: oneshot::Sender<Result<GenOutput>>,
    req: GenRequest,
    done: Vec<Option<Completion>>,
    prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    cached: usize,
}

struct Seq<C> {
    slot: usize,
    choice: usize,
    cache: C,
    sampler: Sampler,
    /// The structured-output constraint's state, when the request has one.
    guide: Option<Guide>,
    next: u32,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
}

impl Engine {
    /// Starts the engine thread serving `model`, decoding up to `max_batch` sequences together and
    /// keeping up to `prefix_cache_bytes` of prompt keys and values.
    pub fn start(model: &CausalLm, tok: Tok, max_batch: usize, prefix_cache_bytes: usize) -> Result<Self> {
        let (tx, rx) = mpsc::channel();
        let beat = Arc::new(Heartbeat {
            start: Instant::now(),
            alive: AtomicBool::new(true),
            idle: AtomicBool::new(true),
            last_ms: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            running: AtomicU64::new(0),
        });
        let guard = AliveGuard(beat.clone());
        // The CPU runs the slice kernels (bf16: weights packed in bf16, activations f32); any other
        // device or dtype candle's ops.
        let cpu = model.device().is_cpu()
            && matches!(model.compute_dtype(), candle_core::DType::F32 | candle_core::DType::BF16);
        let run: Box<dyn FnOnce() + Send> = if cpu {
            let rt = CpuRuntime::new(model)?;
            // What a decode step reads (an f32 model from a bf16 checkpoint packs in bf16).
            tracing::info!(packed_mb = rt.packed_bytes() / (1 << 20), "CPU runtime packed the weights");
            Box::new(move || EngineLoop::new(rt, tok, max_batch, prefix_cache_bytes).run(&rx, &guard.0))
        } else {
            let rt = TensorRuntime::new(model)?;
            Box::new(move || EngineLoop::new(rt, tok, max_batch, prefix_cache_bytes).run(&rx, &guard.0))
        };
        std::thread::Builder::new()
            .name(String::from("rl-inference-engine"))
            .spawn(run)
            .map_err(|e| Error::Engine(format!("cannot start the engine thread: {e}")))?;
        // The CPU runtime computes adapters apart from its packed base; the tensor runtime needs
        // them merged.
        let weights = Arc::new(WeightSource::new(model.config().clone(), None, !cpu));
        Ok(Engine { tx, beat, weights })
    }

    /// The same engine applying LoRA adapter updates to the weights in `dir` (the served model's
    /// directory).
    pub fn with_base_dir(mut self, dir: PathBuf) -> Self {
        let cfg = self.weights_config();
        self.weights = Arc::new(WeightSource::new(cfg, Some(dir), self.weights.merges()));
        self
    }

    fn weights_config(&self) -> rl_model::ModelConfig {
        self.weights.config().clone()
    }

    /// Requests waiting for admission and sequences decoding.
    pub fn load(&self) -> (usize, usize) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as usize;
        (get(&self.beat.waiting), get(&self.beat.running))
    }

    /// `Err` with the reason when the engine cannot serve: its thread has ended, or it has had
    /// work but has not come round its loop for `stuck_after` (a hung forward call or device).
    pub fn health(&self, stuck_after: Duration) -> std::result::Result<(), String> {
        if !self.beat.alive.load(Ordering::Relaxed) {
            return Err(String::from("the engine thread has stopped"));
        }
        if self.beat.idle.load(Ordering::Relaxed) {
            return Ok(());
        }
        let now = self.beat.start.elapsed().as_millis() as u64;
        let silent = Duration::from_millis(now.saturating_sub(self.beat.last_ms.load(Ordering::Relaxed)));
        if silent > stuck_after {
            return Err(format!("the engine has had work but finished no step for {:.0}s", silent.as_secs_f64()));
        }
        Ok(())
    }

    pub(crate) async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| Error::Engine(String::from("the engine has stopped")))?;
        rx.await.map_err(|_| Error::Engine(String::from("the engine dropped the request")))
    }

    /// Generates completions.
    pub async fn generate(&self, req: GenRequest) -> Result<GenOutput> {
        self.call(|tx| Command::Generate(req, tx)).await?
    }

    /// Loads the weights in `dir` (full weights, or a LoRA adapter over the base) and swaps
    /// them in between steps; returns the new version. The files are read on a blocking thread
    /// while generation goes on, within `limit`: a stuck disk fails this call, never the engine.
    pub async fn update_weights(&self, dir: PathBuf, limit: Duration) -> Result<u64> {
        let update = self.weights.read(&dir, limit).await?;
        self.call(|tx| Command::UpdateWeights(dir, update, tx)).await?
    }

    /// Stops admitting and decoding until [`Engine::resume`].
    pub async fn pause(&self) -> Result<()> {
        self.call(Command::Pause).await
    }

    /// Resumes after [`Engine::pause`].
    pub async fn resume(&self) -> Result<()> {
        self.call(Command::Resume).await
    }
}

struct EngineLoop<R: Runtime> {
    rt: R,
    tok: Tok,
    max_batch: usize,
    version: u64,
    paused: bool,
    waiting: VecDeque<(GenRequest, oneshot::Sender<Result<GenOutput>>)>,
    running: Vec<Option<Running>>,
    seqs: Vec<Seq<R::Cache>>,
    prompts: PrefixCache<R>,
}

/// An admitted request with the cache its prompt continues and the prompt tokens still to feed.
struct Admitted<C> {
    req: GenRequest,
    tx: oneshot::Sender<Result<GenOutput>>,
    cache: C,
    cached: usize,
}

impl<R: Runtime> EngineLoop<R> {
    fn new(rt: R, tok: Tok, max_batch: usize, prefix_cache_bytes: usize) -> Self {
        EngineLoop {
            rt,
            tok,
            max_batch: max_batch.max(1),
            version: 0,
            paused: false,
            waiting: VecDeque::new(),
            running: Vec::new(),
            seqs: Vec::new(),
            prompts: PrefixCache::new(prefix_cache_bytes),
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Command>, beat: &Heartbeat) {
        loop {
            beat.beat();
            beat.waiting.store(self.waiting.len() as u64, Ordering::Relaxed);
            beat.running.store(self.seqs.len() as u64, Ordering::Relaxed);
            let idle = self.paused || (self.seqs.is_empty() && self.waiting.is_empty());
            if idle {
                beat.idle.store(true, Ordering::Relaxed);
                let cmd = rx.recv();
                // Beat before saying busy, so a long wait never reads as a stuck step.
                beat.beat();
                beat.idle.store(false, Ordering::Relaxed);
                match cmd {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            if self.paused {
                continue;
            }
            self.cancel_abandoned();
            let admitted = self.admit();
            if (!self.seqs.is_empty() || !admitted.is_empty())
                && let Err(e) = self.step(admitted)
            {
                self.fail_all(&e);
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Generate(req, tx) => self.waiting.push_back((req, tx)),
            Command::UpdateWeights(dir, update, tx) => {
                let swapped = match update {
                    Update::Full(tensors) => self.rt.with_weights(&dir, tensors),
                    Update::Adapter(adapter) => self.rt.with_adapter(&dir, &adapter),
                };
                let result = swapped.map(|rt| {
                    self.rt = rt;
                    self.prompts.clear();
                    self.version += 1;
                    self.version
                });
                let _ = tx.send(result.map_err(|e| Error::BadRequest(format!("cannot load weights: {e}"))));
            }
            Command::Pause(tx) => {
                self.paused = true;
                let _ = tx.send(());
            }
            Command::Resume(tx) => {
                self.paused = false;
                let _ = tx.send(());
            }
        }
    }

    /// Drops sequences whose requester went away.
    fn cancel_abandoned(&mut self) {
        for slot in 0..self.running.len() {
            if self.running[slot].as_ref().is_some_and(|r| r.tx.is_closed()) {
                self.running[slot] = None;
                self.seqs.retain(|s| s.slot != slot);
            }
        }
        self.waiting.retain(|(_, tx)| !tx.is_closed());
    }

    /// Takes waiting requests while the batch has room; a request whose prompt cannot run is
    /// answered with its error here. A request that would prefill the same prompt as one admitted
    /// in this step waits one step, to find it in the prompt cache.
    fn admit(&mut self) -> Vec<Admitted<R::Cache>> {
        let mut admitted: Vec<Admitted<R::Cache>> = Vec::new();
        let mut room = self.max_batch.saturating_sub(self.seqs.len());
        while let Some((req, _)) = self.waiting.front() {
            let busy = !self.seqs.is_empty() || !admitted.is_empty();
            if busy && req.n as usize > room {
                break;
            }
            let hit = if req.prompt_logprobs.is_none() { self.prompts.lookup(&req.prompt) } else { None };
            let key = prompt_key(&req.prompt);
            if hit.is_none() && admitted.iter().any(|a| a.cached == 0 && prompt_key(&a.req.prompt) == key) {
                break;
            }
            let (req, tx) = self.waiting.pop_front().expect("front exists");
            if let Err(e) = self.rt.check(0, &req.prompt) {
                let _ = tx.send(Err(Error::BadRequest(e.to_string())));
                continue;
            }
            room = room.saturating_sub(req.n as usize);
            // A single choice prefills into its own cache with room for its completion; several
            // choices prefill the prompt once and continue it from a shared prefix.
            let max_len = self.rt.config().max_position_embeddings;
            let cached = hit.as_ref().map_or(0, R::prefix_len);
            let fed = req.prompt.len() - cached;
            let own = if req.n == 1 { (fed + req.max_tokens as usize).min(max_len - cached) } else { fed };
            let cache = self.rt.new_cache(hit.as_ref(), own);
            admitted.push(Admitted { req, tx, cache, cached });
        }
        admitted
    }

    /// One forward call: prefills the admitted prompts and decodes a token for every running
    /// sequence; then samples.
    fn step(&mut self, admitted: Vec<Admitted<R::Cache>>) -> Result<()> {
        let (admitted, mut prompt_caches): (Vec<_>, Vec<_>) =
            admitted.into_iter().map(|a| ((a.req, a.tx, a.cached), a.cache)).unzip();
        let next: Vec<u32> = self.seqs.iter().map(|s| s.next).collect();
        let mut tokens: Vec<&[u32]> = admitted.iter().map(|(r, _, cached)| &r.prompt[*cached..]).collect();
        tokens.extend(next.iter().map(std::slice::from_ref));
        let mut rows: Vec<Rows> =
            admitted.iter().map(|(r, _, _)| if r.prompt_logprobs.is_some() { Rows::All } else { Rows::Last }).collect();
        rows.extend(std::iter::repeat_n(Rows::Last, next.len()));
        let vocab = self.rt.config().vocab_size;
        let logits = {
            let mut caches: Vec<&mut R::Cache> =
                prompt_caches.iter_mut().chain(self.seqs.iter_mut().map(|s| &mut s.cache)).collect();
            self.rt.forward_rows(&mut caches, &tokens, &rows)?
        };
        let mut rows_iter = logits.chunks(vocab);
        let mut prefilled = Vec::with_capacity(admitted.len());
        for ((req, tx, cached), cache) in admitted.into_iter().zip(prompt_caches) {
            let take = if req.prompt_logprobs.is_some() { req.prompt.len() } else { 1 };
            let req_rows: Vec<&[f32]> = rows_iter.by_ref().take(take).collect();
            // Keep what this prefill computed (all but the last prompt token) for later requests.
            let len = req.prompt.len();
            if len - cached > 1 && self.prompts.enabled() {
                self.prompts.insert(prompt_key(&req.prompt).to_vec(), self.rt.share_first(&cache, len - 1)?);
            }
            prefilled.push((req, tx, cache, cached, req_rows));
        }
        let mut broken = Vec::new();
        for (seq, row) in self.seqs.iter_mut().zip(rows_iter) {
            let req = &self.running[seq.slot].as_ref().expect("running slot").req;
            let mut row = processed(req, row, &seq.tokens, &self.tok.stop_ids);
            let ends = seq.guide.as_ref().map(|_| end_ids(&self.tok.stop_ids, req)).unwrap_or_default();
            if let Some(guide) = &mut seq.guide
                && let Err(e) = guide.mask(row.to_mut(), &ends)
            {
                broken.push((seq.slot, e));
                continue;
            }
            let row = row.as_ref();
            let (id, logprob) = seq.sampler.sample(row);
            if !logprob.is_finite() {
                broken.push((seq.slot, non_finite(seq.guide.is_some())));
                continue;
            }
            if let Some(guide) = &mut seq.guide
                && let Err(e) = guide.advance(id, &ends)
            {
                broken.push((seq.slot, e));
                continue;
            }
            let top = if req.top_logprobs > 0 {
                top_k(&log_softmax(row, req.temperature.logprob_divisor()), req.top_logprobs as usize)
            } else {
                Vec::new()
            };
            seq.next = id;
            seq.tokens.push(id);
            let token = TokenLogprob { id, logprob, top };
            if let Some(stream) = &req.stream {
                let _ = stream.send(TokenEvent { choice: seq.choice, token: token.clone() });
            }
            seq.logprobs.push(token);
        }
        for (slot, e) in broken {
            self.fail_slot(slot, e);
        }
        for (req, tx, cache, cached, req_rows) in prefilled {
            self.start_choices(req, tx, cache, cached, &req_rows);
        }
        self.finish_done();
        Ok(())
    }

    /// Answers a running request with `e` and drops its sequences.
    fn fail_slot(&mut self, slot: usize, e: Error) {
        if let Some(run) = self.running[slot].take() {
            let _ = run.tx.send(Err(e));
        }
        self.seqs.retain(|s| s.slot != slot);
    }

    /// After a prompt's prefill: answers a scoring-only request, or starts its `n` choices.
    fn start_choices(
        &mut self,
        req: GenRequest,
        tx: oneshot::Sender<Result<GenOutput>>,
        cache: R::Cache,
        cached: usize,
        rows: &[&[f32]],
    ) {
        let prompt_logprobs = req.prompt_logprobs.map(|k| {
            let mut out = vec![None];
            for (i, id) in req.prompt.iter().enumerate().skip(1) {
                let lp = log_softmax(rows[i - 1], 1.0);
                out.push(Some(TokenLogprob { id: *id, logprob: lp[*id as usize], top: top_k(&lp, k as usize) }));
            }
            out
        });
        let finite = |lp: &Option<TokenLogprob>| lp.as_ref().is_none_or(|t| t.logprob.is_finite());
        if prompt_logprobs.as_ref().is_some_and(|lps| !lps.iter().all(finite)) {
            let _ = tx.send(Err(non_finite(false)));
            return;
        }
        let n = req.n as usize;
        if req.max_tokens == 0 {
            // Scoring only: no completion tokens.
            let empty =
                Completion { token_ids: Vec::new(), logprobs: Vec::new(), text: String::new(), finish: Finish::Length };
            let _ = tx.send(Ok(GenOutput {
                completions: vec![empty; n],
                prompt_logprobs,
                weights_version: self.version,
                cached_tokens: cached,
            }));
            return;
        }
        let last = rows.last().copied().unwrap_or_default();
        let slot = self.free_slot();
        let max_len = self.rt.config().max_position_embeddings;
        let own = (req.max_tokens as usize).min(max_len.saturating_sub(req.prompt.len()));
        let mut caches = if n == 1 {
            vec![cache]
        } else {
            match self.rt.freeze(cache) {
                Ok(prefix) => (0..n).map(|_| self.rt.new_cache(Some(&prefix), own)).collect(),
                Err(e) => {
                    let _ = tx.send(Err(Error::Engine(format!("cannot share the prompt's cache: {e}"))));
                    return;
                }
            }
        };
        let mut last = processed(&req, last, &[], &self.tok.stop_ids);
        let ends = req.guide.as_ref().map(|_| end_ids(&self.tok.stop_ids, &req)).unwrap_or_default();
        let mut guide = req.guide.clone();
        // Every choice starts from the same state, so the first mask is computed once.
        if let Some(g) = &mut guide
            && let Err(e) = g.mask(last.to_mut(), &ends)
        {
            let _ = tx.send(Err(e));
            return;
        }
        let last = last.as_ref();
        for choice in (0..n).rev() {
            let mut sampler = Sampler::new(req.temperature, req.top_p, req.top_k, req.seed.wrapping_add(choice as u64))
                .with_min_p(req.min_p);
            let (id, logprob) = sampler.sample(last);
            let mut own_guide = guide.clone();
            let advanced = match &mut own_guide {
                Some(g) if logprob.is_finite() => g.advance(id, &ends),
                _ => Ok(()),
            };
            let failed = if logprob.is_finite() { advanced.err() } else { Some(non_finite(guide.is_some())) };
            if let Some(e) = failed {
                self.seqs.retain(|s| s.slot != slot);
                let _ = tx.send(Err(e));
                return;
            }
            let top = top_k(&log_softmax(last, req.temperature.logprob_divisor()), req.top_logprobs as usize);
            if let Some(stream) = &req.stream {
                let token = TokenLogprob { id, logprob, top: top.clone() };
                let _ = stream.send(TokenEvent { choice, token });
            }
            self.seqs.push(Seq {
                slot,
                choice,
                cache: caches.pop().expect("one cache per choice"),
                sampler,
                guide: own_guide,
                next: id,
                tokens: vec![id],
                logprobs: vec![TokenLogprob { id, logprob, top }],
            });
        }
        self.running[slot] = Some(Running { tx, req, done: vec![None; n], prompt_logprobs, cached });
    }

    fn free_slot(&mut self) -> usize {
        if let Some(i) = self.running.iter().position(Option::is_none) {
            return i;
        }
        self.running.push(None);
        self.running.len() - 1
    }

    /// Moves finished sequences into their requests; answers requests whose choices are all done.
    fn finish_done(&mut self) {
        let max_len = self.rt.config().max_position_embeddings;
        let mut i = 0;
        while i < self.seqs.len() {
            let seq = &self.seqs[i];
            let req = &self.running[seq.slot].as_ref().expect("running slot").req;
            let last = *seq.tokens.last().expect("one token at least");
            // vLLM checks neither stop strings nor end-of-sequence before `min_tokens`.
            let may_stop = seq.tokens.len() >= req.min_tokens as usize;
            let stop_token = may_stop && req.stop_token_ids.contains(&last);
            // A stop token id ends the completion and, as in vLLM, is not part of its text.
            let kept = &seq.tokens[..seq.tokens.len() - usize::from(stop_token)];
            let text_ids: Vec<u32> = kept.iter().copied().filter(|t| !self.tok.stop_ids.contains(t)).collect();
            let text = self.tok.decode(&text_ids).unwrap_or_default();
            // The earliest stop string (and where it ends, for `include_stop_str_in_output`).
            let stop_at = req
                .stop
                .iter()
                .filter_map(|s| text.find(s.as_str()).map(|at| (at, at + s.len())))
                .min()
                .filter(|_| may_stop);
            let eos = self.tok.stop_ids.contains(&last) && !req.ignore_eos && may_stop;
            let finish = if eos || stop_token || stop_at.is_some() {
                Some(Finish::Stop)
            } else if seq.tokens.len() >= req.max_tokens as usize || req.prompt.len() + seq.tokens.len() >= max_len {
                Some(Finish::Length)
            } else {
                None
            };
            let Some(finish) = finish else {
                i += 1;
                continue;
            };
            let seq = self.seqs.swap_remove(i);
            let text = match stop_at {
                Some((_, end)) if req.include_stop_str => text[..end].to_owned(),
                Some((at, _)) => text[..at].to_owned(),
                None => text,
            };
            let run = self.running[seq.slot].as_mut().expect("running slot");
            run.done[seq.choice] = Some(Completion { token_ids: seq.tokens, logprobs: seq.logprobs, text, finish });
            if run.done.iter().all(Option::is_some) {
                let run = self.running[seq.slot].take().expect("running slot");
                let completions = run.done.into_iter().map(|c| c.expect("all done")).collect();
                let _ = run.tx.send(Ok(GenOutput {
                    completions,
                    prompt_logprobs: run.prompt_logprobs,
                    weights_version: self.version,
                    cached_tokens: run.cached,
                }));
            }
        }
    }

    fn fail_all(&mut self, e: &Error) {
        tracing::error!(error = %e, "decode step failed; failing running requests");
        self.seqs.clear();
        for run in self.running.iter_mut().filter_map(Option::take) {
            let _ = run.tx.send(Err(e.clone()));
        }
    }
}

/// A NaN or infinite log-probability is never served: the request fails instead (a model with
/// broken weights, or values that overflow), so a client never trains on or reads garbage.
fn non_finite(constrained: bool) -> Error {
    if constrained {
        // Every token the constraint allows was masked otherwise (`min_tokens` holding back the
        // end of a complete match, a `logit_bias` of -100 on each allowed token), the constraint
        // needs text the vocabulary cannot spell, or NaN logits.
        return Error::BadRequest(String::from(
            "no token can be sampled: the structured-output constraint allows none that the other settings \
             (min_tokens, logit_bias, stop_token_ids) leave, or needs text no token of this model's vocabulary \
             spells, or the model produced non-finite logits",
        ));
    }
    Error::Engine(String::from("the model produced non-finite logits (NaN or infinity) for this request"))
}

/// The ids that end a completion: the model's end-of-sequence ids and the request's stop ids.
fn end_ids(stop_ids: &[u32], req: &GenRequest) -> Vec<u32> {
    stop_ids.iter().chain(&req.stop_token_ids).copied().collect()
}

/// The part of a prompt the prompt cache keeps: all but its last token.
fn prompt_key(prompt: &[u32]) -> &[u32] {
    &prompt[..prompt.len().saturating_sub(1)]
}

fn top_k(logp: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let by_prob = |&a: &usize, &b: &usize| logp[b].total_cmp(&logp[a]).then(a.cmp(&b));
    let mut idx: Vec<usize> = (0..logp.len()).collect();
    // Partition out the k best before ordering them: a full sort of a large vocabulary per token
    // costs more than the forward of a small model.
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_prob);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_prob);
    idx.into_iter().map(|i| (i as u32, logp[i])).collect()
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_is_the_k_most_likely_in_order() {
        let lp = [-2.0f32, -0.5, -3.0, -0.5, -1.0, -9.0];
        assert_eq!(top_k(&lp, 3), vec![(1, -0.5), (3, -0.5), (4, -1.0)]);
        assert_eq!(top_k(&lp, 1), vec![(1, -0.5)]);
        assert_eq!(top_k(&lp, 0), vec![]);
        let all = top_k(&lp, 10);
        assert_eq!(all.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 4, 0, 2, 5]);
    }
}
