//! What attention's two paths (`attention.rs`'s blocked kernel and `flash.rs`'s streaming one) share:
//! head counts, the query blocks of a packed row and the key runs each block can see.

use crate::layout::RowLayout;

/// Query rows per block.
const BLOCK: usize = 64;

/// Head counts and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (divides `q_heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl AttnShape {
    /// Width of a token's queries.
    pub fn ldq(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// Width of a token's keys (or values).
    pub fn ldk(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    pub(crate) fn group(&self, h: usize) -> usize {
        h / (self.q_heads / self.kv_heads)
    }
}

/// A run of visible keys: rows `start..start + len` of the row's key/value buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRun {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// Keys and values a query block attends to, wherever they live (a packed row, a KV cache, a
/// shared prompt's cache): `len` rows with row stride `ld`; the slices start at this head group's
/// first column of the run's first row.
#[derive(Debug, Clone, Copy)]
pub struct KvRun<'a, T> {
    /// Keys.
    pub k: &'a [T],
    /// Values.
    pub v: &'a [T],
    /// Rows.
    pub len: usize,
}

/// Which keys of the last run a query row sees: row i sees the first `diag + i * step + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Causal {
    /// Keys of the last run before row 0's own key.
    pub diag: usize,
    /// How far each further row moves (1 for consecutive tokens, 0 for heads of one token).
    pub step: usize,
}

/// One block of query rows: rows `row..row + rows` of the row, in segment `seg`, whose first row
/// is `offset` tokens into that segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    seg: usize,
    pub(crate) row: usize,
    pub(crate) rows: usize,
    pub(crate) offset: usize,
}

pub(crate) fn blocks(layout: &RowLayout) -> Vec<Block> {
    let mut out = Vec::new();
    for (s, seg) in layout.segments().iter().enumerate() {
        let mut off = 0;
        while off < seg.len {
            let rows = BLOCK.min(seg.len - off);
            out.push(Block { seg: s, row: seg.start + off, rows, offset: off });
            off += rows;
        }
    }
    out
}

/// The keys block `b` sees: its ancestors in full, then its own segment up to its last row
/// (the last run is the causal one).
pub(crate) fn key_runs(layout: &RowLayout, b: &Block) -> Vec<KeyRun> {
    let mut runs: Vec<KeyRun> =
        layout.ancestor_ranges(b.seg).into_iter().map(|r| KeyRun { start: r.start, len: r.len() }).collect();
    let own = layout.segments()[b.seg].start;
    runs.push(KeyRun { start: own, len: b.offset + b.rows });
    runs
}

/// Splits `data` into consecutive chunks of `sizes[i]` elements.
pub(crate) fn split_chunks<T>(mut data: &mut [T], sizes: impl IntoIterator<Item = usize>) -> Vec<&mut [T]> {
    let mut out = Vec::new();
    for n in sizes {
        let (head, tail) = data.split_at_mut(n);
        out.push(head);
        data = tail;
    }
    out
}
