//! The `prompt` of a text completion as OpenAI and vLLM accept it: text, token ids, or a list of
//! either, each element checked as it is read.

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

/// `prompt` of a text completion: text, token ids, or a list of either (one completion set each).
#[derive(Debug, Clone)]
pub(crate) enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Batch(Vec<Prompt>),
}

/// One element of a `prompt` list: a token id, or a whole prompt (text or ids).
enum Element {
    Id(u32),
    Prompt(Prompt),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct AnyElement;
        impl<'de> Visitor<'de> for AnyElement {
            type Value = Element;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a token id, a string or a list of token ids")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Element, E> {
                u32::try_from(v).map(Element::Id).map_err(|_| E::custom(format!("token id {v} is too large")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Element, E> {
                Ok(Element::Prompt(Prompt::Text(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Element, E> {
                Ok(Element::Prompt(Prompt::Text(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Element, A::Error> {
                let mut ids = Vec::new();
                while let Some(id) = seq.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(Element::Prompt(Prompt::Ids(ids)))
            }
        }
        d.deserialize_any(AnyElement)
    }
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct TextOrIds;
        impl<'de> Visitor<'de> for TextOrIds {
            type Value = Prompt;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Prompt, E> {
                Ok(Prompt::Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Prompt, E> {
                Ok(Prompt::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Prompt, A::Error> {
                // Token ids stream into a Vec<u32>; strings or id lists make a batch.
                let (mut ids, mut batch) = (Vec::new(), Vec::new());
                while let Some(element) = seq.next_element::<Element>()? {
                    match element {
                        Element::Id(id) if batch.is_empty() => ids.push(id),
                        Element::Prompt(p) if ids.is_empty() => batch.push(p),
                        _ => return Err(de::Error::custom("a prompt list mixes token ids and prompts")),
                    }
                }
                Ok(if batch.is_empty() { Prompt::Ids(ids) } else { Prompt::Batch(batch) })
            }
        }
        d.deserialize_any(TextOrIds)
    }
}
