//! Rows of a CSV file (`.tsv`: tab-separated) with a header line, typed per column as
//! `datasets`' csv loader types them (pandas' `read_csv` defaults): a column of whole numbers is
//! integers (floats when a cell is missing), of numbers floats, of `True` / `False` booleans,
//! anything else text; pandas' missing-value words (`""`, `NA`, `null`, `None`, `nan`, ...) are
//! null. Duplicate column names get pandas' `.1`, `.2` suffixes, empty ones `Unnamed: i`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::row::Row;

/// pandas' default `na_values`.
const MISSING: [&str; 19] = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA",
    "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// What a column holds, from all its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
    Bool,
    Text,
}

/// Every row of the CSV text of `path`, fields split at `delimiter`.
pub(crate) fn read(path: &Path, text: &str, delimiter: u8) -> Result<Vec<Row>> {
    let fail = |line: u64, message: String| Error::Csv { at: format!("{}:{line}", path.display()), message };
    let mut reader =
        csv::ReaderBuilder::new().delimiter(delimiter).flexible(true).has_headers(true).from_reader(text.as_bytes());
    let header = reader.headers().map_err(|e| fail(1, e.to_string()))?.clone();
    let names = column_names(header.iter());
    let mut lines = Vec::new();
    let mut cells: Vec<Vec<String>> = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| fail(e.position().map_or(0, csv::Position::line), e.to_string()))?;
        let line = record.position().map_or(0, csv::Position::line);
        if record.len() > names.len() {
            return Err(fail(line, format!("{} fields where the header names {}", record.len(), names.len())));
        }
        // pandas fills a short line's missing fields with NaN.
        let mut row: Vec<String> = record.iter().map(str::to_owned).collect();
        row.resize(names.len(), String::new());
        lines.push(line);
        cells.push(row);
    }
    let kinds: Vec<Kind> =
        (0..names.len()).map(|c| kind_of(&cells.iter().map(|row| row[c].as_str()).collect::<Vec<_>>())).collect();
    Ok(cells
        .into_iter()
        .zip(lines)
        .map(|(row, line)| {
            let fields: Map<String, Value> = names
                .iter()
                .zip(&kinds)
                .zip(row)
                .map(|((name, kind), cell)| (name.clone(), value(*kind, &cell)))
                .collect();
            Row { fields, at: format!("{}:{line}", path.display()) }
        })
        .collect())
}

/// The header's names made unique as pandas makes them.
fn column_names<'a>(header: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (i, name) in header.enumerate() {
        let base = if name.is_empty() { format!("Unnamed: {i}") } else { name.to_owned() };
        let mut unique = base.clone();
        let mut n = 0;
        while names.contains(&unique) {
            n += 1;
            unique = format!("{base}.{n}");
        }
        names.push(unique);
    }
    names
}

fn missing(cell: &str) -> bool {
    MISSING.contains(&cell)
}

fn is_int(cell: &str) -> bool {
    cell.parse::<i64>().is_ok() || cell.parse::<u64>().is_ok()
}

fn boolean(cell: &str) -> Option<bool> {
    match cell {
        "True" | "TRUE" | "true" => Some(true),
        "False" | "FALSE" | "false" => Some(false),
        _ => None,
    }
}

fn kind_of(cells: &[&str]) -> Kind {
    let present = || cells.iter().copied().filter(|c| !missing(c));
    if present().all(is_int) {
        // An all-missing column is pandas' all-NaN float column.
        if cells.iter().any(|c| missing(c)) { Kind::Float } else { Kind::Int }
    } else if present().all(|c| c.parse::<f64>().is_ok()) {
        Kind::Float
    } else if present().all(|c| boolean(c).is_some()) {
        Kind::Bool
    } else {
        Kind::Text
    }
}

fn value(kind: Kind, cell: &str) -> Value {
    if missing(cell) {
        return Value::Null;
    }
    match kind {
        Kind::Int => {
            cell.parse::<i64>().map_or_else(|_| cell.parse::<u64>().map_or(Value::Null, Value::from), Value::from)
        }
        // Infinities have no JSON number: null, as NaN is.
        Kind::Float => cell.parse::<f64>().map_or(Value::Null, Value::from),
        Kind::Bool => boolean(cell).map_or(Value::Null, Value::Bool),
        Kind::Text => Value::String(cell.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rows(text: &str) -> Vec<Row> {
        read(Path::new("d/x.csv"), text, b',').unwrap()
    }

    #[test]
    fn columns_are_typed_as_pandas_types_them() {
        let got = rows("q,n,f,b,m,t\n\"a, \"\"quoted\"\"\nline\",1,1.5,True,2,None\nb,-3,2,false,,x\n");
        assert_eq!(
            got[0].fields,
            json!({"q": "a, \"quoted\"\nline", "n": 1, "f": 1.5, "b": true, "m": 2.0, "t": null})
                .as_object()
                .unwrap()
                .clone()
        );
        assert_eq!(got[1].fields["n"], json!(-3));
        assert_eq!(got[1].fields["f"], json!(2.0));
        assert_eq!(got[1].fields["b"], json!(false));
        assert_eq!(got[1].fields["m"], json!(null));
        assert_eq!(got[1].fields["t"], json!("x"));
        // Rows are named by the line they start on.
        assert!(got[1].at.ends_with("x.csv:4"), "{}", got[1].at);
    }

    #[test]
    fn short_lines_are_padded_and_long_ones_refused() {
        let got = rows("a,b\n1\n\n3,4\n");
        assert_eq!(got[0].fields["b"], json!(null));
        // Blank lines are skipped, as pandas skips them.
        assert_eq!((got.len(), got[1].fields["a"].clone()), (2, json!(3)));
        let err = read(Path::new("d/x.csv"), "a,b\n1,2\n1,2,3\n", b',').unwrap_err().to_string();
        assert!(err.contains("x.csv:3") && err.contains("3 fields where the header names 2"), "{err}");
    }

    #[test]
    fn names_are_made_unique_and_tabs_split_tsv() {
        assert_eq!(column_names(["a", "", "a", "a"].into_iter()), ["a", "Unnamed: 1", "a.1", "a.2"]);
        let got = read(Path::new("x.tsv"), "q\ta\nwhat, then?\t42\n", b'\t').unwrap();
        assert_eq!(got[0].fields["q"], json!("what, then?"));
        assert_eq!(got[0].fields["a"], json!(42));
    }
}
