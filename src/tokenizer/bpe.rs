//! Byte-pair merging of one pre-tokenized piece, exactly as HF `tokenizers`
//! (`models/bpe/word.rs::merge_all`): start from one symbol per byte, repeatedly apply the
//! lowest-rank merge (ties: leftmost position) from a priority queue, skipping queue
//! entries made stale by earlier merges. O(n log n) per piece, so a 100k-space run is no
//! worse than many short words.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasher, Hasher};

use super::bytelevel;

/// Merge table: `(left id, right id)` packed as `left << 32 | right` → `(rank, merged id)`.
pub(crate) type MergeMap = HashMap<u64, (u32, u32), PairHasher>;

#[inline]
pub(crate) fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

/// Multiplicative hash for the packed id pairs (keys fixed at load time, so no need for
/// SipHash's flooding resistance).
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct PairHasher;

impl BuildHasher for PairHasher {
    type Hasher = PairHash;
    fn build_hasher(&self) -> PairHash {
        PairHash(0)
    }
}

pub(crate) struct PairHash(u64);

impl Hasher for PairHash {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        // fxhash step followed by a final mix of the high bits into the low ones.
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

/// The BPE model: merges plus the id of each byte's one-character token.
#[derive(Clone, Debug)]
pub(crate) struct Bpe {
    /// Model-vocabulary id of the token spelling byte `b` (`None` if the vocabulary lacks it).
    pub byte_ids: [Option<u32>; 256],
    pub merges: MergeMap,
    /// HF `ignore_merges`: a piece that is itself a vocabulary entry becomes that token.
    pub ignore_merges: bool,
    /// HF `unk_token` (+ `fuse_unk`): what a byte without a token becomes; `None` drops it
    /// (HF's behaviour without an unk token). Unreachable with a full byte alphabet.
    pub unk: Option<(u32, bool)>,
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: u32,
    prev: i32,
    next: i32,
    /// 0 once merged into its left neighbour.
    len: u32,
}

/// Per-call working memory: the symbol list, the merge queue and a piece → ids cache.
pub(crate) struct Scratch<'t> {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<(u32, u32, u32)>>,
    cache: HashMap<&'t [u8], (u32, u32)>,
    cache_ids: Vec<u32>,
    spelled: String,
}

impl Scratch<'_> {
    pub fn new() -> Self {
        Scratch {
            symbols: Vec::new(),
            queue: BinaryHeap::new(),
            cache: HashMap::new(),
            cache_ids: Vec::new(),
            spelled: String::new(),
        }
    }
}

/// Pieces longer than this are not cached (HF uses the same bound).
const CACHE_MAX_PIECE_BYTES: usize = 256;

impl Bpe {
    /// Appends the ids of `piece` (raw bytes of one pre-tokenized piece) to `out`.
    /// `model_vocab` is consulted only for `ignore_merges`.
    pub fn encode_piece<'t>(
        &self,
        piece: &'t [u8],
        model_vocab: &HashMap<String, u32>,
        scratch: &mut Scratch<'t>,
        out: &mut Vec<u32>,
    ) {
        if piece.is_empty() {
            return;
        }
        if self.ignore_merges {
            scratch.spelled.clear();
            bytelevel::encode_into(piece, &mut scratch.spelled);
            if let Some(&id) = model_vocab.get(scratch.spelled.as_str()) {
                out.push(id);
                return;
            }
        }
        if piece.len() == 1 && self.byte_ids[piece[0] as usize].is_some() {
            out.extend(self.byte_ids[piece[0] as usize]);
            return;
        }
        if let Some(&(start, n)) = scratch.cache.get(piece) {
            out.extend_from_slice(&scratch.cache_ids[start as usize..(start + n) as usize]);
            return;
        }
        let first = out.len();
        self.merge(piece, &mut scratch.symbols, &mut scratch.queue);
        out.extend(scratch.symbols.iter().filter(|s| s.len != 0).map(|s| s.id));
        if piece.len() <= CACHE_MAX_PIECE_BYTES {
            let start = scratch.cache_ids.len() as u32;
            scratch.cache_ids.extend_from_slice(&out[first..]);
            scratch
                .cache
                .insert(piece, (start, (out.len() - first) as u32));
        }
    }

    /// Leaves the merged symbols of `piece` in `symbols` (entries with `len == 0` are dead).
    fn merge(
        &self,
        piece: &[u8],
        symbols: &mut Vec<Symbol>,
        queue: &mut BinaryHeap<Reverse<(u32, u32, u32)>>,
    ) {
        symbols.clear();
        queue.clear();
        // HF merge_word: one symbol per character of the byte-level string, i.e. per byte;
        // a byte without a token becomes unk (fused with a preceding unk if asked) or is
        // dropped.
        let mut pending_unk: Option<(u32, u32)> = None;
        for &b in piece {
            match self.byte_ids[b as usize] {
                Some(id) => {
                    if let Some((uid, ulen)) = pending_unk.take() {
                        push_symbol(symbols, uid, ulen);
                    }
                    push_symbol(symbols, id, 1);
                }
                None => {
                    if let Some((unk_id, fuse)) = self.unk {
                        pending_unk = match pending_unk {
                            Some((uid, ulen)) if fuse => Some((uid, ulen + 1)),
                            Some((uid, ulen)) => {
                                push_symbol(symbols, uid, ulen);
                                Some((unk_id, 1))
                            }
                            None => Some((unk_id, 1)),
                        };
                    }
                }
            }
        }
        if let Some((uid, ulen)) = pending_unk {
            push_symbol(symbols, uid, ulen);
        }
        if let Some(last) = symbols.last_mut() {
            last.next = -1;
        }

        for (i, w) in symbols.windows(2).enumerate() {
            if let Some(&(rank, new_id)) = self.merges.get(&pair_key(w[0].id, w[1].id)) {
                queue.push(Reverse((rank, i as u32, new_id)));
            }
        }
        while let Some(Reverse((_rank, pos, new_id))) = queue.pop() {
            let pos = pos as usize;
            let cur = symbols[pos];
            if cur.len == 0 || cur.next == -1 {
                continue;
            }
            let next_pos = cur.next as usize;
            let right = symbols[next_pos];
            // Stale entry: the pair at `pos` no longer merges into `new_id`.
            match self.merges.get(&pair_key(cur.id, right.id)) {
                Some(&(_, id)) if id == new_id => {}
                _ => continue,
            }
            symbols[pos].id = new_id;
            symbols[pos].len += right.len;
            symbols[pos].next = right.next;
            symbols[next_pos].len = 0;
            if right.next >= 0 {
                symbols[right.next as usize].prev = pos as i32;
            }
            let cur = symbols[pos];
            if cur.prev >= 0 {
                let prev = cur.prev as usize;
                if let Some(&(rank, id)) = self.merges.get(&pair_key(symbols[prev].id, cur.id)) {
                    queue.push(Reverse((rank, prev as u32, id)));
                }
            }
            if cur.next >= 0 {
                let next = cur.next as usize;
                if let Some(&(rank, id)) = self.merges.get(&pair_key(cur.id, symbols[next].id)) {
                    queue.push(Reverse((rank, pos as u32, id)));
                }
            }
        }
    }
}

#[inline]
fn push_symbol(symbols: &mut Vec<Symbol>, id: u32, len: u32) {
    let i = symbols.len() as i32;
    symbols.push(Symbol {
        id,
        prev: i - 1,
        next: i + 1,
        len,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vocab a=0 b=1 c=2 ab=3 bc=4 abc=5; merges (a,b) rank 0, (b,c) rank 1, (ab,c) rank 2.
    fn tiny() -> Bpe {
        let mut byte_ids = [None; 256];
        byte_ids[b'a' as usize] = Some(0);
        byte_ids[b'b' as usize] = Some(1);
        byte_ids[b'c' as usize] = Some(2);
        let mut merges = MergeMap::default();
        merges.insert(pair_key(0, 1), (0, 3));
        merges.insert(pair_key(1, 2), (1, 4));
        merges.insert(pair_key(3, 2), (2, 5));
        Bpe {
            byte_ids,
            merges,
            ignore_merges: false,
            unk: None,
        }
    }

    fn enc(bpe: &Bpe, s: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut scratch = Scratch::new();
        bpe.encode_piece(s.as_bytes(), &HashMap::new(), &mut scratch, &mut out);
        out
    }

    #[test]
    fn lowest_rank_first_then_leftmost() {
        let bpe = tiny();
        assert_eq!(enc(&bpe, "abc"), [5]); // (a,b) before (b,c), then (ab,c)
        assert_eq!(enc(&bpe, "bc"), [4]);
        assert_eq!(enc(&bpe, "abab"), [3, 3]);
        assert_eq!(enc(&bpe, "bcabc"), [4, 5]);
        assert_eq!(enc(&bpe, "xa"), [0]); // no token for 'x' and no unk: dropped
    }

    #[test]
    fn unk_fusing() {
        let mut bpe = tiny();
        bpe.unk = Some((9, true));
        assert_eq!(enc(&bpe, "xxa"), [9, 0]);
        bpe.unk = Some((9, false));
        assert_eq!(enc(&bpe, "xxa"), [9, 9, 0]);
    }
}
