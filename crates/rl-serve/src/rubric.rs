//! Rubrics: weighted reward functions plus zero-weight metrics, grouped with `RubricGroup`.
//!
//! The training context reaches reward functions only through [`ScoringContext`], built per
//! request. Rubrics are immutable and shared by every request, so a context can never leak from one
//! request into another or linger after it.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::episode::State;
use crate::model_client::ModelClient;
use crate::types::{Message, ModelRuntime, Role, Task, TrainingContext};

/// No models: for scoring outside a request.
pub static NO_MODELS: BTreeMap<String, ModelRuntime> = BTreeMap::new();

/// Everything a reward function may look at for one rollout.
#[derive(Debug, Clone, Copy)]
pub struct ScoringContext<'a> {
    /// The task.
    pub task: &'a Task,
    /// The whole conversation, prompt included.
    pub messages: &'a [Message],
    /// The episode's state (turn count, env scratch data).
    pub state: &'a State,
    /// The request's training context; `None` when the request carried none.
    pub training_context: Option<&'a TrainingContext>,
    /// The request's extra models by key (judges, teachers), as the orchestrator's `models` pools.
    pub models: &'a BTreeMap<String, ModelRuntime>,
    /// The client to call them with; `None` outside a request.
    pub client: Option<&'a ModelClient>,
}

impl ScoringContext<'_> {
    /// The training step this rollout is scored at (0 without a context).
    pub fn step(&self) -> u64 {
        self.training_context.map_or(0, |c| c.step)
    }

    /// Contents of the assistant messages, in order.
    pub fn assistant_replies(&self) -> Vec<&str> {
        self.messages.iter().filter(|m| m.role == Role::Assistant).map(|m| m.content.as_str()).collect()
    }

    /// Asks the request's model `key` (an LLM judge): the reply text to `messages`, sampled with
    /// that model's sampling arguments. An error names what is missing or what failed.
    pub async fn ask(&self, key: &str, messages: &[Message]) -> Result<String, String> {
        let runtime = self.models.get(key).ok_or_else(|| {
            let known: Vec<&str> = self.models.keys().map(String::as_str).collect();
            format!("the request has no model {key:?} (it has: {})", known.join(", "))
        })?;
        let client = self.client.ok_or_else(|| String::from("no model client outside a request"))?;
        let response = client.chat(runtime, messages, &[], None, 1, None).await.map_err(|e| e.to_string())?;
        response
            .choices
            .into_iter()
            .next()
            .map(|c| c.message.content)
            .ok_or_else(|| format!("{key} returned no choice"))
    }

    /// The last assistant reply ("" if none).
    pub fn last_reply(&self) -> &str {
        self.messages.iter().rev().find(|m| m.role == Role::Assistant).map_or("", |m| m.content.as_str())
    }
}

/// A reward (or metric) function.
#[async_trait]
pub trait RewardFn: Send + Sync {
    /// Name in `rewards` / `metrics`.
    fn name(&self) -> &str;
    /// Scores one rollout. An error scores 0 and is recorded.
    async fn score(&self, ctx: &ScoringContext<'_>) -> Result<f64, String>;
}

/// A reward function from a plain closure.
pub struct FnReward<F> {
    name: String,
    f: F,
}

impl<F> std::fmt::Debug for FnReward<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnReward").field("name", &self.name).finish()
    }
}

/// Wraps a closure as a [`RewardFn`].
pub fn reward_fn<F>(name: &str, f: F) -> Arc<dyn RewardFn>
where
    F: Fn(&ScoringContext<'_>) -> Result<f64, String> + Send + Sync + 'static,
{
    Arc::new(FnReward { name: name.to_owned(), f })
}

#[async_trait]
impl<F> RewardFn for FnReward<F>
where
    F: Fn(&ScoringContext<'_>) -> Result<f64, String> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn score(&self, ctx: &ScoringContext<'_>) -> Result<f64, String> {
        (self.f)(ctx)
    }
}

/// A reward function that scores each model turn of a multi-turn episode. Its episode score is
/// the mean of its turn scores (so the episode reward is what a plain function returning that
/// mean would give), and the weighted turn scores go to the trace's `turn_rewards` for
/// algorithms that credit each turn's tokens with that turn's reward.
#[async_trait]
pub trait TurnRewardFn: Send + Sync {
    /// Name in `rewards`.
    fn name(&self) -> &str;
    /// One score per model turn (expected turns the model never reached score 0). An error
    /// scores the episode 0 and is recorded.
    async fn score_turns(&self, ctx: &ScoringContext<'_>) -> Result<Vec<f64>, String>;
}

/// Wraps a closure as a [`TurnRewardFn`].
pub fn turn_reward_fn<F>(name: &str, f: F) -> Arc<dyn TurnRewardFn>
where
    F: Fn(&ScoringContext<'_>) -> Result<Vec<f64>, String> + Send + Sync + 'static,
{
    Arc::new(FnReward { name: name.to_owned(), f })
}

#[async_trait]
impl<F> TurnRewardFn for FnReward<F>
where
    F: Fn(&ScoringContext<'_>) -> Result<Vec<f64>, String> + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn score_turns(&self, ctx: &ScoringContext<'_>) -> Result<Vec<f64>, String> {
        (self.f)(ctx)
    }
}

/// One function of a [`BatchRewardFn`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatchFunction {
    /// Name in `rewards` / `metrics`.
    pub name: String,
    /// Weight; 0 makes it a metric.
    pub weight: f64,
    /// It scores each model turn (a [`TurnRewardFn`] that lives elsewhere).
    pub per_turn: bool,
}

/// What one function of a [`BatchRewardFn`] returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Scored {
    /// One score for the episode.
    Value(f64),
    /// One score per model turn (functions declared `per_turn`).
    Turns(Vec<f64>),
}

/// Several reward functions scored in one call (e.g. by another process): their names and weights,
/// and one result per function, in the same order.
#[async_trait]
pub trait BatchRewardFn: Send + Sync {
    /// The functions, in the order `score_all` answers.
    fn functions(&self) -> &[BatchFunction];
    /// Scores one rollout with every function; a failing one is an `Err` with its message.
    async fn score_all(&self, ctx: &ScoringContext<'_>) -> Vec<Result<Scored, String>>;
}

/// The outcome of scoring one rollout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scores {
    /// Weighted components: name -> (score, weight).
    pub rewards: BTreeMap<String, (f64, f64)>,
    /// Zero-weight metrics.
    pub metrics: BTreeMap<String, f64>,
    /// Functions that failed: (name, message). Each scored 0.
    pub errors: Vec<(String, String)>,
    /// Per-turn rewards: the weighted sum, turn by turn, of the turn reward functions' scores.
    /// `None` without turn reward functions, or when one of them failed (the turns' rewards are
    /// then unknown; the episode reward still counts the failure as 0).
    pub turns: Option<Vec<f64>>,
    /// A turn reward function failed: `turns` is dropped when scoring ends.
    turns_failed: bool,
}

impl Scores {
    /// The total reward: sum of score * weight.
    pub fn total(&self) -> f64 {
        self.rewards.values().map(|(s, w)| s * w).sum()
    }

    /// Records one function's result: a failure or a non-finite value scores 0 and is kept as an error.
    fn record(&mut self, name: &str, weight: f64, result: Result<f64, String>) {
        let value = match result {
            Ok(v) if v.is_finite() => v,
            Ok(v) => {
                self.errors.push((name.to_owned(), format!("returned a non-finite value {v}")));
                0.0
            }
            Err(message) => {
                tracing::warn!(function = name, %message, "reward function failed; scoring 0");
                self.errors.push((name.to_owned(), message));
                0.0
            }
        };
        if weight == 0.0 {
            self.metrics.insert(name.to_owned(), value);
        } else {
            self.rewards.insert(name.to_owned(), (value, weight));
        }
    }

    /// Drops the per-turn rewards if a turn function failed.
    fn settle(mut self) -> Self {
        if self.turns_failed {
            self.turns = None;
        }
        self
    }

    /// Records one turn reward function's result: its mean as the episode component, its
    /// weighted scores added turn by turn.
    fn record_turns(&mut self, name: &str, weight: f64, result: Result<Vec<f64>, String>) {
        let result = result.and_then(|turns| match turns.iter().find(|v| !v.is_finite()) {
            Some(v) => Err(format!("returned a non-finite turn score {v}")),
            None => Ok(turns),
        });
        let turns = match result {
            Ok(turns) => turns,
            Err(message) => {
                self.record(name, weight, Err(message));
                self.turns_failed = true;
                return;
            }
        };
        let mean = if turns.is_empty() { 0.0 } else { turns.iter().sum::<f64>() / turns.len() as f64 };
        self.record(name, weight, Ok(mean));
        self.add_turns(turns.iter().map(|v| v * weight).collect());
    }

    /// Adds per-turn rewards turn by turn (the shorter list counts 0 for the turns it lacks).
    fn add_turns(&mut self, turns: Vec<f64>) {
        let sum = self.turns.get_or_insert_with(Vec::new);
        if sum.len() < turns.len() {
            sum.resize(turns.len(), 0.0);
        }
        sum.iter_mut().zip(turns).for_each(|(s, v)| *s += v);
    }

    fn absorb(&mut self, other: Scores) {
        self.turns_failed |= other.turns_failed;
        if let Some(turns) = other.turns {
            self.add_turns(turns);
        }
        for (name, (score, weight)) in other.rewards {
            let entry = self.rewards.entry(name).or_insert((0.0, weight));
            entry.0 += score;
        }
        for (name, value) in other.metrics {
            *self.metrics.entry(name).or_insert(0.0) += value;
        }
        self.errors.extend(other.errors);
    }
}

/// Weighted reward functions and zero-weight metrics.
#[derive(Default, Clone)]
pub struct Rubric {
    funcs: Vec<(Arc<dyn RewardFn>, f64)>,
    turn_funcs: Vec<(Arc<dyn TurnRewardFn>, f64)>,
    batches: Vec<Arc<dyn BatchRewardFn>>,
}

impl std::fmt::Debug for Rubric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<(&str, f64)> = self.funcs.iter().map(|(g, w)| (g.name(), *w)).collect();
        names.extend(self.turn_funcs.iter().map(|(g, w)| (g.name(), *w)));
        names.extend(self.batches.iter().flat_map(|b| b.functions().iter().map(|f| (f.name.as_str(), f.weight))));
        f.debug_struct("Rubric").field("funcs", &names).finish()
    }
}

impl Rubric {
    /// An empty rubric.
    pub fn new() -> Self {
        Rubric::default()
    }

    /// Adds a reward function with a weight.
    pub fn reward(mut self, f: Arc<dyn RewardFn>, weight: f64) -> Self {
        self.funcs.push((f, weight));
        self
    }

    /// Adds a per-turn reward function with a weight (see [`TurnRewardFn`]).
    pub fn turn_reward(mut self, f: Arc<dyn TurnRewardFn>, weight: f64) -> Self {
        self.turn_funcs.push((f, weight));
        self
    }

    /// Adds a metric (a zero-weight function, reported but not part of the reward).
    pub fn metric(mut self, f: Arc<dyn RewardFn>) -> Self {
        self.funcs.push((f, 0.0));
        self
    }

    /// Adds functions scored together in one call.
    pub fn batch(mut self, b: Arc<dyn BatchRewardFn>) -> Self {
        self.batches.push(b);
        self
    }

    /// Scores one rollout: every function runs; a failing one scores 0 and is recorded.
    pub async fn score(&self, ctx: &ScoringContext<'_>) -> Scores {
        let mut scores = Scores::default();
        for (f, weight) in &self.funcs {
            scores.record(f.name(), *weight, f.score(ctx).await);
        }
        for (f, weight) in &self.turn_funcs {
            scores.record_turns(f.name(), *weight, f.score_turns(ctx).await);
        }
        for b in &self.batches {
            let results = b.score_all(ctx).await;
            for (i, f) in b.functions().iter().enumerate() {
                let result = results.get(i).cloned().unwrap_or_else(|| Err(String::from("no result was returned")));
                match (f.per_turn, result) {
                    (false, Ok(Scored::Value(v))) => scores.record(&f.name, f.weight, Ok(v)),
                    (true, Ok(Scored::Turns(t))) => scores.record_turns(&f.name, f.weight, Ok(t)),
                    (true, Ok(Scored::Value(_))) => {
                        scores.record_turns(
                            &f.name,
                            f.weight,
                            Err(String::from("returned one value, expected one per turn")),
                        );
                    }
                    (false, Ok(Scored::Turns(_))) => {
                        scores.record(&f.name, f.weight, Err(String::from("returned turn scores, expected one value")));
                    }
                    (true, Err(e)) => scores.record_turns(&f.name, f.weight, Err(e)),
                    (false, Err(e)) => scores.record(&f.name, f.weight, Err(e)),
                }
            }
        }
        scores.settle()
    }
}

/// Several rubrics scored together: rewards and metrics are summed by name.
#[derive(Debug, Default, Clone)]
pub struct RubricGroup {
    rubrics: Vec<Rubric>,
}

impl RubricGroup {
    /// A group of rubrics.
    pub fn new(rubrics: Vec<Rubric>) -> Self {
        RubricGroup { rubrics }
    }

    /// Scores one rollout with every child rubric, each seeing the same context.
    pub async fn score(&self, ctx: &ScoringContext<'_>) -> Scores {
        let mut total = Scores::default();
        for rubric in &self.rubrics {
            total.absorb(rubric.score(ctx).await);
        }
        total.settle()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn score(group: &RubricGroup) -> Scores {
        let task = Task { key: String::from("train/0"), data: json!({}) };
        let state = State::default();
        let ctx = ScoringContext {
            task: &task,
            messages: &[],
            state: &state,
            training_context: None,
            models: &NO_MODELS,
            client: None,
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(group.score(&ctx))
    }

    fn turns(name: &str, values: Result<Vec<f64>, String>) -> Arc<dyn TurnRewardFn> {
        turn_reward_fn(name, move |_: &ScoringContext<'_>| values.clone())
    }

    #[test]
    fn turn_rewards_are_weighted_and_summed_per_turn_and_their_mean_is_the_component() {
        let a = Rubric::new().turn_reward(turns("a", Ok(vec![1.0, 0.5])), 2.0);
        let b = Rubric::new()
            .turn_reward(turns("b", Ok(vec![0.0, 1.0, 1.0])), 1.0)
            .reward(reward_fn("c", |_: &ScoringContext<'_>| Ok(0.3)), 1.0);
        let s = score(&RubricGroup::new(vec![a, b]));
        assert_eq!(s.turns, Some(vec![2.0, 2.0, 1.0]));
        assert_eq!(s.rewards["a"], (0.75, 2.0));
        assert_eq!(s.rewards["b"], (2.0 / 3.0, 1.0));
        assert!((s.total() - (1.5 + 2.0 / 3.0 + 0.3)).abs() < 1e-12);
        assert!(s.errors.is_empty());
    }

    #[test]
    fn a_failing_turn_function_scores_zero_and_leaves_the_turns_unknown() {
        let ok = Rubric::new().turn_reward(turns("ok", Ok(vec![1.0])), 1.0);
        let failing = Rubric::new().turn_reward(turns("bad", Err(String::from("boom"))), 1.0);
        let s = score(&RubricGroup::new(vec![ok, failing]));
        assert_eq!(s.turns, None);
        assert_eq!(s.rewards["bad"], (0.0, 1.0));
        assert_eq!(s.errors, vec![(String::from("bad"), String::from("boom"))]);
        let nan = Rubric::new().turn_reward(turns("nan", Ok(vec![0.5, f64::NAN])), 1.0);
        let s = score(&RubricGroup::new(vec![nan]));
        assert_eq!((s.turns, s.rewards["nan"]), (None, (0.0, 1.0)));
        assert!(s.errors[0].1.contains("non-finite turn score"), "{:?}", s.errors);
    }

    /// A batch answering fixed results for its functions.
    struct Fixed(Vec<BatchFunction>, Vec<Result<Scored, String>>);

    #[async_trait]
    impl BatchRewardFn for Fixed {
        fn functions(&self) -> &[BatchFunction] {
            &self.0
        }
        async fn score_all(&self, _: &ScoringContext<'_>) -> Vec<Result<Scored, String>> {
            self.1.clone()
        }
    }

    fn function(name: &str, weight: f64, per_turn: bool) -> BatchFunction {
        BatchFunction { name: name.to_owned(), weight, per_turn }
    }

    #[test]
    fn batch_functions_declared_per_turn_give_turn_rewards_and_mismatches_are_errors() {
        let batch = Fixed(
            vec![function("turns", 2.0, true), function("plain", 1.0, false)],
            vec![Ok(Scored::Turns(vec![1.0, 0.0])), Ok(Scored::Value(0.5))],
        );
        let s = score(&RubricGroup::new(vec![Rubric::new().batch(Arc::new(batch))]));
        assert_eq!(s.turns, Some(vec![2.0, 0.0]));
        assert_eq!((s.rewards["turns"], s.rewards["plain"]), ((0.5, 2.0), (0.5, 1.0)));
        let mismatched = Fixed(
            vec![function("turns", 1.0, true), function("plain", 1.0, false)],
            vec![Ok(Scored::Value(1.0)), Ok(Scored::Turns(vec![1.0]))],
        );
        let s = score(&RubricGroup::new(vec![Rubric::new().batch(Arc::new(mismatched))]));
        assert_eq!(s.turns, None);
        let messages: Vec<&str> = s.errors.iter().map(|(_, m)| m.as_str()).collect();
        assert_eq!(messages, ["returned one value, expected one per turn", "returned turn scores, expected one value"]);
    }

    #[test]
    fn without_turn_functions_there_are_no_turn_rewards() {
        let plain = Rubric::new().reward(reward_fn("r", |_: &ScoringContext<'_>| Ok(1.0)), 1.0);
        assert_eq!(score(&RubricGroup::new(vec![plain])).turns, None);
    }
}
