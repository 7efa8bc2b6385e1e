//! RFC 2018's SACK option as the state machine sees it: at most three
//! blocks, each `[left, right)` in sequence space. Three is what fits beside
//! the timestamps option in 40 bytes of options; a fourth block from the
//! wire is not kept (the parser stops at three), so a peer cannot make a
//! segment carry more work than that.

use super::Seq;

/// The most blocks one segment carries (RFC 2018 §3 with timestamps on).
pub const MAX_SACK_BLOCKS: usize = 3;

/// One SACK block: the bytes `[left, right)` were received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SackBlock {
    pub left: Seq,
    pub right: Seq,
}

/// Up to [`MAX_SACK_BLOCKS`] blocks, first the most recent (RFC 2018 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SackBlocks {
    blocks: [Option<SackBlock>; MAX_SACK_BLOCKS],
}

impl SackBlocks {
    pub const NONE: SackBlocks = SackBlocks {
        blocks: [None; MAX_SACK_BLOCKS],
    };

    /// Appends a block; `false` when all slots are taken.
    pub fn push(&mut self, block: SackBlock) -> bool {
        match self.blocks.iter_mut().find(|b| b.is_none()) {
            Some(slot) => {
                *slot = Some(block);
                true
            }
            None => false,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = SackBlock> + '_ {
        self.blocks.iter().flatten().copied()
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks[0].is_none()
    }

    /// The blocks as `(left, right)` pairs (tests, the wire).
    pub fn to_pairs(&self) -> Vec<(u32, u32)> {
        self.iter().map(|b| (b.left.0, b.right.0)).collect()
    }
}

impl FromIterator<SackBlock> for SackBlocks {
    /// The first [`MAX_SACK_BLOCKS`] blocks; the rest are left out.
    fn from_iter<I: IntoIterator<Item = SackBlock>>(iter: I) -> SackBlocks {
        let mut blocks = SackBlocks::NONE;
        for block in iter {
            if !blocks.push(block) {
                break;
            }
        }
        blocks
    }
}
