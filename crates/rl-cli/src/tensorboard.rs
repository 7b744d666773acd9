//! A TensorBoard event-file writer: `rl rl` with `[tensorboard]` mirrors every numeric metric of
//! `metrics.jsonl` and `trainer/metrics.jsonl` (trainer tags prefixed `trainer/`) as scalars, so
//! `tensorboard --logdir <run>/tensorboard` shows the run. The format is TFRecord (length, masked
//! CRC-32C of the length, the record, its masked CRC) of `Event` protobufs; appends are whole
//! records, flushed per step.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;
use serde_json::Value;

/// `tensorflow.Event` (the fields scalars need).
#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a `simple_value`.
#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// One event file, appended to.
pub(crate) struct EventWriter {
    file: File,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `<dir>/events.out.tfevents.<time>.<host>` with its version record.
    pub(crate) fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let now = wall_time();
        let path = dir.join(format!("events.out.tfevents.{}.rl", now as u64));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let mut w = EventWriter { file, path };
        w.write(&Event { wall_time: now, step: 0, file_version: Some(String::from("brain.Event:2")), summary: None })?;
        Ok(w)
    }

    /// The file written.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes every number of `row` (nested objects joined with `/`, booleans as 0/1) as scalars
    /// of `step`, tags prefixed with `prefix`.
    pub(crate) fn scalars(&mut self, step: u64, row: &Value, prefix: &str) -> std::io::Result<()> {
        let mut value = Vec::new();
        collect(row, prefix, &mut value);
        value.retain(|v| v.tag != "step" && v.tag != format!("{prefix}step"));
        if value.is_empty() {
            return Ok(());
        }
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write(&Event { wall_time: wall_time(), step, file_version: None, summary: Some(Summary { value }) })
    }

    fn write(&mut self, event: &Event) -> std::io::Result<()> {
        let data = event.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.file.write_all(&record)?;
        self.file.flush()
    }
}

fn collect(v: &Value, prefix: &str, out: &mut Vec<SummaryValue>) {
    let Value::Object(map) = v else { return };
    for (k, v) in map {
        let tag = format!("{prefix}{k}");
        let number = match v {
            Value::Number(n) => n.as_f64(),
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            Value::Object(_) => {
                collect(v, &format!("{tag}/"), out);
                None
            }
            _ => None,
        };
        if let Some(x) = number.filter(|x| x.is_finite()) {
            out.push(SummaryValue { tag, simple_value: Some(x as f32) });
        }
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// CRC-32C (Castagnoli), bitwise: records are small and few.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

/// TFRecord's masking of a CRC.
fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the records back, checking both CRCs of each.
    fn read(path: &Path) -> Vec<Event> {
        let b = std::fs::read(path).unwrap();
        let (mut pos, mut out) = (0, Vec::new());
        while pos < b.len() {
            let len_bytes = &b[pos..pos + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(b[pos + 8..pos + 12].try_into().unwrap()), masked_crc(len_bytes));
            let data = &b[pos + 12..pos + 12 + len];
            assert_eq!(u32::from_le_bytes(b[pos + 12 + len..pos + 16 + len].try_into().unwrap()), masked_crc(data));
            out.push(Event::decode(data).unwrap());
            pos += 16 + len;
        }
        out
    }

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn rows_become_scalar_events_that_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        let row = serde_json::json!({"step": 3, "reward": {"mean": 0.5}, "loss": 1.25, "env": "rt", "ok": true});
        w.scalars(3, &row, "trainer/").unwrap();
        let events = read(w.path());
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[1].step, 3);
        let mut tags: Vec<(String, f32)> = events[1]
            .summary
            .as_ref()
            .unwrap()
            .value
            .iter()
            .map(|v| (v.tag.clone(), v.simple_value.unwrap()))
            .collect();
        tags.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [("trainer/loss", 1.25), ("trainer/ok", 1.0), ("trainer/reward/mean", 0.5)];
        assert_eq!(tags, want.map(|(t, v)| (t.to_owned(), v)));
    }
}
