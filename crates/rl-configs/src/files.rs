//! `ConfigFile` for every command's config type: how each resolves and what a dry run writes.

use rl_run::{ConfigPart, RunDir};
use std::path::PathBuf;

use serde_json::Value;

use crate::env_server::EnvServerConfig;
use crate::error::Result;
use crate::inference::InferenceConfig;
use crate::load::{ConfigFile, to_json};
use crate::orchestrator::OrchestratorConfig;
use crate::prime_rl::PrimeRlLayout;
use crate::rl::{RlConfig, propagate_shared};
use crate::sft::SftConfig;
use crate::trainer::TrainerConfig;

impl ConfigFile for RlConfig {
    const ORCHESTRATOR_AT: Option<&'static [&'static str]> = Some(&["orchestrator"]);
    const PRIME_RL: PrimeRlLayout = PrimeRlLayout {
        monitors: true,
        trainer_at: Some(&["trainer"]),
        sft: false,
        inference_at: Some(&["inference"]),
    };
    const MODELS_AT: &'static [&'static [&'static str]] =
        &[&["model"], &["trainer", "model"], &["orchestrator", "model"], &["inference", "model"]];

    fn prepare(raw: &mut Value) -> Result<()> {
        propagate_shared(raw)
    }

    fn finish(&mut self) -> Result<()> {
        self.resolve()?;
        self.validate()
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        let parts = self.parts();
        let mut files = vec![
            (RunDir::config_name(ConfigPart::Rl), to_json(self)),
            (RunDir::config_name(ConfigPart::Trainer), to_json(&parts.trainer)),
            (RunDir::config_name(ConfigPart::Orchestrator), to_json(&parts.orchestrator)),
        ];
        if let Some(inference) = &parts.inference {
            files.push((RunDir::config_name(ConfigPart::Inference), to_json(inference)));
        }
        for env in &parts.env_servers {
            files.push((
                RunDir::config_name(ConfigPart::EnvServer { split: env.split, name: &env.name }),
                to_json(&env.config),
            ));
        }
        Ok((RunDir::new(self.run_dir()).configs(), files))
    }
}

impl ConfigFile for OrchestratorConfig {
    const ORCHESTRATOR_AT: Option<&'static [&'static str]> = Some(&[]);
    const MODELS_AT: &'static [&'static [&'static str]] = &[&["model"]];

    fn finish(&mut self) -> Result<()> {
        self.resolve();
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((
            RunDir::new(&self.output_dir).configs(),
            vec![(RunDir::config_name(ConfigPart::Orchestrator), to_json(self))],
        ))
    }
}

impl ConfigFile for TrainerConfig {
    const PRIME_RL: PrimeRlLayout =
        PrimeRlLayout { monitors: false, trainer_at: Some(&[]), sft: false, inference_at: None };
    const MODELS_AT: &'static [&'static [&'static str]] = &[&["model"]];

    fn finish(&mut self) -> Result<()> {
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(&self.output_dir).configs(), vec![(RunDir::config_name(ConfigPart::Trainer), to_json(self))]))
    }
}

impl ConfigFile for InferenceConfig {
    const PRIME_RL: PrimeRlLayout =
        PrimeRlLayout { monitors: false, trainer_at: None, sft: false, inference_at: Some(&[]) };
    const MODELS_AT: &'static [&'static [&'static str]] = &[&["model"]];

    fn finish(&mut self) -> Result<()> {
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(&self.output_dir).configs(), vec![(RunDir::config_name(ConfigPart::Inference), to_json(self))]))
    }
}

impl ConfigFile for EnvServerConfig {
    fn finish(&mut self) -> Result<()> {
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        let name = self.env.name.clone().unwrap_or_else(|| self.env.id.clone());
        Ok((
            RunDir::new(&self.output_dir).configs(),
            vec![(RunDir::config_name(ConfigPart::EnvServerAlone { name: &name }), to_json(self))],
        ))
    }
}

impl ConfigFile for SftConfig {
    const PRIME_RL: PrimeRlLayout =
        PrimeRlLayout { monitors: true, trainer_at: Some(&[]), sft: true, inference_at: None };
    const MODELS_AT: &'static [&'static [&'static str]] = &[&["model"]];

    fn finish(&mut self) -> Result<()> {
        self.resolve();
        if self.run.name.is_none() {
            self.run.name = Some(String::from("sft"));
        }
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(self.run_dir()).configs(), vec![(RunDir::config_name(ConfigPart::Sft), to_json(self))]))
    }
}
