//! `ConfigFile` for every command's config type: how each resolves and what a dry run writes.

use crate::run_dir::RunDir;
use std::path::PathBuf;

use serde_json::Value;

use crate::env_server::EnvServerConfig;
use crate::error::Result;
use crate::inference::InferenceConfig;
use crate::load::{ConfigFile, to_json};
use crate::orchestrator::OrchestratorConfig;
use crate::rl::{RlConfig, propagate_shared};
use crate::sft::SftConfig;
use crate::trainer::TrainerConfig;

impl ConfigFile for RlConfig {
    const ORCHESTRATOR_AT: Option<&'static [&'static str]> = Some(&["orchestrator"]);

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
            (PathBuf::from("rl.json"), to_json(self)),
            (PathBuf::from("trainer.json"), to_json(&parts.trainer)),
            (PathBuf::from("orchestrator.json"), to_json(&parts.orchestrator)),
        ];
        if let Some(inference) = &parts.inference {
            files.push((PathBuf::from("inference.json"), to_json(inference)));
        }
        for env in &parts.env_servers {
            files
                .push((PathBuf::from("envs").join(env.split).join(format!("{}.json", env.name)), to_json(&env.config)));
        }
        Ok((RunDir::new(self.run_dir()).configs(), files))
    }
}

impl ConfigFile for OrchestratorConfig {
    const ORCHESTRATOR_AT: Option<&'static [&'static str]> = Some(&[]);

    fn finish(&mut self) -> Result<()> {
        self.resolve();
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(&self.output_dir).configs(), vec![(PathBuf::from("orchestrator.json"), to_json(self))]))
    }
}

impl ConfigFile for TrainerConfig {
    fn finish(&mut self) -> Result<()> {
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(&self.output_dir).configs(), vec![(PathBuf::from("trainer.json"), to_json(self))]))
    }
}

impl ConfigFile for InferenceConfig {
    fn finish(&mut self) -> Result<()> {
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(&self.output_dir).configs(), vec![(PathBuf::from("inference.json"), to_json(self))]))
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
            vec![(PathBuf::from(format!("env-server-{name}.json")), to_json(self))],
        ))
    }
}

impl ConfigFile for SftConfig {
    fn finish(&mut self) -> Result<()> {
        if self.run.name.is_none() {
            self.run.name = Some(String::from("sft"));
        }
        self.validate("")
    }

    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)> {
        Ok((RunDir::new(self.run_dir()).configs(), vec![(PathBuf::from("sft.json"), to_json(self))]))
    }
}
