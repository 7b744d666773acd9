//! Structured outputs, as vLLM serves them: a request constrains its completions to a JSON schema,
//! any JSON object, a regular expression, one of a list of strings, or a Lark grammar, and every
//! sampled token is drawn with the tokens that cannot continue a match masked out (llguidance, the
//! engine behind vLLM's `guidance` backend). The fields are OpenAI's `response_format`, vLLM's
//! `structured_outputs` and its older `guided_json` / `guided_regex` / `guided_choice` /
//! `guided_grammar`. Logprobs are those of the masked distribution (vLLM's `processed_logprobs`).
//!
//! This module owns the contract: which fields mean what, and the per-choice grammar state the
//! engine advances.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use rl_model::Tok;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::tool_calls::CallFormat;

/// What a request constrains its completions to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Constraint {
    /// JSON matching this schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text this Lark grammar (llguidance's dialect) derives.
    Lark(String),
    /// Tool calls in the model's format (the one its chat template renders and `tool_calls.rs`
    /// parses), each naming one of these (name, parameters schema) with arguments matching its
    /// schema; `many`: one or more calls.
    ToolCalls { tools: Vec<(String, Value)>, many: bool, format: CallFormat },
}

/// The request fields that can carry a constraint (each read as any JSON and checked here, so a
/// wrong type is an error naming its field).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConstraintFields {
    /// OpenAI: `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}`.
    #[serde(default)]
    pub(crate) response_format: Option<Value>,
    /// vLLM: `{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`.
    #[serde(default)]
    pub(crate) structured_outputs: Option<Value>,
    /// vLLM before `structured_outputs`.
    #[serde(default)]
    pub(crate) guided_json: Option<Value>,
    #[serde(default)]
    pub(crate) guided_regex: Option<Value>,
    #[serde(default)]
    pub(crate) guided_choice: Option<Value>,
    #[serde(default)]
    pub(crate) guided_grammar: Option<Value>,
}

/// vLLM's JSON options: any whitespace between tokens (its default; `disable_any_whitespace`
/// makes JSON compact), and objects closed to properties their schema does not name
/// (`disable_additional_properties`, off by default as in JSON Schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JsonStyle {
    pub(crate) any_whitespace: bool,
    pub(crate) closed_objects: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        JsonStyle { any_whitespace: true, closed_objects: false }
    }
}

impl ConstraintFields {
    /// The names of the fields, as requests spell them.
    const NAMES: [&str; 6] =
        ["response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar"];

    /// Takes the constraint fields out of a request's sampling fields.
    pub(crate) fn take(fields: &mut serde_json::Map<String, Value>) -> std::result::Result<Self, String> {
        let mine: serde_json::Map<String, Value> =
            Self::NAMES.iter().filter_map(|n| fields.remove(*n).map(|v| ((*n).to_owned(), v))).collect();
        serde_json::from_value(Value::Object(mine)).map_err(|e| e.to_string())
    }

    /// The request's constraint (at most one may be given) and its JSON style.
    pub(crate) fn constraint(&self) -> Result<Option<(Constraint, JsonStyle)>> {
        let bad = |m: String| Err(Error::BadRequest(m));
        let mut found: Vec<(&str, Constraint)> = Vec::new();
        let mut style = JsonStyle::default();
        if let Some(format) = &self.response_format {
            match format.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => found.push(("response_format", Constraint::JsonObject)),
                Some("json_schema") => match format.get("json_schema").and_then(|j| j.get("schema")) {
                    Some(schema) => found.push(("response_format", Constraint::JsonSchema(schema.clone()))),
                    None => return bad(String::from("response_format: json_schema.schema is missing")),
                },
                _ => {
                    return bad(format!(
                        "response_format {format} is not supported: its type must be \"text\", \"json_object\" or \"json_schema\""
                    ));
                }
            }
        }
        if let Some(so) = &self.structured_outputs {
            let Some(map) = so.as_object() else {
                return bad(format!("structured_outputs must be an object, got {so}"));
            };
            // Clients that serialize vLLM's `StructuredOutputsParams` whole send every field,
            // null where unset.
            for (key, value) in map.iter().filter(|(_, v)| !v.is_null()) {
                let c = match key.as_str() {
                    "json" => Constraint::JsonSchema(schema_field(value, "structured_outputs.json")?),
                    "regex" => Constraint::Regex(string_field(value, "structured_outputs.regex")?),
                    "choice" => Constraint::Choice(choices(value, "structured_outputs.choice")?),
                    "grammar" => Constraint::Lark(string_field(value, "structured_outputs.grammar")?),
                    "json_object" if value.as_bool() == Some(true) => Constraint::JsonObject,
                    "json_object" => continue,
                    "disable_any_whitespace" => {
                        style.any_whitespace = value.as_bool() != Some(true);
                        continue;
                    }
                    "disable_additional_properties" => {
                        style.closed_objects = value.as_bool() == Some(true);
                        continue;
                    }
                    // vLLM's backend choice and fallback between backends: there is one here.
                    "disable_fallback" | "backend" => continue,
                    other => {
                        return bad(format!(
                            "structured_outputs.{other} is not supported: use json, regex, choice, grammar or json_object"
                        ));
                    }
                };
                found.push(("structured_outputs", c));
            }
        }
        if let Some(schema) = &self.guided_json {
            found.push(("guided_json", Constraint::JsonSchema(schema_field(schema, "guided_json")?)));
        }
        if let Some(rx) = &self.guided_regex {
            found.push(("guided_regex", Constraint::Regex(string_field(rx, "guided_regex")?)));
        }
        if let Some(list) = &self.guided_choice {
            found.push(("guided_choice", Constraint::Choice(choices(list, "guided_choice")?)));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar", Constraint::Lark(string_field(g, "guided_grammar")?)));
        }
        if found.len() > 1 {
            let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
            return bad(format!("give one structured-output constraint, got {} ({})", found.len(), names.join(", ")));
        }
        if let Some((_, Constraint::Choice(list))) = found.first()
            && list.is_empty()
        {
            return bad(String::from("a choice constraint needs at least one string"));
        }
        Ok(found.pop().map(|(_, c)| (c, style)))
    }
}

/// A JSON schema given as an object or as its JSON text (vLLM takes both).
fn schema_field(v: &Value, key: &str) -> Result<Value> {
    match v {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|e| Error::BadRequest(format!("{key} is neither a JSON schema nor its JSON text: {e}"))),
        other => Ok(other.clone()),
    }
}

fn string_field(v: &Value, key: &str) -> Result<String> {
    v.as_str().map(str::to_owned).ok_or_else(|| Error::BadRequest(format!("{key} must be a string, got {v}")))
}

fn choices(v: &Value, key: &str) -> Result<Vec<String>> {
    let bad = || Error::BadRequest(format!("{key} must be a list of strings, got {v}"));
    v.as_array().ok_or_else(bad)?.iter().map(|c| c.as_str().map(str::to_owned).ok_or_else(bad)).collect()
}

impl Constraint {
    /// The calls `tool_choice` asks for: of any of `tools` (`required`) or of the one named
    /// `only`; `many`: one or more, else exactly one.
    pub(crate) fn tool_calls(tools: &[Value], only: Option<&str>, many: bool, format: CallFormat) -> Self {
        let tools = tools
            .iter()
            .filter_map(|t| {
                let name = crate::tool_calls::tool_name(t)?;
                let params = t["function"].get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                only.is_none_or(|o| o == name).then(|| (name.to_owned(), params))
            })
            .collect();
        Constraint::ToolCalls { tools, many, format }
    }

    /// `special_tags`: the tokenizer has `<tool_call>` as a special token (the grammar names it
    /// as one, since it cannot be spelled as text).
    fn grammar(&self, style: JsonStyle, special_tags: bool) -> TopLevelGrammar {
        let options = json!({"whitespace_flexible": style.any_whitespace, "coerce_one_of": true});
        let json = |mut schema: Value| {
            if style.closed_objects {
                close_objects(&mut schema);
            }
            if let Some(map) = schema.as_object_mut()
                && !map.contains_key("x-guidance")
            {
                // As vLLM: `oneOf` is read as `anyOf` (llguidance refuses it otherwise, and
                // OpenAI-style schemas use it where the branches cannot overlap anyway).
                map.insert(String::from("x-guidance"), options.clone());
            }
            TopLevelGrammar::from_json_schema(schema)
        };
        match self {
            Constraint::JsonSchema(schema) => json(schema.clone()),
            Constraint::JsonObject => json(json!({"type": "object"})),
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(list) => {
                let alternatives: Vec<String> = list.iter().map(|c| regex_escape(c)).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            Constraint::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
            Constraint::ToolCalls { tools, many, format } => {
                // The arguments' key: what the template renders (`arguments` in hermes blocks,
                // `parameters` in Llama's objects).
                let key = match format {
                    CallFormat::Hermes => "arguments",
                    CallFormat::Llama3Json => "parameters",
                };
                let calls: Vec<Value> = tools
                    .iter()
                    .map(|(name, params)| {
                        json!({"type": "object", "additionalProperties": false, "required": ["name", key],
                               "properties": {"name": {"const": name}, key: params}})
                    })
                    .collect();
                let mut schema = json!({"anyOf": calls});
                if style.closed_objects {
                    close_objects(&mut schema);
                }
                schema["x-guidance"] = options;
                let lark = match format {
                    CallFormat::Hermes => {
                        let (open, close) = if special_tags {
                            ("<tool_call>", "</tool_call>")
                        } else {
                            ("\"<tool_call>\"", "\"</tool_call>\"")
                        };
                        let sep = if *many { "(\"\\n\" call)*" } else { "" };
                        format!("start: call {sep}\ncall: {open} \"\\n\" %json {schema} \"\\n\" {close}\n")
                    }
                    CallFormat::Llama3Json => {
                        let sep = if *many { "(\"; \" call)*" } else { "" };
                        format!("start: call {sep}\ncall: %json {schema}\n")
                    }
                };
                TopLevelGrammar::from_lark(lark)
            }
        }
    }
}

/// Sets `additionalProperties: false` on every object schema in `schema` that does not say.
fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let is_object = map.get("type").and_then(Value::as_str) == Some("object") || map.contains_key("properties");
            if is_object && !map.contains_key("additionalProperties") {
                map.insert(String::from("additionalProperties"), Value::Bool(false));
            }
            map.values_mut().for_each(close_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// `text` as a regular expression matching only itself.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The tokenizer as llguidance sees it: every token's bytes in a trie, and the tokenizer itself
/// for the canonical tokenization of text.
struct TokenizerBytes {
    trie: TokTrie,
    tok: Arc<Tok>,
}

impl TokenizerEnv for TokenizerBytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// llguidance turns the bytes a constraint forces into these tokens, so they must spell
    /// `s` exactly: a vocabulary without byte tokens encodes a char it lacks as `<unk>`, which
    /// spells something else. Then the trie's greedy spelling is used where it spells `s`; where
    /// nothing does, the tokenizer's answer stands and [`Guide::advance`] refuses the token.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let encoded = self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tok.encode(text).unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        });
        if self.trie.decode_raw(&encoded) == s {
            return encoded;
        }
        let greedy = self.trie.greedy_tokenize(s);
        if self.trie.decode_raw(&greedy) == s { greedy } else { encoded }
    }
}

/// Compiles constraints for one served model. The token trie is built at the first constrained
/// request (for a 151,936-entry vocabulary it takes a moment) and kept.
pub(crate) struct Grammars {
    tok: Arc<Tok>,
    /// The model's output width (often more than the tokenizer's entries).
    vocab: usize,
    built: OnceLock<std::result::Result<Built, String>>,
}

/// What the first constrained request builds.
struct Built {
    factory: ParserFactory,
    /// `<tool_call>` is a special token of the tokenizer.
    special_tags: bool,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.vocab).field("built", &self.built.get().is_some()).finish()
    }
}

impl Grammars {
    pub(crate) fn new(tok: Arc<Tok>, vocab: usize) -> Self {
        Grammars { tok, vocab, built: OnceLock::new() }
    }

    fn built(&self) -> Result<&Built> {
        let built = self.built.get_or_init(|| {
            let Some(&eos) = self.tok.stop_ids.first() else {
                return Err(String::from("the tokenizer has no end-of-sequence token to end a structured output"));
            };
            let bytes = self.tok.token_bytes().map_err(|e| e.to_string())?;
            let special_tags = bytes.iter().any(|t| t.special && t.bytes == b"<tool_call>");
            let mut words: Vec<Vec<u8>> =
                bytes
                    .into_iter()
                    .map(|t| {
                        if t.special {
                            [&[TokTrie::SPECIAL_TOKEN_MARKER], t.bytes.as_slice()].concat()
                        } else {
                            t.bytes
                        }
                    })
                    .collect();
            words.resize(self.vocab.max(words.len()), Vec::new());
            let info = TokRxInfo::new(words.len() as u32, eos);
            let env: TokEnv = Arc::new(TokenizerBytes { trie: TokTrie::from(&info, &words), tok: self.tok.clone() });
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok(Built { factory, special_tags })
        });
        built.as_ref().map_err(|e| Error::BadRequest(format!("structured outputs are unavailable: {e}")))
    }

    /// A fresh grammar state for `constraint`; an invalid schema, regex or grammar is a 400 naming it.
    pub(crate) fn compile(&self, constraint: &Constraint, style: JsonStyle) -> Result<Guide> {
        let Built { factory, special_tags } = self.built()?;
        let grammar = constraint.grammar(style, *special_tags);
        // llguidance reports bad grammars as errors; a panic inside it must not take the
        // request's task down without an answer either.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory.create_parser(grammar)))
            .map_err(|_| Error::BadRequest(String::from("the structured-output constraint could not be compiled")))?;
        let parser = parser.map_err(|e| Error::BadRequest(format!("invalid structured-output constraint: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::BadRequest(format!("invalid structured-output constraint: {e}")));
        }
        Ok(Guide {
            matcher: Box::new(matcher),
            vocab: self.vocab,
            eos: self.tok.stop_ids.first().copied().unwrap_or_default(),
        })
    }
}

/// One completion's place in its constraint: which tokens may come next.
#[derive(Clone)]
pub struct Guide {
    /// Boxed: the matcher is large, and requests travel by value.
    matcher: Box<Matcher>,
    vocab: usize,
    /// The end-of-sequence id the matcher knows (it allows it where the constraint is complete).
    eos: u32,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Guide {
    /// Sets the logits of tokens that cannot come next to -inf. `ends` (the end-of-sequence and
    /// stop token ids) may come only where the constraint is complete.
    pub(crate) fn mask(&mut self, logits: &mut [f32], ends: &[u32]) -> Result<()> {
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| {
            // llguidance stops with `NoExtensionBias` where no token continues the match (text
            // no token of the vocabulary starts); its matcher keeps only the message.
            if e.to_string().starts_with("NoExtensionBias") {
                return unspellable();
            }
            Error::Engine(format!("structured output: {e}"))
        })?;
        let may_end = allowed.is_allowed(self.eos);
        // The end ids' logits before masking (the grammar knows one of them as its end).
        let kept: Vec<(usize, f32)> =
            ends.iter().filter_map(|&e| logits.get(e as usize).map(|z| (e as usize, *z))).collect();
        for (id, z) in logits.iter_mut().enumerate().take(self.vocab) {
            if !allowed.is_allowed(id as TokenId) {
                *z = f32::NEG_INFINITY;
            }
        }
        for (id, z) in kept {
            logits[id] = if may_end { z } else { f32::NEG_INFINITY };
        }
        Ok(())
    }

    /// Advances past a sampled token (end tokens end the completion and are not fed).
    pub(crate) fn advance(&mut self, id: u32, ends: &[u32]) -> Result<()> {
        if ends.contains(&id) {
            return Ok(());
        }
        // The mask allows only tokens the grammar accepts, except where the constraint forces
        // text no token spells (see `TokenizerBytes::tokenize_bytes`): that request cannot be
        // served by this model, and is told so.
        let accepted =
            self.matcher.validate_tokens(&[id]).map_err(|e| Error::Engine(format!("structured output: {e}")))?;
        if accepted == 0 {
            return Err(unspellable());
        }
        self.matcher.consume_token(id).map_err(|e| Error::Engine(format!("structured output: {e}")))
    }
}

/// A constraint this model cannot meet: what it requires next, no token spells.
fn unspellable() -> Error {
    Error::BadRequest(String::from(
        "no token can be sampled: the structured-output constraint requires text that no token of this model's \
         vocabulary spells",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Through [`ConstraintFields::take`], as requests are read (so every field is in `NAMES`).
    fn fields(v: Value) -> ConstraintFields {
        let Value::Object(mut map) = v else { panic!("{v}") };
        let taken = ConstraintFields::take(&mut map).unwrap();
        assert!(map.is_empty(), "left behind: {map:?}");
        taken
    }

    #[test]
    fn each_field_names_its_constraint_and_two_are_refused() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
                Some(Constraint::JsonSchema(schema.clone())),
            ),
            (json!({"response_format": {"type": "json_object"}}), Some(Constraint::JsonObject)),
            (json!({"response_format": {"type": "text"}}), None),
            (json!({"structured_outputs": {"json": schema.to_string()}}), Some(Constraint::JsonSchema(schema.clone()))),
            (json!({"structured_outputs": {"regex": "[0-9]+"}}), Some(Constraint::Regex("[0-9]+".into()))),
            (
                json!({"structured_outputs": {"json": null, "regex": "a", "choice": null, "structural_tag": null}}),
                Some(Constraint::Regex("a".into())),
            ),
            (
                json!({"structured_outputs": {"choice": ["yes", "no"]}}),
                Some(Constraint::Choice(vec!["yes".into(), "no".into()])),
            ),
            (json!({"guided_grammar": "start: \"a\""}), Some(Constraint::Lark("start: \"a\"".into()))),
            (json!({"guided_json": schema}), Some(Constraint::JsonSchema(schema))),
        ];
        for (body, want) in cases {
            assert_eq!(fields(body.clone()).constraint().unwrap().map(|(c, _)| c), want, "{body}");
        }
        let two = fields(json!({"guided_regex": "a", "response_format": {"type": "json_object"}}));
        let e = two.constraint().unwrap_err().to_string();
        assert!(e.contains("response_format") && e.contains("guided_regex"), "{e}");
        for (body, needle) in [
            (json!({"response_format": {"type": "structural_tag"}}), "structural_tag"),
            (json!({"response_format": {"type": "json_schema"}}), "json_schema.schema"),
            (json!({"structured_outputs": {"choice": []}}), "at least one"),
            (json!({"structured_outputs": {"choice": [1]}}), "list of strings"),
            (json!({"structured_outputs": {"structural_tag": "x"}}), "structural_tag"),
            (json!({"guided_regex": 5}), "guided_regex must be a string"),
            (json!({"guided_choice": "yes"}), "guided_choice must be a list of strings"),
        ] {
            let e = fields(body.clone()).constraint().unwrap_err().to_string();
            assert!(e.contains(needle), "{body}: {e}");
        }
        let (_, style) = fields(json!({"structured_outputs": {"json_object": true, "disable_any_whitespace": true}}))
            .constraint()
            .unwrap()
            .unwrap();
        assert!(!style.any_whitespace && !style.closed_objects);
    }

    #[test]
    fn closing_objects_reaches_nested_schemas_and_keeps_explicit_choices() {
        let mut schema = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "b": {"type": "array", "items": {"properties": {"y": {}}}},
            "c": {"type": "object", "additionalProperties": {"type": "string"}}}});
        close_objects(&mut schema);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["a"]["additionalProperties"], false);
        assert_eq!(schema["properties"]["b"]["items"]["additionalProperties"], false);
        assert_eq!(schema["properties"]["c"]["additionalProperties"], json!({"type": "string"}));
        assert!(schema["properties"]["a"]["properties"]["x"].get("additionalProperties").is_none());
    }

    /// The chat fixtures' Qwen-style byte-level BPE, with `<tool_call>` / `</tool_call>` special
    /// or (as in Qwen3's own tokenizer) plain added tokens.
    fn qwen_style(special_tags: bool) -> (tempfile::TempDir, Grammars) {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rl-model/tests/fixtures/chat/qwen3");
        let dir = tempfile::tempdir().unwrap();
        let mut tokenizer: Value =
            serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap()).unwrap();
        for t in tokenizer["added_tokens"].as_array_mut().unwrap() {
            if t["content"].as_str().unwrap().contains("tool_call") {
                t["special"] = json!(special_tags);
            }
        }
        std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
        std::fs::copy(fixture.join("tokenizer_config.json"), dir.path().join("tokenizer_config.json")).unwrap();
        let tok = Tok::load(dir.path()).unwrap();
        let vocab = tok.vocab_size() + 5; // a model's output is often wider than its tokenizer
        (dir, Grammars::new(Arc::new(tok), vocab))
    }

    /// Feeds `text`'s tokens; whether every one was allowed and the end may follow.
    fn accepts(g: &Grammars, c: &Constraint, style: JsonStyle, text: &str) -> bool {
        let mut guide = g.compile(c, style).unwrap();
        let ends = g.tok.stop_ids.clone();
        for id in g.tok.encode(text).unwrap() {
            let mut logits = vec![0.0; g.vocab];
            guide.mask(&mut logits, &ends).unwrap();
            if logits[id as usize] == f32::NEG_INFINITY {
                return false;
            }
            guide.advance(id, &ends).unwrap();
        }
        let mut logits = vec![0.0; g.vocab];
        guide.mask(&mut logits, &ends).unwrap();
        assert!(logits[g.tok.vocab_size()..].iter().all(|z| *z == f32::NEG_INFINITY), "ids past the tokenizer");
        ends.iter().all(|&e| logits[e as usize] == 0.0)
    }

    #[test]
    fn a_byte_level_tokenizers_tokens_walk_the_grammars() {
        for special_tags in [true, false] {
            let (_dir, g) = qwen_style(special_tags);
            let schema = Constraint::JsonSchema(json!({"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}));
            let style = JsonStyle::default();
            assert!(accepts(&g, &schema, style, r#"{"city": "Paris, naïve café"}"#));
            assert!(accepts(&g, &schema, style, "{\n  \"city\":\"x\"\n}"));
            assert!(!accepts(&g, &schema, style, r#"{"town": "Paris"}"#));
            assert!(!accepts(&g, &schema, style, r#"{"city": "Paris""#), "not complete: no end yet");
            let compact = JsonStyle { any_whitespace: false, ..style };
            assert!(!accepts(&g, &schema, compact, r#"{"city": "x"}"#));
            assert!(accepts(&g, &schema, compact, r#"{"city":"x"}"#));
            let tools = [json!({"type": "function", "function": {"name": "add", "parameters": {"type": "object",
                "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})];
            let calls = Constraint::tool_calls(&tools, None, true, CallFormat::Hermes);
            let call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 12}}\n</tool_call>";
            assert!(accepts(&g, &calls, style, call), "special tags: {special_tags}");
            assert!(accepts(&g, &calls, style, &format!("{call}\n{call}")));
            assert!(!accepts(
                &g,
                &Constraint::tool_calls(&tools, Some("add"), false, CallFormat::Hermes),
                style,
                &format!("{call}\n{call}")
            ));
            let one_of_any = Constraint::tool_calls(&tools, None, false, CallFormat::Hermes);
            assert!(
                accepts(&g, &one_of_any, style, call) && !accepts(&g, &one_of_any, style, &format!("{call}\n{call}"))
            );
            assert!(!accepts(&g, &calls, style, &call.replace("add", "sub")));
            assert!(!accepts(&g, &calls, style, &format!("Sure. {call}")));
        }
    }

    #[test]
    fn forced_llama_calls_are_json_objects_with_parameters() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rl-model/tests/fixtures/chat/llama3");
        let tok = Tok::load(&dir).unwrap();
        let vocab = tok.vocab_size();
        let g = Grammars::new(Arc::new(tok), vocab);
        let tools = [json!({"type": "function", "function": {"name": "add", "parameters": {"type": "object",
            "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})];
        let style = JsonStyle::default();
        let calls = Constraint::tool_calls(&tools, None, true, CallFormat::Llama3Json);
        let call = r#"{"name": "add", "parameters": {"a": 12}}"#;
        assert!(accepts(&g, &calls, style, call));
        assert!(accepts(&g, &calls, style, &format!("{call}; {call}")));
        let one = Constraint::tool_calls(&tools, Some("add"), false, CallFormat::Llama3Json);
        assert!(accepts(&g, &one, style, call));
        assert!(!accepts(&g, &one, style, &format!("{call}; {call}")));
        assert!(!accepts(&g, &calls, style, &call.replace("parameters", "arguments")));
        assert!(!accepts(&g, &calls, style, &format!("<tool_call>\n{call}\n</tool_call>")));
    }

    #[test]
    fn choices_are_escaped_into_a_regex_of_themselves() {
        assert_eq!(regex_escape("a.b (c)?"), r"a\.b \(c\)\?");
        assert_eq!(regex_escape("x/y"), r"x\/y");
    }
}
