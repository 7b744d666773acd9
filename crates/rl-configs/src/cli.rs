//! Command-line arguments: `@ file.toml`, `--section @ file.toml`, `--a.b value...`, `--flag`, `--no-flag`.

use std::path::PathBuf;

use crate::error::{ConfigError, Result};

/// One step of building a config, applied left to right.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    /// Merge a TOML or JSON file at `at` (empty: the root).
    File { path: PathBuf, at: Vec<String> },
    /// Set a key from the command line.
    Set { key: Vec<String>, values: Vec<String>, negated: bool, arg: String },
}

/// Splits a command line into config operations. Keys may be kebab- or snake-case.
pub(crate) fn parse_args(args: &[String]) -> Result<Vec<Op>> {
    let mut ops = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "@" {
            let path = args.get(i).ok_or_else(|| cli(arg, "expected a file path after `@`"))?;
            i += 1;
            ops.push(Op::File { path: PathBuf::from(path), at: Vec::new() });
        } else if let Some(path) = arg.strip_prefix('@') {
            ops.push(Op::File { path: PathBuf::from(path), at: Vec::new() });
        } else if let Some(body) = arg.strip_prefix("--") {
            let (key, inline) = match body.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (body, None),
            };
            let mut key = parse_key(key, arg)?;
            if inline.is_none() && args.get(i).is_some_and(|a| a == "@") {
                let path = args.get(i + 1).ok_or_else(|| cli(arg, "expected a file path after `@`"))?;
                i += 2;
                ops.push(Op::File { path: PathBuf::from(path), at: key });
                continue;
            }
            let mut values: Vec<String> = inline.into_iter().collect();
            if values.is_empty() {
                while i < args.len() && !args[i].starts_with("--") && args[i] != "@" {
                    values.push(args[i].clone());
                    i += 1;
                }
            }
            // `--no-a.b` and `--a.no-b` both negate `a.b`.
            let mut negated = false;
            if values.is_empty() {
                let len = key.len();
                for index in [len - 1, 0] {
                    if let Some(stripped) = key[index].strip_prefix("no_") {
                        key[index] = stripped.to_owned();
                        negated = true;
                        break;
                    }
                }
            }
            ops.push(Op::Set { key, values, negated, arg: arg.clone() });
        } else {
            return Err(cli(arg, "expected `@ file.toml` or `--section.key value`"));
        }
    }
    Ok(ops)
}

fn parse_key(key: &str, arg: &str) -> Result<Vec<String>> {
    let segments: Vec<String> = key.split('.').map(|s| s.replace('-', "_")).collect();
    if segments.iter().any(String::is_empty) {
        return Err(cli(arg, "a key is dot-separated names, like `--orchestrator.train.sampling.temperature`"));
    }
    Ok(segments)
}

fn cli(arg: &str, message: &str) -> ConfigError {
    ConfigError::Cli { arg: arg.to_owned(), message: message.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn files_sections_values_and_flags() {
        let ops = parse_args(&args(
            "@ a.toml --trainer @ t.toml --orchestrator.train.sampling.stop a b --clean --no-orchestrator.filter-zero-advantages --x=1 @b.toml",
        ))
        .unwrap();
        let key = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            ops,
            vec![
                Op::File { path: "a.toml".into(), at: vec![] },
                Op::File { path: "t.toml".into(), at: key("trainer") },
                Op::Set {
                    key: key("orchestrator.train.sampling.stop"),
                    values: args("a b"),
                    negated: false,
                    arg: "--orchestrator.train.sampling.stop".into()
                },
                Op::Set { key: key("clean"), values: vec![], negated: false, arg: "--clean".into() },
                Op::Set {
                    key: key("orchestrator.filter_zero_advantages"),
                    values: vec![],
                    negated: true,
                    arg: "--no-orchestrator.filter-zero-advantages".into()
                },
                Op::Set { key: key("x"), values: args("1"), negated: false, arg: "--x=1".into() },
                Op::File { path: "b.toml".into(), at: vec![] },
            ]
        );
    }

    #[test]
    fn no_prefix_negates_the_last_segment() {
        let ops = parse_args(&args("--orchestrator.no-filter-zero-advantages")).unwrap();
        assert!(
            matches!(&ops[0], Op::Set { key, negated: true, .. } if key.join(".") == "orchestrator.filter_zero_advantages")
        );
    }

    #[test]
    fn stray_words_and_missing_paths_are_errors() {
        assert!(parse_args(&args("oops")).unwrap_err().to_string().contains("expected `@ file.toml`"));
        assert!(parse_args(&args("@")).is_err());
        assert!(parse_args(&args("--a..b 1")).is_err());
    }
}
