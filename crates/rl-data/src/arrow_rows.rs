//! Rows of an Arrow file as `datasets` writes them (`save_to_disk` shards and its cache files:
//! the IPC stream format; the IPC file format, `ARROW1`, read too), batch by batch, a JSON
//! object per row with the columns in the schema's order.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use serde_json::Map;

use crate::error::{Error, Result};
use crate::row::Row;

/// Every row of the Arrow file at `path`.
pub(crate) fn read(path: &Path) -> Result<Vec<Row>> {
    // arrow-ipc trusts a file's buffer offsets and panics on one that points past the body (a
    // damaged or hand-cut shard): a bad file must be an error naming it, not a crash.
    crate::error::unpanicked(
        || read_unguarded(path),
        |message| Error::Arrow { path: path.to_path_buf(), message: format!("a damaged Arrow file ({message})") },
    )
}

fn read_unguarded(path: &Path) -> Result<Vec<Row>> {
    let fail = |message: String| Error::Arrow { path: path.to_path_buf(), message };
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut magic = [0u8; 6];
    let is_file_format = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    file.seek(SeekFrom::Start(0)).map_err(|e| Error::io(path, e))?;
    let batches: Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>>> = if is_file_format {
        Box::new(arrow_ipc::reader::FileReader::try_new_buffered(file, None).map_err(|e| fail(e.to_string()))?)
    } else {
        Box::new(
            arrow_ipc::reader::StreamReader::try_new(BufReader::new(file), None)
                .map_err(|e| fail(format!("not an Arrow IPC stream or file ({e})")))?,
        )
    };
    let mut rows = Vec::new();
    for batch in batches {
        let batch = batch.map_err(|e| fail(e.to_string()))?;
        let mut objects = vec![Map::new(); batch.num_rows()];
        for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
            let values = crate::arrow_column::column(array.as_ref())
                .map_err(|m| fail(format!("column `{}`: {m}", field.name())))?;
            for (object, value) in objects.iter_mut().zip(values) {
                object.insert(field.name().clone(), value);
            }
        }
        let first = rows.len();
        rows.extend(
            objects
                .into_iter()
                .enumerate()
                .map(|(i, fields)| Row { fields, at: format!("{} row {}", path.display(), first + i + 1) }),
        );
    }
    Ok(rows)
}
