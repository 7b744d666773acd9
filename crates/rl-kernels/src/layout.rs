//! How the tokens of one packed row form samples. A row is a sequence of segments (runs of
//! consecutive tokens). A segment may name an earlier segment as its parent: its tokens then see
//! every token of the parent chain (a shared prompt, say) and the tokens of their own segment up to
//! themselves, and its positions continue from the end of the chain. Without a parent a segment is
//! an ordinary packed sample: positions restart at 0 and attention never leaves it.

use std::ops::Range;

/// One run of tokens of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First token (index in the row).
    pub start: usize,
    /// Number of tokens.
    pub len: usize,
    /// The segment this one continues (an earlier index), if any.
    pub parent: Option<usize>,
}

/// Why a layout is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// `lens` and `parents` differ in length.
    #[error("{lens} segment lengths but {parents} parents")]
    Mismatch {
        /// Lengths given.
        lens: usize,
        /// Parents given.
        parents: usize,
    },
    /// A parent is not an earlier segment.
    #[error("segment {segment}: parent {parent} is not an earlier segment")]
    BadParent {
        /// The segment.
        segment: usize,
        /// Its parent.
        parent: usize,
    },
    /// A segment has no tokens.
    #[error("segment {0} is empty")]
    Empty(usize),
}

/// The segments of one row (validated: parents come first, no segment is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayout {
    segments: Vec<Segment>,
    len: usize,
}

impl RowLayout {
    /// Segments of `lens[i]` tokens back to back, segment i continuing `parents[i]`.
    pub fn new(lens: &[usize], parents: &[Option<usize>]) -> Result<Self, LayoutError> {
        if lens.len() != parents.len() {
            return Err(LayoutError::Mismatch { lens: lens.len(), parents: parents.len() });
        }
        let mut segments = Vec::with_capacity(lens.len());
        let mut start = 0;
        for (i, (&len, &parent)) in lens.iter().zip(parents).enumerate() {
            if len == 0 {
                return Err(LayoutError::Empty(i));
            }
            if let Some(p) = parent
                && p >= i
            {
                return Err(LayoutError::BadParent { segment: i, parent: p });
            }
            segments.push(Segment { start, len, parent });
            start += len;
        }
        Ok(RowLayout { segments, len: start })
    }

    /// Independent samples of `lens[i]` tokens (ordinary packing).
    pub fn packed(lens: &[usize]) -> Self {
        let parents = vec![None; lens.len()];
        Self::new(&lens.iter().map(|&l| l.max(1)).collect::<Vec<_>>(), &parents).expect("independent samples are valid")
    }

    /// Independent samples wherever `positions` restarts (is not the previous position + 1).
    pub fn from_positions(positions: &[u32]) -> Self {
        let mut lens = Vec::new();
        for (i, &p) in positions.iter().enumerate() {
            if i == 0 || p != positions[i - 1] + 1 {
                lens.push(0);
            }
            *lens.last_mut().expect("pushed above") += 1;
        }
        Self::packed(&lens)
    }

    /// Tokens in the row.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segments, in row order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Token ranges of segment `s`'s ancestors, root first (what its tokens see besides their own
    /// segment).
    pub fn ancestor_ranges(&self, s: usize) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut cur = self.segments[s].parent;
        while let Some(p) = cur {
            let seg = self.segments[p];
            out.push(seg.start..seg.start + seg.len);
            cur = seg.parent;
        }
        out.reverse();
        out
    }

    /// Tokens before segment `s`'s first token in its own sequence (its ancestors' lengths).
    pub fn offset(&self, s: usize) -> usize {
        self.ancestor_ranges(s).iter().map(ExactSizeIterator::len).sum()
    }

    /// The position of every token in its own sequence.
    pub fn positions(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        for s in 0..self.segments.len() {
            let off = self.offset(s);
            out.extend((off..off + self.segments[s].len).map(|p| p as u32));
        }
        out
    }

    /// For every token, the row index whose output predicts it: the previous token of its segment,
    /// or for a segment's first token the last token of its parent (`None` for a root's first token,
    /// which is never a target).
    pub fn sources(&self) -> Vec<Option<usize>> {
        let mut out = Vec::with_capacity(self.len);
        for seg in &self.segments {
            let first = seg.parent.map(|p| self.segments[p].start + self.segments[p].len - 1);
            out.push(first);
            out.extend((seg.start..seg.start + seg.len - 1).map(Some));
        }
        out
    }

    /// The segment holding each token.
    pub fn segment_of(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.len);
        for (i, seg) in self.segments.iter().enumerate() {
            out.extend(std::iter::repeat_n(i, seg.len));
        }
        out
    }

    /// Whether token `i` sees token `j` (the reference definition the kernels implement).
    pub fn sees(&self, i: usize, j: usize) -> bool {
        let of = |t: usize| self.segments.iter().position(|s| t >= s.start && t < s.start + s.len);
        let (Some(si), Some(sj)) = (of(i), of(j)) else { return false };
        if si == sj {
            return j <= i;
        }
        self.ancestor_ranges(si).iter().any(|r| r.contains(&j))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_prompt_is_seen_by_every_completion_and_positions_continue() {
        // prompt (3 tokens), two completions of 2 and 3 tokens.
        let l = RowLayout::new(&[3, 2, 3], &[None, Some(0), Some(0)]).unwrap();
        assert_eq!(l.positions(), vec![0, 1, 2, 3, 4, 3, 4, 5]);
        assert_eq!(l.sources(), vec![None, Some(0), Some(1), Some(2), Some(3), Some(2), Some(5), Some(6)]);
        assert!(l.sees(4, 0) && l.sees(4, 3) && !l.sees(4, 5));
        assert!(l.sees(7, 2) && l.sees(7, 5) && !l.sees(7, 3) && !l.sees(5, 6));
        assert!(!l.sees(1, 2), "causal within the prompt");
    }

    #[test]
    fn restarting_positions_are_independent_samples() {
        let l = RowLayout::from_positions(&[0, 1, 2, 0, 1]);
        assert_eq!(l.segments().len(), 2);
        assert_eq!(l.sources(), vec![None, Some(0), Some(1), None, Some(3)]);
        assert!(!l.sees(3, 2));
    }

    #[test]
    fn parents_must_come_first_and_segments_have_tokens() {
        assert_eq!(RowLayout::new(&[2, 2], &[Some(1), None]), Err(LayoutError::BadParent { segment: 0, parent: 1 }));
        assert_eq!(RowLayout::new(&[2, 0], &[None, None]), Err(LayoutError::Empty(1)));
        assert!(matches!(RowLayout::new(&[2], &[]), Err(LayoutError::Mismatch { .. })));
    }
}
