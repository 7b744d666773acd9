//! One Arrow column as JSON values, a value a row, as `datasets` hands rows out (pyarrow's
//! `to_pylist`): lists and structs nest, dictionary columns give their values, maps their
//! `[key, value]` pairs; binary is base64 text, decimals, dates and timestamps text (as the
//! Parquet reader gives them).

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type, Float16Type, Float32Type,
    Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait};
use arrow_schema::{DataType, TimeUnit};
use base64::Engine as _;
use serde_json::{Map, Value};

/// The values of `array`, one a row (`Null` where the row is null). An Arrow type with no JSON
/// reading (times of day, durations, intervals, unions) is an error naming it.
pub(crate) fn column(array: &dyn Array) -> Result<Vec<Value>, String> {
    let mut values = match array.data_type() {
        DataType::Null => vec![Value::Null; array.len()],
        DataType::Boolean => array.as_boolean().iter().map(|v| v.map_or(Value::Null, Value::Bool)).collect(),
        DataType::Int8 => numbers::<Int8Type>(array),
        DataType::Int16 => numbers::<Int16Type>(array),
        DataType::Int32 => numbers::<Int32Type>(array),
        DataType::Int64 => numbers::<Int64Type>(array),
        DataType::UInt8 => numbers::<UInt8Type>(array),
        DataType::UInt16 => numbers::<UInt16Type>(array),
        DataType::UInt32 => numbers::<UInt32Type>(array),
        DataType::UInt64 => numbers::<UInt64Type>(array),
        DataType::Float16 => {
            array.as_primitive::<Float16Type>().values().iter().map(|v| Value::from(v.to_f32())).collect()
        }
        DataType::Float32 => numbers::<Float32Type>(array),
        DataType::Float64 => numbers::<Float64Type>(array),
        DataType::Utf8 => texts(array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => texts(array.as_string::<i64>().iter()),
        DataType::Utf8View => texts(array.as_string_view().iter()),
        DataType::Binary => base64s(array.as_binary::<i32>().iter()),
        DataType::LargeBinary => base64s(array.as_binary::<i64>().iter()),
        DataType::BinaryView => base64s(array.as_binary_view().iter()),
        DataType::FixedSizeBinary(_) => base64s(array.as_fixed_size_binary().iter()),
        DataType::Decimal32(..) => decimals(array.as_primitive::<Decimal32Type>()),
        DataType::Decimal64(..) => decimals(array.as_primitive::<Decimal64Type>()),
        DataType::Decimal128(..) => decimals(array.as_primitive::<Decimal128Type>()),
        DataType::Decimal256(..) => decimals(array.as_primitive::<Decimal256Type>()),
        DataType::Date32 => dates(array.as_primitive::<Date32Type>().values().iter().map(|&d| i64::from(d) * DAY_MS)),
        DataType::Date64 => dates(array.as_primitive::<Date64Type>().values().iter().copied()),
        DataType::Timestamp(unit, zone) => timestamps(array, *unit, zone.as_deref()),
        DataType::List(_) => lists(array.as_list::<i32>())?,
        DataType::LargeList(_) => lists(array.as_list::<i64>())?,
        DataType::FixedSizeList(_, size) => {
            let list = array.as_fixed_size_list();
            let size = usize::try_from(*size).map_err(|_| format!("a fixed-size list of size {size}"))?;
            // A slice's values are sliced with it: list i holds values i * size onwards.
            split_into(column(list.values().as_ref())?, (0..=list.len()).map(|i| i * size))
        }
        DataType::Struct(fields) => {
            let structs = array.as_struct();
            let mut rows: Vec<Map<String, Value>> = vec![Map::new(); structs.len()];
            for (field, child) in fields.iter().zip(structs.columns()) {
                let values = column(child.as_ref()).map_err(|m| format!("field `{}`: {m}", field.name()))?;
                for (row, value) in rows.iter_mut().zip(values) {
                    row.insert(field.name().clone(), value);
                }
            }
            rows.into_iter().map(Value::Object).collect()
        }
        DataType::Dictionary(..) => {
            let dictionary = array.as_any_dictionary();
            let values = column(dictionary.values().as_ref())?;
            dictionary.normalized_keys().into_iter().map(|k| values.get(k).cloned().unwrap_or(Value::Null)).collect()
        }
        DataType::Map(..) => {
            let map = array.as_map();
            let keys = column(map.keys().as_ref())?;
            let pairs = keys.into_iter().zip(column(map.values().as_ref())?).map(|(k, v)| Value::Array(vec![k, v]));
            let offsets = map.value_offsets().iter().map(|&o| o as usize);
            split_into(pairs.collect(), offsets)
        }
        other => return Err(format!("Arrow type {other} has no JSON reading here")),
    };
    if let Some(nulls) = array.logical_nulls() {
        for (value, valid) in values.iter_mut().zip(nulls.iter()) {
            if !valid {
                *value = Value::Null;
            }
        }
    }
    Ok(values)
}

const DAY_MS: i64 = 86_400_000;

fn numbers<T: ArrowPrimitiveType>(array: &dyn Array) -> Vec<Value>
where
    Value: From<T::Native>,
{
    array.as_primitive::<T>().values().iter().map(|&v| Value::from(v)).collect()
}

fn texts<'a>(values: impl Iterator<Item = Option<&'a str>>) -> Vec<Value> {
    values.map(|v| v.map_or(Value::Null, |s| Value::String(s.to_owned()))).collect()
}

fn base64s<'a>(values: impl Iterator<Item = Option<&'a [u8]>>) -> Vec<Value> {
    let engine = base64::engine::general_purpose::STANDARD;
    values.map(|v| v.map_or(Value::Null, |b| Value::String(engine.encode(b)))).collect()
}

fn decimals<T: arrow_array::types::DecimalType>(array: &arrow_array::PrimitiveArray<T>) -> Vec<Value> {
    (0..array.len()).map(|i| Value::String(array.value_as_string(i))).collect()
}

/// Each list's items, from its child column split at the list's offsets.
fn lists<O: OffsetSizeTrait>(list: &arrow_array::GenericListArray<O>) -> Result<Vec<Value>, String> {
    let offsets = list.value_offsets().iter().map(|o| o.as_usize());
    Ok(split_into(column(list.values().as_ref())?, offsets))
}

/// `items` cut into arrays at `bounds` (n + 1 non-decreasing positions into `items`).
fn split_into(items: Vec<Value>, bounds: impl Iterator<Item = usize>) -> Vec<Value> {
    let bounds: Vec<usize> = bounds.collect();
    let mut items = items.into_iter();
    let mut at = 0;
    let mut out = Vec::with_capacity(bounds.len().saturating_sub(1));
    for pair in bounds.windows(2) {
        // Skip what lies before the first list (a sliced array's child).
        items.by_ref().take(pair[0].saturating_sub(at)).for_each(drop);
        let len = pair[1].saturating_sub(pair[0]);
        out.push(Value::Array(items.by_ref().take(len).collect()));
        at = pair[0] + len;
    }
    out
}

/// Milliseconds since the epoch as `YYYY-MM-DD` text (the date columns).
fn dates(ms: impl Iterator<Item = i64>) -> Vec<Value> {
    ms.map(|ms| Value::String(date(ms.div_euclid(DAY_MS)))).collect()
}

/// `YYYY-MM-DD HH:MM:SS[.fraction] +00:00` (in UTC, its zone named after it when it has one).
fn timestamps(array: &dyn Array, unit: TimeUnit, zone: Option<&str>) -> Vec<Value> {
    let (raw, per_second, digits): (&[i64], i64, usize) = match unit {
        TimeUnit::Second => (array.as_primitive::<TimestampSecondType>().values(), 1, 0),
        TimeUnit::Millisecond => (array.as_primitive::<TimestampMillisecondType>().values(), 1_000, 3),
        TimeUnit::Microsecond => (array.as_primitive::<TimestampMicrosecondType>().values(), 1_000_000, 6),
        TimeUnit::Nanosecond => (array.as_primitive::<TimestampNanosecondType>().values(), 1_000_000_000, 9),
    };
    let zone = zone.map_or(String::new(), |z| format!(" {z}"));
    raw.iter()
        .map(|&t| {
            let (seconds, fraction) = (t.div_euclid(per_second), t.rem_euclid(per_second));
            let (day, second) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
            let clock = format!("{:02}:{:02}:{:02}", second / 3600, second / 60 % 60, second % 60);
            let fraction = if digits == 0 { String::new() } else { format!(".{fraction:0digits$}") };
            Value::String(format!("{} {clock}{fraction} +00:00{zone}", date(day)))
        })
        .collect()
}

/// `YYYY-MM-DD` of the date `days` after 1970-01-01.
fn date(days: i64) -> String {
    let (year, month, day) = crate::calendar::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{ArrayRef, DictionaryArray, Int32Array, StringArray, StructArray, TimestampMillisecondArray};
    use arrow_schema::Field;
    use serde_json::json;

    use super::*;

    #[test]
    fn dates_match_the_calendar() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(-1), "1969-12-31");
        assert_eq!(date(19_782), "2024-02-29");
        assert_eq!(date(11_016), "2000-02-29");
        let stamps = TimestampMillisecondArray::from(vec![1_709_208_000_123]);
        assert_eq!(column(&stamps).unwrap(), [json!("2024-02-29 12:00:00.123 +00:00")]);
    }

    #[test]
    fn lists_structs_dictionaries_and_nulls_nest() {
        let mut builder = ListBuilder::new(StringBuilder::new());
        builder.append_value([Some("a"), None]);
        builder.append_null();
        builder.append_value([Some("b")]);
        let list: ArrayRef = Arc::new(builder.finish());
        assert_eq!(column(list.as_ref()).unwrap(), [json!(["a", null]), json!(null), json!(["b"])]);
        // A slice's child offsets start past zero.
        assert_eq!(column(list.slice(1, 2).as_ref()).unwrap(), [json!(null), json!(["b"])]);

        let role: ArrayRef = Arc::new(StringArray::from(vec!["user", "assistant"]));
        let turn: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None]));
        let structs = StructArray::from(vec![
            (Arc::new(Field::new("role", DataType::Utf8, false)), role),
            (Arc::new(Field::new("turn", DataType::Int32, true)), turn),
        ]);
        assert_eq!(
            column(&structs).unwrap(),
            [json!({"role": "user", "turn": 1}), json!({"role": "assistant", "turn": null})]
        );

        let labels: DictionaryArray<Int32Type> =
            vec![Some("neg"), Some("pos"), None, Some("neg")].into_iter().collect();
        assert_eq!(column(&labels).unwrap(), [json!("neg"), json!("pos"), json!(null), json!("neg")]);
    }

    #[test]
    fn a_type_with_no_json_reading_is_named() {
        let times = arrow_array::Time32SecondArray::from(vec![1]);
        let err = column(&times).unwrap_err();
        assert!(err.contains("Time32"), "{err}");
    }
}
