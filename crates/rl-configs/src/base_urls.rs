//! `BaseUrls`: the policy's inference servers, written as one URL (`"http://host:8000/v1"`) or a
//! list of them (`["http://a:8000/v1", "http://b:8000/v1"]`, replicas the orchestrator spreads
//! groups over). A resolved config writes one URL back as a string.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{ConfigError, Result};
use crate::shared::http_url;

/// One or more OpenAI-compatible base URLs (each ending in `/v1`), never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrls(Vec<String>);

impl BaseUrls {
    /// The first server (the one a single-server setup has).
    pub fn first(&self) -> &str {
        self.0.first().map_or("", String::as_str)
    }

    /// Every server, in the configured order (their index names them in metrics).
    pub fn all(&self) -> &[String] {
        &self.0
    }

    /// Several URLs.
    pub fn many(urls: Vec<String>) -> Self {
        BaseUrls(urls)
    }

    /// Each is an http(s) URL, none repeats, at least one.
    pub fn validate(&self, key: &str) -> Result<()> {
        if self.0.is_empty() {
            return Err(ConfigError::invalid(key, "needs at least one URL"));
        }
        for (i, url) in self.0.iter().enumerate() {
            http_url(key, url)?;
            if self.0[..i].contains(url) {
                return Err(ConfigError::invalid(key, format!("names {url} twice")));
            }
        }
        Ok(())
    }
}

impl From<String> for BaseUrls {
    fn from(url: String) -> Self {
        BaseUrls(vec![url])
    }
}

impl From<&str> for BaseUrls {
    fn from(url: &str) -> Self {
        BaseUrls(vec![url.to_owned()])
    }
}

impl PartialEq<&str> for BaseUrls {
    fn eq(&self, other: &&str) -> bool {
        self.0.len() == 1 && self.0[0] == *other
    }
}

impl fmt::Display for BaseUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

impl Serialize for BaseUrls {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_str(one),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for BaseUrls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct OneOrMany;
        impl<'de> Visitor<'de> for OneOrMany {
            type Value = BaseUrls;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL or a list of URLs")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<BaseUrls, E> {
                Ok(BaseUrls(vec![v.to_owned()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<BaseUrls, A::Error> {
                let mut urls = Vec::new();
                while let Some(url) = seq.next_element::<String>()? {
                    urls.push(url);
                }
                Ok(BaseUrls(urls))
            }
        }
        d.deserialize_any(OneOrMany)
    }
}

impl JsonSchema for BaseUrls {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("BaseUrls")
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "One URL, or a list of URLs of replicas",
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::BaseUrls;

    #[test]
    fn one_url_or_a_list_and_one_is_written_back_as_a_string() {
        let one: BaseUrls = serde_json::from_value(serde_json::json!("http://a/v1")).unwrap();
        assert_eq!(one, "http://a/v1");
        assert_eq!(serde_json::to_value(&one).unwrap(), serde_json::json!("http://a/v1"));
        let two: BaseUrls = serde_json::from_value(serde_json::json!(["http://a/v1", "http://b/v1"])).unwrap();
        assert_eq!(two.all(), ["http://a/v1", "http://b/v1"]);
        assert_eq!(serde_json::to_value(&two).unwrap(), serde_json::json!(["http://a/v1", "http://b/v1"]));
        let e = serde_json::from_value::<BaseUrls>(serde_json::json!(3)).unwrap_err().to_string();
        assert!(e.contains("a URL or a list of URLs"), "{e}");
        assert!(BaseUrls::many(vec![]).validate("k").is_err());
        let twice = BaseUrls::many(vec![String::from("http://a/v1"), String::from("http://a/v1")]);
        assert!(twice.validate("k").unwrap_err().to_string().contains("twice"));
        assert!(BaseUrls::from("ftp://a").validate("k").is_err());
    }
}
