//! `Temperature`: the one type of a sampling temperature, from config to the trainer's batch. It
//! is greedy (0) or a value in [`Temperature::MIN`, 2]; the floor check lives here only. Wire
//! formats (protobuf `optional double`, JSON numbers) are converted through [`Temperature::new`]
//! at their boundary; per-token `f32` exists only inside the trainer's batch and the kernels.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A sampling temperature: greedy, or a scale in [`Temperature::MIN`, 2].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Temperature(f64);

impl Temperature {
    /// The lowest non-zero temperature. Below it `logits / T` overflows f32 for ordinary logits
    /// (1e-40 gives NaN log-probabilities), so every boundary refuses such values.
    pub const MIN: f64 = 0.01;
    /// The highest temperature accepted.
    pub const MAX: f64 = 2.0;
    /// Greedy decoding (the most likely token; written as 0).
    pub const GREEDY: Temperature = Temperature(0.0);
    /// Sampling from the model's own distribution.
    pub const ONE: Temperature = Temperature(1.0);

    /// `t` if it is 0 (greedy) or in [`Temperature::MIN`, 2]; otherwise what was expected.
    pub fn new(t: f64) -> Result<Self, String> {
        if t == 0.0 || (Self::MIN..=Self::MAX).contains(&t) {
            Ok(Temperature(t))
        } else {
            Err(format!("must be 0 (greedy) or in [{}, {}], got {t}", Self::MIN, Self::MAX))
        }
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(self) -> bool {
        self.0 == 0.0
    }

    /// The value as written (0 for greedy).
    pub fn value(self) -> f64 {
        self.0
    }

    /// What logits are divided by to report log-probabilities: the temperature, or 1 for greedy
    /// (a greedy token's logprob is that of the model's own distribution, as vLLM reports it).
    pub fn logprob_divisor(self) -> f32 {
        if self.is_greedy() { 1.0 } else { self.0 as f32 }
    }
}

impl Default for Temperature {
    fn default() -> Self {
        Temperature::ONE
    }
}

impl fmt::Display for Temperature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Temperature {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Temperature {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Temperature::new(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Temperature {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Temperature")
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "0 (greedy) or in [0.01, 2]",
            "type": "number",
            "minimum": 0.0,
            "maximum": Temperature::MAX
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Temperature;

    #[test]
    fn greedy_or_a_value_between_the_floor_and_two() {
        assert!(Temperature::new(0.0).unwrap().is_greedy());
        assert_eq!(Temperature::new(0.7).unwrap().value(), 0.7);
        assert_eq!(Temperature::new(0.01).unwrap().logprob_divisor(), 0.01);
        for bad in [0.005, 1e-40, -0.5, 2.5, f64::NAN, f64::INFINITY] {
            let e = Temperature::new(bad).unwrap_err();
            assert!(e.contains("0 (greedy)") && e.contains("0.01"), "{e}");
        }
        assert_eq!(Temperature::GREEDY.logprob_divisor(), 1.0, "greedy logprobs are the model's own");
    }

    #[test]
    fn it_reads_and_writes_as_a_number_and_refuses_out_of_range_values() {
        let t: Temperature = serde_json::from_str("0.5").unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), "0.5");
        let e = serde_json::from_str::<Temperature>("0.001").unwrap_err().to_string();
        assert!(e.contains("must be 0 (greedy)"), "{e}");
    }
}
