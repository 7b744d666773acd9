//! Subcommand dispatch: which config type each command loads, dry runs, schemas and help.

use std::io::Write;

use anyhow::{Context, bail};
use rl_configs::{
    ConfigFile, EnvServerConfig, InferenceConfig, OrchestratorConfig, RlConfig, SftConfig, TrainerConfig,
    load_resolving, schema_json,
};
use rl_run::write_json_atomic;

/// Commands that take a config, with the config type they load.
const CONFIG_COMMANDS: &[(&str, &str)] = &[
    ("rl", "launch inference, env servers, orchestrator and trainer for an RL run"),
    ("sft", "supervised fine-tuning on a built-in task, a data file or a Hugging Face dataset"),
    ("orchestrator", "run the orchestrator alone"),
    ("trainer", "run the trainer alone"),
    ("inference", "run the embedded OpenAI-compatible inference server"),
    ("env-server", "run one environment's gRPC server"),
    ("eval", "evaluate a served model once on its [[eval.env]] envs (starting their env servers)"),
];

/// Schema parts `rl schema <part>` knows.
const SCHEMA_PARTS: &[&str] = &["rl", "sft", "orchestrator", "trainer", "inference", "env-server"];

/// Runs the command line (without the program name).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let Some((command, rest)) = args.split_first() else {
        print_usage()?;
        bail!("no command given");
    };
    match command.as_str() {
        "-h" | "--help" | "help" => print_usage(),
        "-V" | "--version" | "version" => {
            writeln!(std::io::stdout().lock(), "rl {}", env!("CARGO_PKG_VERSION"))?;
            Ok(())
        }
        "schema" => print_schema(rest),
        // prime-rl's launcher is `rl @ rl.toml`: the same here.
        "@" => config_command::<RlConfig>("rl", args, crate::launcher::rl),
        "rl" => config_command::<RlConfig>(command, rest, crate::launcher::rl),
        "sft" => config_command::<SftConfig>(command, rest, crate::sft::sft),
        "orchestrator" => config_command::<OrchestratorConfig>(command, rest, crate::orchestrating::orchestrator),
        "trainer" => config_command::<TrainerConfig>(command, rest, crate::training::trainer),
        "inference" => config_command::<InferenceConfig>(command, rest, crate::serving::inference),
        "env-server" => config_command::<EnvServerConfig>(command, rest, crate::env_server::run),
        // Evaluation runs envs against a model exactly like the orchestrator's online eval.
        "eval" => checked_config_command::<OrchestratorConfig>(command, rest, crate::eval::check, crate::eval::eval),
        "model" => model_command(rest),
        other => bail!("unknown command `{other}`; run `rl --help` for the list"),
    }
}

fn config_command<T: ConfigFile>(
    command: &str,
    args: &[String],
    run: fn(&str, &T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    checked_config_command(command, args, |_| Ok(()), run)
}

/// As `config_command`, with a check of what this command needs from a config type that other
/// commands share (`rl eval` needs `[[eval.env]]`, which the orchestrator's config leaves
/// optional): `--dry-run` fails where the run would.
fn checked_config_command<T: ConfigFile>(
    command: &str,
    args: &[String],
    check: fn(&T) -> anyhow::Result<()>,
    run: fn(&str, &T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Some(at) = args.iter().position(|a| a == "--help" || a == "-h") {
        return print_command_help::<T>(command, args.get(at + 1).map(String::as_str));
    }
    let dry_run = args.iter().any(|a| a == "--dry-run");
    let args: Vec<String> = args.iter().filter(|a| *a != "--dry-run").cloned().collect();
    let loaded =
        load_resolving::<T>(&args, &hub_model).with_context(|| format!("`rl {command}`: the config is not valid"))?;
    let mut err = std::io::stderr().lock();
    for w in &loaded.warnings {
        writeln!(err, "{}: {w}", w.label())?;
    }
    drop(err);
    check(&loaded.config).with_context(|| format!("`rl {command}`: the config is not valid"))?;
    if dry_run {
        let (dir, files) = loaded.config.resolved_files()?;
        for (name, value) in &files {
            write_json_atomic(&dir.join(name), value)?;
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "config is valid; wrote {} resolved config file(s) to {}", files.len(), dir.display())?;
        return Ok(());
    }
    run(command, &loaded.config)
}

/// A model path that is a hub id in the local Hugging Face hub cache (`Qwen/Qwen3-0.6B`, as
/// transformers and vLLM take it) is that cache's snapshot directory; nothing is downloaded.
fn hub_model(path: &str) -> Result<Option<std::path::PathBuf>, String> {
    let found = rl_data::cached_model(path).map_err(|e| e.to_string())?;
    if let Some(dir) = &found {
        let _ = writeln!(std::io::stderr().lock(), "note: model `{path}` is the hub cache's {}", dir.display());
    }
    Ok(found)
}

const MODEL_INIT_USAGE: &str = "rl model init --out DIR [--preset tiny|small|qwen3-0.6b] [--seed N] [--dtype f32|bf16] [--force] \
     [--hidden-size N] [--intermediate-size N] [--num-layers N] [--num-heads N] [--num-kv-heads N] [--head-dim N] \
     [--init-std X] [--tokenizer-task NAME | --tokenizer-corpus FILE] [--vocab-size N] [--bpe-pieces isolated|attached|phrases]";

const MODEL_INIT_HELP: &str = "Writes a Qwen3-architecture model directory with random weights (config.json,
model.safetensors, a tokenizer and the chat template) that every command loads. The tokenizer is
character-level unless a corpus is given: then it is a BPE trained on that corpus (frequent words
become one token each, so a small model reads and copies them as single symbols).

  --out DIR                the directory to create (required; refused if it exists, unless --force)
  --preset NAME            tiny (0.8M params, the recipes' model), small (4.8M), or qwen3-0.6b
                           (Qwen3-0.6B's shapes and 151936-token vocabulary; the GPU benchmark's
                           model); default tiny
  --hidden-size N, --intermediate-size N, --num-layers N, --num-heads N, --num-kv-heads N, --head-dim N
                           change the preset's shape (config.json's hidden_size, intermediate_size,
                           num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim);
                           the heads must be a multiple of the key/value heads, head_dim even
  --init-std X             standard deviation of the random weights (config.json's
                           initializer_range, which HF's initialisation reads too); default 0.02
  --seed N                 seed of the random weights; default 0
  --dtype f32|bf16         how model.safetensors stores the weights: f32 (default) or bf16, as
                           released checkpoints are (half the bytes; a LoRA base stays bf16 in
                           the trainer, and the CPU runtime packs it in bf16)
  --force                  replace an existing directory
  --tokenizer-task NAME    train the BPE on a built-in task's SFT conversations (reverse-text,
                           alphabet-sort, wiki-nav; 2000 training examples with the task's default args)
  --tokenizer-corpus FILE  train the BPE on FILE: conversations (`messages` or prompt/completion
                           rows, as `rl sft` reads them) when it ends in .jsonl, .json, .csv, .tsv
                           (optionally .gz), .parquet or .arrow, otherwise plain text, one document
                           per line
  --vocab-size N           the BPE's vocabulary, special tokens and characters included; default 512
                           (init says when the BPE fills it with pieces still repeating)
  --bpe-pieces KIND        what the BPE merges within: isolated (words, digit runs, punctuation
                           runs, every space its own token; the default) or attached (a lower-case
                           or all-capital word takes the space before it, punctuation the space
                           after it, an XML-style tag is one piece; capitalised words such as names
                           take no space): ~35% fewer tokens on prose and tagged formats; or
                           phrases (as attached, but what a line holds between capitalised or
                           all-capital words, tags and line breaks is one piece, so a task's
                           fixed wording can become one token; give it a larger --vocab-size)";

fn model_command(args: &[String]) -> anyhow::Result<()> {
    use crate::model_merge::{HELP as MERGE_HELP, USAGE as MERGE_USAGE};
    if args.iter().any(|a| a == "--help" || a == "-h") {
        let help = match args.first().map(String::as_str) {
            Some("merge") => format!("usage: {MERGE_USAGE}\n\n{MERGE_HELP}"),
            Some("init") => format!("usage: {MODEL_INIT_USAGE}\n\n{MODEL_INIT_HELP}"),
            _ => format!("usage: {MODEL_INIT_USAGE}\n       {MERGE_USAGE}\n\n{MODEL_INIT_HELP}\n\n{MERGE_HELP}"),
        };
        writeln!(std::io::stdout().lock(), "{help}")?;
        return Ok(());
    }
    match args.first().map(String::as_str) {
        Some("init") => model_init(&args[1..]),
        Some("merge") => crate::model_merge::merge(&args[1..]),
        Some(other) => bail!("unknown `rl model` command `{other}`; expected `{MODEL_INIT_USAGE}` or `{MERGE_USAGE}`"),
        None => bail!("expected `{MODEL_INIT_USAGE}` or `{MERGE_USAGE}`"),
    }
}

/// `rl model init`: writes a random Qwen3 model directory with a character-level tokenizer.
fn model_init(args: &[String]) -> anyhow::Result<()> {
    let (mut out, mut preset, mut seed, mut force) = (None, rl_model::Preset::Tiny, 0u64, false);
    let mut dtype = candle_core::DType::F32;
    let (mut corpus, mut vocab_size): (Option<Corpus>, Option<usize>) = (None, None);
    let mut pieces: Option<rl_model::BpePieces> = None;
    let mut shape = rl_model::PresetOverrides::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next().with_context(|| format!("`{name}` needs a value; usage: {MODEL_INIT_USAGE}")).cloned()
        };
        match arg.as_str() {
            "--out" => out = Some(std::path::PathBuf::from(value("--out")?)),
            "--preset" => {
                let v = value("--preset")?;
                preset = rl_model::Preset::parse(&v).with_context(|| {
                    format!("unknown preset `{v}`; expected one of {}", rl_model::Preset::NAMES.join(", "))
                })?;
            }
            "--seed" => {
                let v = value("--seed")?;
                seed = v.parse().with_context(|| format!("--seed expects a non-negative integer, got `{v}`"))?;
            }
            "--force" => force = true,
            "--hidden-size"
            | "--intermediate-size"
            | "--num-layers"
            | "--num-heads"
            | "--num-kv-heads"
            | "--head-dim" => {
                let v = value(arg)?;
                let n: usize = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("{arg} expects a positive integer, got `{v}`"))?;
                let field = match arg.as_str() {
                    "--hidden-size" => &mut shape.hidden_size,
                    "--intermediate-size" => &mut shape.intermediate_size,
                    "--num-layers" => &mut shape.num_hidden_layers,
                    "--num-heads" => &mut shape.num_attention_heads,
                    "--num-kv-heads" => &mut shape.num_key_value_heads,
                    _ => &mut shape.head_dim,
                };
                *field = Some(n);
            }
            "--init-std" => {
                let v = value("--init-std")?;
                let std: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 1.0)
                    .with_context(|| format!("--init-std expects a number in (0, 1], got `{v}`"))?;
                shape.initializer_range = Some(std);
            }
            "--dtype" => {
                dtype = match value("--dtype")?.as_str() {
                    "f32" | "float32" => candle_core::DType::F32,
                    "bf16" | "bfloat16" => candle_core::DType::BF16,
                    other => bail!("--dtype: unknown dtype `{other}`; expected f32 or bf16"),
                };
            }
            "--tokenizer-task" | "--tokenizer-corpus" => {
                let v = value(arg)?;
                if corpus.is_some() {
                    bail!("give one of `--tokenizer-task` and `--tokenizer-corpus`, not both or twice");
                }
                corpus = Some(if arg == "--tokenizer-task" { Corpus::Task(v) } else { Corpus::File(v.into()) });
            }
            "--vocab-size" => {
                let v = value("--vocab-size")?;
                vocab_size =
                    Some(v.parse().with_context(|| format!("--vocab-size expects a positive integer, got `{v}`"))?);
            }
            "--bpe-pieces" => {
                let v = value("--bpe-pieces")?;
                pieces = Some(rl_model::BpePieces::parse(&v).with_context(|| {
                    format!(
                        "--bpe-pieces: unknown kind `{v}`; expected one of {}",
                        rl_model::BpePieces::NAMES.join(", ")
                    )
                })?);
            }
            other => bail!("unexpected argument `{other}`; usage: {MODEL_INIT_USAGE}"),
        }
    }
    let out = out.with_context(|| format!("`--out DIR` is required; usage: {MODEL_INIT_USAGE}"))?;
    let tokenizer = match corpus {
        None if vocab_size.is_some() || pieces.is_some() => bail!(
            "`--vocab-size` and `--bpe-pieces` shape a trained BPE: give `--tokenizer-task` or `--tokenizer-corpus` too"
        ),
        None => rl_model::NewTokenizer::Chars,
        Some(c) => rl_model::NewTokenizer::Bpe {
            texts: corpus_texts(&c)?,
            vocab_size: vocab_size.unwrap_or(512),
            pieces: pieces.unwrap_or_default(),
        },
    };
    let cfg = rl_model::init_model_as(&out, preset, &shape, seed, force, &tokenizer, dtype)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "wrote a random Qwen3 model ({} params, hidden {}, {} layers, {}/{} heads of {}, vocab {}) to {}",
        cfg.num_params(),
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.vocab_size,
        out.display()
    )?;
    // A BPE cut off at its size leaves repeated words in pieces (names in characters, say),
    // which nothing else would show.
    if let rl_model::NewTokenizer::Bpe { vocab_size, .. } = &tokenizer
        && rl_model::Tok::load(&out)?.vocab_size() >= *vocab_size
    {
        writeln!(
            stdout,
            "the BPE filled all {vocab_size} entries: pieces that still repeat in the corpus stay split (a larger \
             --vocab-size merges more of them)"
        )?;
    }
    Ok(())
}

/// Where a trained tokenizer's text comes from.
enum Corpus {
    /// A built-in task's SFT conversations.
    Task(String),
    /// A data file of conversations (JSONL, JSON, Parquet, CSV, Arrow), or plain text.
    File(std::path::PathBuf),
}

/// Documents of a tokenizer corpus: conversations rendered as `role` and content lines (the chat
/// template's own markers are special tokens, which the BPE never merges); a task's
/// conversations as the chat template renders them, markers left out (the same lines when they
/// have no tools).
fn corpus_texts(corpus: &Corpus) -> anyhow::Result<Vec<String>> {
    fn render<'a>(messages: impl Iterator<Item = (&'a str, &'a str)>) -> String {
        messages.map(|(role, content)| format!("{role}\n{content}\n")).collect()
    }
    let texts: Vec<String> = match corpus {
        Corpus::Task(name) => {
            // Rendered by the chat template `rl model init` writes, so the tools' signatures, tool
            // calls and the template's own text get merges; its special tokens are never merged
            // and are left out.
            let template = rl_model::ChatTemplate::new(rl_model::QWEN_TEMPLATE)?;
            let mut texts = Vec::new();
            for demos in rl_envs::tokenizer_corpus(name).with_context(|| format!("--tokenizer-task {name}"))? {
                let tools: Vec<serde_json::Value> = demos.tools.iter().map(rl_serve::ToolSpec::to_json).collect();
                for c in &demos.conversations {
                    let messages: Vec<_> = c.iter().map(crate::sft_data::template_message).collect();
                    let text = template.render(&messages, &tools, false)?;
                    texts.push(rl_model::SPECIAL_TOKENS.iter().fold(text, |t, special| t.replace(special, "")));
                }
            }
            texts
        }
        // Read as dataset rows (by its name) rather than as text lines.
        Corpus::File(path) if rl_data::is_data_file(path) => crate::sft_data::read_file(path)?
            .iter()
            .map(|c| render(c.messages.iter().map(|m| (m.role.as_str(), m.content.as_str()))))
            .collect(),
        Corpus::File(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the tokenizer corpus {}", path.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("{l}\n"))
            .collect(),
    };
    if texts.is_empty() {
        bail!("the tokenizer corpus is empty: nothing to train a BPE on");
    }
    Ok(texts)
}

fn print_schema(args: &[String]) -> anyhow::Result<()> {
    let part = args.first().map(String::as_str).unwrap_or("rl");
    let schema = match part {
        "rl" => schema_json::<RlConfig>(),
        "sft" => schema_json::<SftConfig>(),
        "orchestrator" | "eval" => schema_json::<OrchestratorConfig>(),
        "trainer" => schema_json::<TrainerConfig>(),
        "inference" => schema_json::<InferenceConfig>(),
        "env-server" => schema_json::<EnvServerConfig>(),
        other => bail!("unknown schema part `{other}`; expected one of {}", SCHEMA_PARTS.join(", ")),
    };
    std::io::stdout().lock().write_all(schema.as_bytes())?;
    Ok(())
}

fn print_usage() -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "usage: rl <command> [@ config.toml ...] [--section.key value ...] [--dry-run]")?;
    writeln!(out, "       rl @ config.toml ...   (as prime-rl's launcher: `rl rl @ config.toml ...`)\n")?;
    writeln!(out, "commands:")?;
    for (name, about) in CONFIG_COMMANDS {
        writeln!(out, "  {name:<13} {about}")?;
    }
    writeln!(out, "  {:<13} write a random Qwen3-architecture model directory", "model init")?;
    writeln!(out, "  {:<13} merge a LoRA adapter into its base model", "model merge")?;
    writeln!(out, "  {:<13} print the JSON Schema of a config ({})", "schema <part>", SCHEMA_PARTS.join(", "))?;
    writeln!(out, "  {:<13} print the version", "--version")?;
    writeln!(out, "\nconfig files merge left to right, command-line keys last; `rl <command> --help` lists keys")?;
    Ok(())
}

/// The sections `rl eval` reads (it takes the orchestrator's config, most of which is training).
const EVAL_SECTIONS: &[&str] =
    &["model", "models", "eval", "output_dir", "log", "rollout_timeout_s", "wait_for_ready_s"];

fn print_command_help<T: ConfigFile>(command: &str, section: Option<&str>) -> anyhow::Result<()> {
    let schema = schemars::schema_for!(T).to_value();
    let mut all = crate::help::entries(&schema);
    if command == "eval" {
        all.retain(|e| EVAL_SECTIONS.iter().any(|s| e.key == *s || e.key.starts_with(&format!("{s}."))));
    }
    let Some(text) = crate::help::render(&all, section) else {
        let tops: Vec<&str> = all.iter().filter(|e| !e.key.contains('.')).map(|e| e.key.as_str()).collect();
        bail!(
            "`rl {command}` has no key or section `{}`; its top-level keys: {}",
            section.unwrap_or(""),
            tops.join(", ")
        );
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "usage: rl {command} [@ config.toml ...] [--section.key value ...] [--dry-run]\n")?;
    match section {
        Some(s) => writeln!(out, "keys under `{s}`:")?,
        None => writeln!(
            out,
            "keys (`rl {command} --help <section>` shows one section; JSON Schema: `rl schema {command}`):"
        )?,
    }
    write!(out, "{text}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Corpus, corpus_texts};

    #[test]
    fn a_task_corpus_without_tools_is_its_role_and_content_lines() {
        let texts = corpus_texts(&Corpus::Task(String::from("alphabet-sort"))).unwrap();
        let demos = rl_envs::tokenizer_corpus("alphabet-sort").unwrap();
        let plain: Vec<String> = demos[0]
            .conversations
            .iter()
            .map(|c| c.iter().map(|m| format!("{}\n{}\n", m.role.as_str(), m.content)).collect())
            .collect();
        assert_eq!(texts, plain, "the chat template adds nothing but its special tokens here");
    }

    #[test]
    fn a_tool_task_corpus_holds_the_signatures_and_calls_as_rendered_and_both_harnesses() {
        let texts = corpus_texts(&Corpus::Task(String::from("wiki-nav"))).unwrap();
        assert_eq!(texts.len(), 2000);
        let (tools, text): (Vec<&String>, Vec<&String>) = texts.iter().partition(|t| t.contains("# Tools"));
        assert_eq!((tools.len(), text.len()), (1000, 1000), "half tool-harness, half text-harness");
        assert!(tools[0].contains(r#""name": "go_back""#), "the signatures as tojson writes them");
        assert!(
            tools[0].contains(r#"{"name": "click_link", "arguments": {"title":"#),
            "the calls as the template writes them"
        );
        assert!(text[0].contains("<click_link>"));
        assert!(texts.iter().all(|t| rl_model::SPECIAL_TOKENS.iter().all(|s| !t.contains(s))), "no special token");
    }
}
