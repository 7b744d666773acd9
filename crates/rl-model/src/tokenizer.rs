//! Tokenization through the `tokenizers` crate (`tokenizer.json`), and the tokenizers `rl model init`
//! writes: character-level (printable ASCII, newline and tab, plus the chat special tokens), or a
//! BPE trained on a corpus over that same alphabet.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Error, Result};

/// Special tokens of the chat format, in id order (ids 0..).
pub const SPECIAL_TOKENS: &[&str] =
    &["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>", "<unk>"];

/// Each token's byte range `[start, end)` in the text it was encoded from.
pub type Offsets = Vec<(usize, usize)>;

/// A loaded tokenizer with the ids generation needs.
#[derive(Debug, Clone)]
pub struct Tok {
    inner: Tokenizer,
    /// Ids that end a completion: the model's end-of-sequence ids (`generation_config.json` and
    /// `config.json` `eos_token_id`, the tokenizer's `eos_token`), or, when a directory names
    /// none, `<|im_end|>` and `<|endoftext|>`.
    pub stop_ids: Vec<u32>,
    /// Bytes of the longest vocabulary entry (its stored form, which is never shorter than the
    /// text it stands for: byte-level BPE stores one char per byte, `<unk>` covers one char).
    max_token_bytes: usize,
}

impl Tok {
    /// Loads `tokenizer.json` from a model directory.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let bad = |what: String| Error::Tokenizer(format!("{}: {what}", path.display()));
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        // `tokenizers` panics (an `expect`) on some malformed sections instead of failing, so
        // the text is checked as JSON first and the parse runs where a panic is caught.
        serde_json::from_str::<serde::de::IgnoredAny>(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let parsed = std::panic::catch_unwind(|| text.parse::<Tokenizer>());
        let inner = match parsed {
            Ok(parsed) => parsed.map_err(|e| bad(e.to_string()))?,
            Err(_) => {
                return Err(bad(String::from(
                    "not a tokenizer the `tokenizers` library can read (a malformed section)",
                )));
            }
        };
        let mut stop_ids = eos_ids(dir, &inner);
        if stop_ids.is_empty() {
            stop_ids = ["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| inner.token_to_id(t)).collect();
        }
        let max_token_bytes = inner.get_vocab(true).keys().map(String::len).max().unwrap_or(1).max(4);
        Ok(Tok { inner, stop_ids, max_token_bytes })
    }

    /// A lower bound on the tokens `text` encodes to, without tokenizing it (half of
    /// bytes / longest token, leaving room for normalizers): a request whose bound is already
    /// beyond the context is refused before tokenizing megabytes.
    pub fn min_tokens(&self, text: &str) -> usize {
        text.len() / (2 * self.max_token_bytes)
    }

    /// Token ids of `text` (special tokens in the text are recognised; nothing is added). Offsets
    /// are not computed (`encode_fast`): the ids are the same, at about half the cost.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode_fast(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?.get_ids().to_vec())
    }

    /// Token ids of `text` and each token's byte range in it (as [`Tok::encode`], with offsets).
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Offsets)> {
        let e = self.inner.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok((e.get_ids().to_vec(), e.get_offsets().to_vec()))
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The text of one token.
    pub fn token(&self, id: u32) -> String {
        self.inner.id_to_token(id).unwrap_or_default()
    }

    /// The `tokenizers` tokenizer itself.
    pub(crate) fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// End-of-sequence ids a model directory declares, as vLLM collects them (unreadable files
/// count as declaring none; `config.json` errors are reported where the model loads).
fn eos_ids(dir: &Path, tok: &Tokenizer) -> Vec<u32> {
    let read = |name: &str| -> serde_json::Value {
        std::fs::read_to_string(dir.join(name)).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    };
    let mut ids = Vec::new();
    for file in ["generation_config.json", "config.json"] {
        match &read(file)["eos_token_id"] {
            serde_json::Value::Number(n) => ids.extend(n.as_u64().map(|i| i as u32)),
            serde_json::Value::Array(list) => ids.extend(list.iter().filter_map(|v| v.as_u64().map(|i| i as u32))),
            _ => {}
        }
    }
    let config = read("tokenizer_config.json");
    let eos = config["eos_token"].get("content").unwrap_or(&config["eos_token"]).as_str().map(str::to_owned);
    ids.extend(eos.and_then(|t| tok.token_to_id(&t)));
    let vocab = tok.get_vocab_size(true) as u32;
    ids.retain(|&id| id < vocab);
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    ids
}

/// The characters every tokenizer `rl model init` writes covers (others encode as `<unk>`).
fn alphabet() -> impl Iterator<Item = char> {
    (b' '..=b'~').map(char::from).chain(['\n', '\t'])
}

/// Builds the character-level tokenizer and writes it to `path`; returns its vocabulary size.
pub fn write_char_tokenizer(path: &Path) -> Result<usize> {
    let mut vocab: HashMap<String, u32> = HashMap::new();
    for (i, t) in SPECIAL_TOKENS.iter().enumerate() {
        vocab.insert((*t).to_owned(), i as u32);
    }
    for c in alphabet() {
        let id = vocab.len() as u32;
        vocab.insert(c.to_string(), id);
    }
    let size = vocab.len();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token(String::from("<unk>"))
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut tok = Tokenizer::new(model);
    let split = Split::new(SplitPattern::String(String::new()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    tok.with_pre_tokenizer(Some(split));
    tok.with_decoder(Some(tokenizers::decoders::fuse::Fuse::new()));
    let specials: Vec<AddedToken> = SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true)).collect();
    tok.add_special_tokens(specials).map_err(|e| Error::Tokenizer(e.to_string()))?;
    tok.save(path, true).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
    Ok(size)
}

/// How a trained BPE splits text into the pieces it merges within (a merge never crosses two
/// pieces). Every byte lands in some piece (the text between matches is a piece too), so decoding
/// is concatenation either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BpePieces {
    /// Capitalised or lower-case words (so `AdaLovelace` is `Ada` + `Lovelace`), digit runs,
    /// punctuation runs and whitespace runs, each its own piece: every space is a token.
    #[default]
    Isolated,
    /// As `Isolated`, but a lower-case or all-capital word takes the space before it (` names`),
    /// a punctuation run the space after it (`, `), and an XML-style tag (`<answer>`, `</answer>`)
    /// is one piece. Capitalised words take no space, so a name is the same token in a
    /// comma-separated list and at the start of a line. Prose and tagged formats take ~35% fewer
    /// tokens (alphabet-sort's episodes: 300 -> 196).
    Attached,
    /// As `Attached`, but what a line holds between capitalised words, all-capital words, tags and
    /// line breaks (lower-case words with their spaces, digits, punctuation) is one piece, so a
    /// task's fixed wording (` these names in alphabetical order by`) can merge into one token,
    /// while each name, and a keyword such as ` FIRST`, stays the same tokens in every context
    /// (alphabet-sort's episodes: ~196 -> ~135 tokens; a BPE of 768 entries stops at 568 there).
    /// Fewer positions can mean less learned per step: there the tiny model's SFT learned more
    /// slowly than with `Attached` (docs/recipes.md).
    Phrases,
}

impl BpePieces {
    /// Names as `rl model init --bpe-pieces` takes them.
    pub const NAMES: &[&str] = &["isolated", "attached", "phrases"];

    /// Parses one of [`BpePieces::NAMES`].
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "isolated" => Some(Self::Isolated),
            "attached" => Some(Self::Attached),
            "phrases" => Some(Self::Phrases),
            _ => None,
        }
    }

    /// The pre-tokenizer's pattern.
    fn pattern(self) -> &'static str {
        match self {
            Self::Isolated => r"[A-Z]?[a-z]+|[0-9]+|[^\sA-Za-z0-9]+|\s+",
            Self::Attached => {
                r"</?[a-z_]+>|\x20?[a-z]+|[A-Z][a-z]+|\x20?[A-Z]+(?![a-z])|[0-9]+|\x20?[^\sA-Za-z0-9]+\x20?|\s+"
            }
            // A run never takes a `<` (a tag may follow on the line) nor a capitalised or
            // all-capital word.
            Self::Phrases => {
                r"</?[a-z_]+>|[A-Z][a-z]+|\x20?[A-Z]+(?![a-z])|(?:\x20?[a-z]+|[0-9]+|\x20?[^\sA-Za-z0-9<]+\x20?)+|\s+"
            }
        }
    }
}

/// Trains a BPE of `vocab_size` entries (the special tokens and the character-level tokenizer's
/// alphabet included) on `texts` and writes it to `path`; returns its vocabulary size. Frequent
/// words become single tokens, so a small model reads and copies them as one symbol each.
pub fn write_bpe_tokenizer<S: AsRef<str> + Send>(
    path: &Path,
    texts: impl Iterator<Item = S> + Send,
    vocab_size: usize,
    pieces: BpePieces,
) -> Result<usize> {
    let base = SPECIAL_TOKENS.len() + alphabet().count();
    if vocab_size < base {
        return Err(Error::Tokenizer(format!(
            "a BPE vocabulary needs at least {base} entries (the special tokens and the character alphabet), got \
             {vocab_size}"
        )));
    }
    let tk = |e: tokenizers::Error| Error::Tokenizer(e.to_string());
    let model = BPE::builder().unk_token(String::from("<unk>")).build().map_err(tk)?;
    let mut tok = Tokenizer::new(model);
    let split = Split::new(SplitPattern::Regex(pieces.pattern().to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map_err(tk)?;
    tok.with_pre_tokenizer(Some(split));
    tok.with_decoder(Some(tokenizers::decoders::fuse::Fuse::new()));
    let specials: Vec<AddedToken> = SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true)).collect();
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.clone())
        .initial_alphabet(alphabet().collect())
        .limit_alphabet(alphabet().count())
        .build()
        .into();
    tok.train(&mut trainer, texts).map_err(tk)?;
    tok.add_special_tokens(specials).map_err(tk)?;
    for (i, t) in SPECIAL_TOKENS.iter().enumerate() {
        // The chat template and `generation_config.json` rely on these ids.
        if tok.token_to_id(t) != Some(i as u32) {
            return Err(Error::Tokenizer(format!(
                "the trained BPE gave {t} id {:?}, expected {i}",
                tok.token_to_id(t)
            )));
        }
    }
    let size = tok.get_vocab_size(true);
    tok.save(path, true).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
    Ok(size)
}
