//! The word-count env server: the same command line and `listening` line as `rl env-server`, so
//! `rl rl` starts it through `command = ["path/to/word-count-env"]` on an env entry.

fn main() -> std::process::ExitCode {
    rl_serve::env_server_main(|spec| Ok(std::sync::Arc::new(word_count_env::WordCount::new(&spec.args)?)))
}
