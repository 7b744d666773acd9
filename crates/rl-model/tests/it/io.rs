//! Model directories: `init_model` output loads, the tokenizer and template behave, save/load is exact.

use candle_core::{DType, Device};
use rl_model::{
    BpePieces, ChatTemplate, NewTokenizer, Preset, TemplateMessage, Tok, Trainable, init_model, init_model_with,
    load_model, load_trainable, read_config, write_bpe_tokenizer, write_model_dir,
};

use crate::{max_abs_diff, micro_config, weights};

#[test]
fn init_writes_a_complete_tiny_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let cfg = init_model(&out, Preset::Tiny, 0, false).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(out.join(f).exists(), "{f}");
    }
    assert_eq!(cfg.vocab_size, 128);
    let params = cfg.num_params();
    assert!((700_000..1_000_000).contains(&params), "tiny has ~0.8M params, got {params}");
    assert_eq!(read_config(&out).unwrap(), cfg);
    let m = load_model(&out, &Device::Cpu).unwrap();
    let logits = m.forward_packed(&[vec![1, 40, 41]], &[vec![0, 1, 2]]).unwrap();
    assert_eq!(logits.dims(), [1, 3, 128]);
    let err = init_model(&out, Preset::Tiny, 0, false).unwrap_err().to_string();
    assert!(err.contains("--force"), "{err}");
    init_model(&out, Preset::Small, 1, true).unwrap();
    assert_eq!(read_config(&out).unwrap().hidden_size, 256);
}

#[test]
fn tokenizer_is_character_level_with_single_special_tokens() {
    let dir = tempfile::tempdir().unwrap();
    init_model(dir.path(), Preset::Tiny, 0, true).unwrap();
    let tok = Tok::load(dir.path()).unwrap();
    let text = "<|im_start|>user\nHello, world! ~{}<|im_end|>\n";
    let ids = tok.encode(text).unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> is one token");
    assert_eq!(ids.len(), 1 + "user\nHello, world! ~{}".len() + 1 + 1);
    assert_eq!(tok.decode(&ids).unwrap(), text);
    assert!(tok.stop_ids.contains(&2));
    // The pre-tokenization bound never exceeds the real count (special tokens, unknown chars)
    // and grows with the text, so oversized prompts are refused without tokenizing them.
    for t in [text, "<|endoftext|>".repeat(50).as_str(), "é漢字\u{1F600}".repeat(40).as_str(), ""] {
        assert!(tok.min_tokens(t) <= tok.encode(t).unwrap().len(), "{t:?}");
    }
    assert!(tok.min_tokens(&"x".repeat(1 << 20)) > 30_000);
}

/// A corpus where a few names recur: the trained BPE must make each of them one token.
fn name_corpus() -> Vec<String> {
    let names = ["AdaLovelace", "AlanTuring", "GraceHopper", "LinusTorvalds"];
    (0..200).map(|i| format!("Sort these names: {}, {}\n", names[i % 4], names[(i + 1) % 4])).collect()
}

#[test]
fn a_trained_bpe_makes_frequent_words_single_tokens_and_keeps_the_chat_ids() {
    let dir = tempfile::tempdir().unwrap();
    let texts = name_corpus();
    let cfg = init_model_with(
        dir.path(),
        Preset::Tiny,
        0,
        true,
        &NewTokenizer::Bpe { texts, vocab_size: 160, pieces: BpePieces::Isolated },
    )
    .unwrap();
    let tok = Tok::load(dir.path()).unwrap();
    assert!(tok.vocab_size() <= 160, "{}", tok.vocab_size());
    assert_eq!(cfg.vocab_size, tok.vocab_size().div_ceil(64) * 64);
    let pieces = |t: &str| tok.encode(t).unwrap().iter().map(|&i| tok.token(i)).collect::<Vec<_>>();
    assert_eq!(pieces("AdaLovelace, GraceHopper"), ["Ada", "Lovelace", ",", " ", "Grace", "Hopper"]);
    // The chat template's markers keep the ids the template and generation_config.json name.
    assert_eq!(tok.encode("<|im_start|>user\n<|im_end|>").unwrap()[0], 1);
    assert_eq!(*tok.encode("<|im_end|>").unwrap(), [2]);
    assert!(tok.stop_ids.contains(&2));
    // Words it never saw still encode, character by character.
    assert_eq!(tok.decode(&tok.encode("Zebra QQQ").unwrap()).unwrap(), "Zebra QQQ");
    let m = load_model(dir.path(), &Device::Cpu).unwrap();
    let ids = tok.encode("AlanTuring").unwrap();
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    assert_eq!(
        m.forward_packed(std::slice::from_ref(&ids), &[positions]).unwrap().dims(),
        [1, ids.len(), cfg.vocab_size]
    );
}

/// With spaces attached, prose and tags take fewer tokens, while a name is the same tokens in a
/// list and at the start of a line (the copy a sorting model learns is one symbol per name).
#[test]
fn an_attached_bpe_takes_spaces_into_words_and_keeps_tags_and_names_whole() {
    let dir = tempfile::tempdir().unwrap();
    let texts = name_corpus().into_iter().map(|t| format!("{t}<answer>\nAdaLovelace\nGraceHopper\n</answer>\n"));
    write_bpe_tokenizer(&dir.path().join("tokenizer.json"), texts, 200, BpePieces::Attached).unwrap();
    let tok = Tok::load(dir.path()).unwrap();
    let pieces = |t: &str| tok.encode(t).unwrap().iter().map(|&i| tok.token(i)).collect::<Vec<_>>();
    assert_eq!(
        pieces("Sort these names: AdaLovelace, GraceHopper"),
        ["Sort", " these", " names", ": ", "Ada", "Lovelace", ", ", "Grace", "Hopper"]
    );
    assert_eq!(pieces("<answer>\nAdaLovelace\n</answer>"), ["<answer>", "\n", "Ada", "Lovelace", "\n", "</answer>"]);
    let isolated = tempfile::tempdir().unwrap();
    write_bpe_tokenizer(&isolated.path().join("tokenizer.json"), name_corpus().iter(), 200, BpePieces::Isolated)
        .unwrap();
    let text = "Sort these names: AdaLovelace, GraceHopper\n";
    let before = Tok::load(isolated.path()).unwrap().encode(text).unwrap().len();
    assert!(pieces(text).len() < before, "{} tokens attached, {before} isolated", pieces(text).len());
}

/// With phrases, a task's fixed wording between names becomes one token, while each name and an
/// all-capital keyword are the same tokens in a list, on their own line and after a phrase; tags
/// stay whole.
#[test]
fn a_phrases_bpe_makes_fixed_wording_one_token_and_keeps_names_keywords_and_tags_whole() {
    let dir = tempfile::tempdir().unwrap();
    let texts = name_corpus().into_iter().map(|t| {
        let t = t.replace(": ", " by FIRST name: ");
        format!("{t}<answer>\nAdaLovelace // new!\nGraceHopper\n</answer>\n")
    });
    write_bpe_tokenizer(&dir.path().join("tokenizer.json"), texts, 200, BpePieces::Phrases).unwrap();
    let tok = Tok::load(dir.path()).unwrap();
    let pieces = |t: &str| tok.encode(t).unwrap().iter().map(|&i| tok.token(i)).collect::<Vec<_>>();
    assert_eq!(
        pieces("Sort these names by FIRST name: AdaLovelace, GraceHopper"),
        ["Sort", " these names by", " FIRST", " name: ", "Ada", "Lovelace", ", ", "Grace", "Hopper"]
    );
    assert_eq!(
        pieces("<answer>\nAdaLovelace // new!\nGraceHopper\n</answer>"),
        ["<answer>", "\n", "Ada", "Lovelace", " // new!", "\n", "Grace", "Hopper", "\n", "</answer>"]
    );
    // A phrase never swallows the tag after it on the same line.
    assert_eq!(pieces("sorted: <answer>").last().map(String::as_str), Some("<answer>"));
}

#[test]
fn a_bpe_smaller_than_its_alphabet_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = write_bpe_tokenizer(&dir.path().join("tokenizer.json"), name_corpus().iter(), 50, BpePieces::Isolated)
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least") && err.contains("got 50"), "{err}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Decoding is concatenation: any text over the alphabet, special tokens included, comes back
    /// byte for byte, and the pre-tokenization bound holds.
    #[test]
    fn a_trained_bpe_decodes_any_ascii_text_to_itself(text in "([ -~\n\t]|<\\|im_end\\|>|AdaLovelace|</?a_b>){0,80}") {
        static TOKS: std::sync::OnceLock<Vec<(tempfile::TempDir, Tok)>> = std::sync::OnceLock::new();
        let toks = TOKS.get_or_init(|| {
            [BpePieces::Isolated, BpePieces::Attached, BpePieces::Phrases]
                .into_iter()
                .map(|pieces| {
                    let dir = tempfile::tempdir().unwrap();
                    write_bpe_tokenizer(&dir.path().join("tokenizer.json"), name_corpus().iter(), 160, pieces)
                        .unwrap();
                    let tok = Tok::load(dir.path()).unwrap();
                    (dir, tok)
                })
                .collect()
        });
        for (_, tok) in toks {
            let ids = tok.encode(&text).unwrap();
            proptest::prop_assert!(tok.min_tokens(&text) <= ids.len());
            proptest::prop_assert_eq!(tok.decode(&ids).unwrap(), text.clone());
        }
    }
}

#[test]
fn chat_template_renders_qwen_format_that_extends_turn_by_turn() {
    let dir = tempfile::tempdir().unwrap();
    init_model(dir.path(), Preset::Tiny, 0, true).unwrap();
    let t = ChatTemplate::load(dir.path()).unwrap();
    let msg = |role: &str, content: &str| TemplateMessage {
        role: role.into(),
        content: content.into(),
        tool_calls: vec![],
        reasoning_content: None,
    };
    let first = vec![msg("system", "Be brief."), msg("user", "hi")];
    let prompt = t.render(&first, &[], true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut second = first.clone();
    second.push(msg("assistant", "yo"));
    second.push(msg("user", "again"));
    let next = t.render(&second, &[], true).unwrap();
    assert!(next.starts_with(&format!("{prompt}yo<|im_end|>")), "the next prompt extends prompt + completion");
    let tools = vec![serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {}}})];
    assert!(t.render(&first, &tools, true).unwrap().contains("<tools>"));
}

#[test]
fn saving_then_loading_gives_identical_logits() {
    let cfg = micro_config();
    let tensors = weights(&cfg, 7, DType::F32);
    let t = Trainable::from_tensors(&cfg, &tensors).unwrap();
    let original = t.model(&cfg, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tokdir = tempfile::tempdir().unwrap();
    let out = dir.path().join("saved");
    write_model_dir(&out, &cfg, &t.tensors(), tokdir.path()).unwrap();
    let loaded = load_model(&out, &Device::Cpu).unwrap();
    let ids = vec![vec![3u32, 8, 1, 22]];
    let pos = vec![vec![0u32, 1, 2, 3]];
    let a = original.forward_packed(&ids, &pos).unwrap();
    let b = loaded.forward_packed(&ids, &pos).unwrap();
    assert_eq!(max_abs_diff(&a, &b), 0.0);
    let (_, trainable) = load_trainable(&out, &Device::Cpu).unwrap();
    assert_eq!(trainable.vars.len(), t.vars.len());
}

#[test]
fn broken_directories_are_errors_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_model(dir.path(), &Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::write(dir.path().join("config.json"), serde_json::to_string(&micro_config()).unwrap()).unwrap();
    let err = load_model(dir.path(), &Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    // A sharded index may only name files of the directory itself.
    for shard in ["../secret.safetensors", "/etc/passwd", "sub/../../x"] {
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": shard}});
        std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
        let err = load_model(dir.path(), &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("outside the directory"), "{shard}: {err}");
    }
}
