//! The bytes each token id stands for, as a token-mask engine (structured outputs) needs them:
//! byte-level BPE entries are spelled one char per byte (GPT-2's byte map), SentencePiece-style
//! entries with `▁` for spaces and `<0xNN>` byte fallbacks, other entries (the character-level and
//! BPE tokenizers `rl model init` writes) literally. Special tokens are flagged: a grammar never
//! produces them as text.

use tokenizers::decoders::DecoderWrapper;

use crate::error::{Error, Result};
use crate::tokenizer::Tok;

/// One token's text bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBytes {
    /// What the token decodes to (empty for an id the tokenizer does not define).
    pub bytes: Vec<u8>,
    /// A special (control) token: `<|im_end|>`, `<|endoftext|>`, ...
    pub special: bool,
}

/// How the tokenizer's decoder spells a vocabulary entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// One char per byte, through GPT-2's byte-to-unicode map.
    ByteLevel,
    /// The entry is its text, `▁` standing for a space where `metaspace` is set, and `<0xNN>`
    /// for a byte where `byte_fallback` is set.
    Literal { metaspace: bool, byte_fallback: bool },
}

fn spelling(decoder: Option<&DecoderWrapper>) -> Spelling {
    let mut parts: Vec<&DecoderWrapper> = Vec::new();
    match decoder {
        Some(DecoderWrapper::Sequence(s)) => parts.extend(s.get_decoders()),
        Some(d) => parts.push(d),
        None => {}
    }
    if parts.iter().any(|d| matches!(d, DecoderWrapper::ByteLevel(_))) {
        return Spelling::ByteLevel;
    }
    Spelling::Literal {
        metaspace: parts.iter().any(|d| matches!(d, DecoderWrapper::Metaspace(_) | DecoderWrapper::Replace(_))),
        byte_fallback: parts.iter().any(|d| matches!(d, DecoderWrapper::ByteFallback(_))),
    }
}

/// GPT-2's map from the chars byte-level BPE stores back to the bytes they stand for: printable
/// Latin-1 bytes are themselves, the other 68 bytes are the chars from U+0100 on, in byte order.
fn byte_level_map() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = std::collections::HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\u{FFFD}')
        };
        map.insert(c, b);
    }
    map
}

impl Tok {
    /// Every token id's bytes, ids `0..vocab_size()`.
    pub fn token_bytes(&self) -> Result<Vec<TokenBytes>> {
        let inner = self.inner();
        let how = spelling(inner.get_decoder());
        let added = inner.get_added_tokens_decoder();
        let byte_map = byte_level_map();
        let mut out = Vec::with_capacity(self.vocab_size());
        for id in 0..self.vocab_size() as u32 {
            if let Some(t) = added.get(&id) {
                // Added tokens are matched and decoded as their content, never byte-mapped.
                out.push(TokenBytes { bytes: t.content.as_bytes().to_vec(), special: t.special });
                continue;
            }
            let Some(entry) = inner.id_to_token(id) else {
                out.push(TokenBytes { bytes: Vec::new(), special: false });
                continue;
            };
            let bytes = match how {
                Spelling::ByteLevel => {
                    entry.chars().map(|c| byte_map.get(&c).copied()).collect::<Option<Vec<u8>>>().ok_or_else(|| {
                        Error::Tokenizer(format!(
                            "token {id} ({entry:?}) is not byte-level text although the decoder is ByteLevel"
                        ))
                    })?
                }
                Spelling::Literal { metaspace, byte_fallback } => {
                    match byte_fallback.then(|| fallback_byte(&entry)).flatten() {
                        Some(b) => vec![b],
                        None if metaspace => entry.replace('▁', " ").into_bytes(),
                        None => entry.into_bytes(),
                    }
                }
            };
            out.push(TokenBytes { bytes, special: false });
        }
        Ok(out)
    }
}

/// The byte a SentencePiece byte-fallback entry (`<0x0A>`) stands for.
fn fallback_byte(entry: &str) -> Option<u8> {
    let hex = entry.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_map_is_a_bijection_with_space_and_newline_shifted() {
        let map = byte_level_map();
        assert_eq!(map.len(), 256);
        let mut bytes: Vec<u8> = map.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        // `Ġ` is a space and `Ċ` a newline in every GPT-2-style vocabulary.
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }

    #[test]
    fn fallback_bytes_are_read_and_other_entries_are_not() {
        assert_eq!(fallback_byte("<0x0A>"), Some(b'\n'));
        assert_eq!(fallback_byte("<0xFF>"), Some(0xFF));
        assert_eq!(fallback_byte("<0x1>"), None);
        assert_eq!(fallback_byte("<unk>"), None);
    }

    #[test]
    fn byte_level_tokens_concatenate_to_the_text_they_encode() {
        // A Qwen-style byte-level BPE trained by transformers' tokenizers (the chat fixtures).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/qwen3");
        let tok = Tok::load(&dir).unwrap();
        let bytes = tok.token_bytes().unwrap();
        let text = "Hello world,\n  naïve café: {\"a\": 1}";
        let ids = tok.encode(text).unwrap();
        assert!(ids.len() > 5, "{ids:?}");
        let joined: Vec<u8> = ids.iter().flat_map(|&id| bytes[id as usize].bytes.clone()).collect();
        assert_eq!(String::from_utf8(joined).unwrap(), text);
        assert!(ids.iter().all(|&id| !bytes[id as usize].special));
    }

    #[test]
    fn the_init_tokenizers_spell_their_entries_literally_and_flag_specials() {
        let dir = tempfile::tempdir().unwrap();
        crate::tokenizer::write_char_tokenizer(&dir.path().join("tokenizer.json")).unwrap();
        let tok = Tok::load(dir.path()).unwrap();
        let bytes = tok.token_bytes().unwrap();
        assert_eq!(bytes.len(), tok.vocab_size());
        for id in tok.encode("Hi, you!\n").unwrap() {
            let t = &bytes[id as usize];
            assert!(!t.special);
            assert_eq!(t.bytes, tok.decode(&[id]).unwrap().into_bytes());
        }
        let end = tok.encode("<|im_end|>").unwrap();
        assert_eq!(end.len(), 1);
        assert_eq!(bytes[end[0] as usize], TokenBytes { bytes: b"<|im_end|>".to_vec(), special: true });
    }
}
