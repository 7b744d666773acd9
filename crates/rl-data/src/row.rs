//! One dataset row: its fields as a JSON object and where it came from.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One row of a dataset and where it came from (`file:line`, or `file row N` for Parquet and
/// JSON arrays, counted from 1), for errors about its fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub fields: Map<String, Value>,
    pub at: String,
}

/// `value` as the row at `at`; anything but an object is an error naming `at`.
pub(crate) fn object(value: Value, at: String) -> Result<Row> {
    match value {
        Value::Object(fields) => Ok(Row { fields, at }),
        other => Err(Error::NotAnObject { at, got: kind(&other) }),
    }
}

/// What a JSON value is, for errors.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
