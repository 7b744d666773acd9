//! Key/value storage of generated sequences. A [`KvBlock`] holds the keys and values of a run of
//! tokens for every layer, token-major (`[tokens, kv_heads * head_dim]`), in buffers reserved up
//! front so decoding appends in place. A [`SeqCache`] is an optional shared prefix (a prompt
//! prefilled once for all `n` choices of a request) followed by the sequence's own block.

use std::sync::Arc;

/// Keys and values of consecutive tokens, per layer.
#[derive(Debug, Clone)]
pub struct KvBlock {
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
    pub(crate) width: usize,
    len: usize,
}

impl KvBlock {
    /// An empty block for `layers` layers of `width` (kv_heads * head_dim) values per token, with
    /// room for `capacity` tokens before any reallocation.
    pub(crate) fn new(layers: usize, width: usize, capacity: usize) -> Self {
        let buf = || (0..layers).map(|_| Vec::with_capacity(capacity * width)).collect();
        KvBlock { k: buf(), v: buf(), width, len: 0 }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No tokens stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens stored in layer `layer` (ahead of [`KvBlock::len`] while a forward pass is under way).
    pub(crate) fn rows(&self, layer: usize) -> usize {
        self.k[layer].len() / self.width
    }

    /// Appends `k`/`v` rows (token-major) of layer `layer`; the last layer's append counts them.
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        self.k[layer].extend_from_slice(k);
        self.v[layer].extend_from_slice(v);
        if layer + 1 == self.k.len() {
            self.len += k.len() / self.width;
        }
    }

    /// Appends the keys and values of `rows` tokens of layer `layer`, read from token rows of
    /// `ld` values (keys at column `k_col`, values at `v_col`: one packed q/k/v row per token);
    /// the last layer's append counts them.
    pub(crate) fn append_rows(
        &mut self,
        layer: usize,
        src: &[f32],
        rows: usize,
        ld: usize,
        k_col: usize,
        v_col: usize,
    ) {
        let w = self.width;
        for r in 0..rows {
            let row = &src[r * ld..];
            self.k[layer].extend_from_slice(&row[k_col..k_col + w]);
            self.v[layer].extend_from_slice(&row[v_col..v_col + w]);
        }
        if layer + 1 == self.k.len() {
            self.len += rows;
        }
    }
}

/// One sequence's cache: a shared, frozen prefix and its own tokens.
#[derive(Debug, Clone)]
pub struct SeqCache {
    pub(crate) prefix: Option<Arc<KvBlock>>,
    pub(crate) own: KvBlock,
}

impl SeqCache {
    /// Tokens cached (prefix and own).
    pub fn len(&self) -> usize {
        self.prefix.as_ref().map_or(0, |p| p.len()) + self.own.len()
    }

    /// Nothing cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Freezes this cache as a prefix that several sequences continue (without copying it).
    pub fn into_shared(self) -> SharedPrefix {
        match self.prefix {
            // A cache that itself continues a prefix is flattened into one block.
            Some(p) => {
                let mut block = (*p).clone();
                for l in 0..block.k.len() {
                    block.k[l].extend_from_slice(&self.own.k[l]);
                    block.v[l].extend_from_slice(&self.own.v[l]);
                }
                block.len += self.own.len();
                SharedPrefix(Arc::new(block))
            }
            None => SharedPrefix(Arc::new(self.own)),
        }
    }
}

impl SeqCache {
    /// A copy of the first `len` cached tokens as a prefix other sequences can continue (for a
    /// prompt cache: the prompt without its last token, whose logits each request recomputes).
    pub fn share_first(&self, len: usize) -> SharedPrefix {
        let len = len.min(self.len());
        let width = self.own.width;
        let layers = self.own.k.len();
        let mut block = KvBlock::new(layers, width, len);
        let from_prefix = self.prefix.as_ref().map_or(0, |p| p.len().min(len));
        let rest = (len - from_prefix) * width;
        for l in 0..layers {
            if let Some(p) = &self.prefix {
                block.append(l, &p.k[l][..from_prefix * width], &p.v[l][..from_prefix * width]);
            }
            block.append(l, &self.own.k[l][..rest], &self.own.v[l][..rest]);
        }
        SharedPrefix(Arc::new(block))
    }
}

/// A prefilled prompt that several sequences share.
#[derive(Debug, Clone)]
pub struct SharedPrefix(pub(crate) Arc<KvBlock>);

impl SharedPrefix {
    /// Tokens in the prefix.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// An empty prefix.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes its keys and values take.
    pub fn bytes(&self) -> usize {
        2 * self.0.k.len() * self.0.len() * self.0.width * std::mem::size_of::<f32>()
    }
}
