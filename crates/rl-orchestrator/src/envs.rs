//! The env servers of a run: training envs (with their group size, sampling, ratio and attached
//! algorithms) and eval envs, connected and checked once at start.

use std::time::Duration;

use rl_configs::{
    EvalConfig, EvalEnvConfig, OrchestratorConfig, SamplingConfig, ServeConfig, Temperature, TrainEnvConfig,
};
use rl_serve::{ClientOptions, EnvClient, pb};

use crate::algorithms::{Algorithm, EnvInfo, build};
use crate::curriculum::Curriculum;
use crate::error::{Error, Result};

/// A training env.
#[derive(Debug)]
pub(crate) struct TrainEnv {
    /// Index in the run's train envs (and in the batch's `env_names`).
    pub index: u32,
    /// What the env server says about itself.
    pub info: EnvInfo,
    /// Its server.
    pub client: EnvClient,
    /// Rollouts per group.
    pub group_size: u32,
    /// Sampling of its rollouts.
    pub sampling: SamplingConfig,
    /// Sampling of the greedy rollout run beside each group, when an algorithm needs one (the
    /// env's sampling at temperature 0).
    pub greedy_sampling: Option<SamplingConfig>,
    /// Share of the batch's groups.
    pub ratio: f64,
    /// How its tasks are drawn.
    pub curriculum: Curriculum,
    /// Its algorithms, attached.
    pub algorithms: Vec<Box<dyn Algorithm>>,
}

impl TrainEnv {
    /// The env's name in the run.
    pub(crate) fn name(&self) -> &str {
        &self.info.name
    }

    /// Its curriculum's metrics and its algorithms' (`algorithm/<env>/<id>/<name>`) since the last
    /// call.
    pub(crate) fn take_metrics(&mut self) -> Vec<(String, serde_json::Value)> {
        let env = self.info.name.clone();
        let mut out: Vec<(String, serde_json::Value)> = self.curriculum.metrics(&env).into_iter().collect();
        for a in &mut self.algorithms {
            let id = a.id().to_owned();
            out.extend(a.take_metrics().into_iter().map(|(k, v)| (format!("algorithm/{env}/{id}/{k}"), v.into())));
        }
        out
    }
}

/// An eval env.
#[derive(Debug)]
pub(crate) struct EvalEnv {
    /// The env's name in the run.
    pub name: String,
    /// Its server.
    pub client: EnvClient,
    /// The split evaluated.
    pub split: String,
    /// Examples evaluated (the first ones of the split).
    pub examples: u64,
    /// Samples per example.
    pub k: u32,
    /// Sampling of eval rollouts.
    pub sampling: SamplingConfig,
    /// Evaluated every this many steps (and on start and after the last step).
    pub interval: u64,
}

/// A client of an env server; `serve` describes that server (its `token_env` names the token it
/// requires, read from the same environment variable here).
fn client(address: Option<&String>, name: &str, serve: &ServeConfig, cfg: &OrchestratorConfig) -> Result<EnvClient> {
    let address = address.ok_or_else(|| {
        Error::Config(format!(
            "env `{name}` has no address: start its server (rl env-server) and set `address`, or run under `rl rl`"
        ))
    })?;
    let token = match &serve.token_env {
        Some(var) => Some(rl_serve::ApiKey(
            rl_configs::secret_from_env(&format!("env `{name}` serve.token_env"), var)
                .map_err(|e| Error::Config(e.to_string()))?,
        )),
        None => None,
    };
    let options =
        ClientOptions { timeout: Duration::from_secs_f64(cfg.rollout_timeout_s), token, ..ClientOptions::default() };
    Ok(EnvClient::new(address, options)?)
}

fn split_size(info: &pb::InfoResponse, split: &str) -> u64 {
    info.splits.iter().find(|s| s.name == split).map_or(0, |s| s.size)
}

/// Connects to a training env, waits for its health and attaches its algorithms.
pub(crate) async fn connect_train(cfg: &OrchestratorConfig, e: &TrainEnvConfig, index: u32) -> Result<TrainEnv> {
    let client = client(e.address.as_ref(), e.display_name(), &e.serve, cfg)?;
    client.wait_for_health(Duration::from_secs_f64(cfg.wait_for_ready_s)).await?;
    let wire = client.info().await?;
    let train_size = split_size(&wire, "train");
    if train_size == 0 {
        return Err(Error::Config(format!("env `{}` has no `train` split", e.display_name())));
    }
    let info = EnvInfo {
        name: e.display_name().to_owned(),
        members: wire.member_ids.clone(),
        judge: wire.metadata.get("judge_member").cloned(),
        offered: wire.algorithms,
    };
    let mut algorithms = Vec::new();
    for a in cfg.env_algorithms(e) {
        let mut algorithm = build(a)?;
        algorithm.attach(&info)?;
        algorithms.push(algorithm);
    }
    let sampling = cfg.env_sampling(e);
    let greedy_sampling = algorithms
        .iter()
        .any(|a| a.needs_greedy())
        .then(|| SamplingConfig { temperature: Temperature::GREEDY, ..sampling.clone() });
    Ok(TrainEnv {
        index,
        info,
        client,
        group_size: cfg.env_group_size(e),
        sampling,
        greedy_sampling,
        ratio: e.ratio,
        curriculum: Curriculum::new(&e.curriculum, train_size),
        algorithms,
    })
}

/// Connects to an eval env and sizes its evaluation.
pub(crate) async fn connect_eval(cfg: &OrchestratorConfig, eval: &EvalConfig, e: &EvalEnvConfig) -> Result<EvalEnv> {
    let client = client(e.address.as_ref(), e.display_name(), &e.serve, cfg)?;
    client.wait_for_health(Duration::from_secs_f64(cfg.wait_for_ready_s)).await?;
    let size = split_size(&client.info().await?, &e.split);
    if size == 0 {
        return Err(Error::Config(format!("eval env `{}` has no `{}` split", e.display_name(), e.split)));
    }
    let wanted = e.num_examples.or(eval.num_examples).map_or(size, u64::from);
    // Asking for more tasks than the split holds is refused, not quietly cut to the split: a
    // figure reported as "on 256 episodes" must be on 256 episodes.
    if wanted > size {
        let key = if e.num_examples.is_some() {
            "orchestrator.eval.env.num_examples"
        } else {
            "orchestrator.eval.num_examples"
        };
        return Err(Error::Config(format!(
            "eval env `{}`: `{key}` is {wanted}, but its `{}` split holds {size} tasks; ask for at most {size}, \
             or make the split larger (built-in envs: the `test_examples` arg)",
            e.display_name(),
            e.split
        )));
    }
    Ok(EvalEnv {
        name: e.display_name().to_owned(),
        client,
        split: e.split.clone(),
        examples: wanted,
        k: e.k.unwrap_or(eval.k),
        sampling: cfg.train.sampling.merged(&eval.sampling).merged(&e.sampling),
        interval: e.interval.unwrap_or(eval.interval),
    })
}
