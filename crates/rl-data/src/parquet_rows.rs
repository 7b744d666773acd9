//! Rows of a Parquet file as JSON objects, through the parquet crate's row reader (nested lists
//! and structs, such as a `messages` column of `{role, content}` structs, become JSON arrays and
//! objects; binary columns base64 text, dates and timestamps text).

use std::fs::File;
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::error::{Error, Result};
use crate::row::{Row, object};

/// Every row of the Parquet file at `path`.
pub(crate) fn read(path: &Path) -> Result<Vec<Row>> {
    // The parquet crate panics on some damaged footers (a column count that disagrees with the
    // schema): a bad file must be an error naming it, not a crash.
    crate::error::unpanicked(
        || read_unguarded(path),
        |message| Error::Parquet { path: path.to_path_buf(), message: format!("a damaged Parquet file ({message})") },
    )
}

fn read_unguarded(path: &Path) -> Result<Vec<Row>> {
    let fail = |e: parquet::errors::ParquetError| Error::Parquet { path: path.to_path_buf(), message: e.to_string() };
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(fail)?;
    let mut rows = Vec::new();
    for (i, row) in reader.get_row_iter(None).map_err(fail)?.enumerate() {
        let row = row.map_err(fail)?;
        rows.push(object(row.to_json_value(), format!("{} row {}", path.display(), i + 1))?);
    }
    Ok(rows)
}
