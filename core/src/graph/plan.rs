//! The liveness memory planner (after ggml's `gallocr`): walk the nodes in order, give each
//! output the first free range that fits, and return a value's range to the free list
//! [`FUSE_SLACK`] nodes after its last reader. Outputs are placed before inputs are freed, so
//! a node never writes over what it reads; with the slack, neither does a backend kernel that
//! runs a node together with the next `FUSE_SLACK` ones (it reads the first node's inputs
//! while writing the later nodes' outputs).

use alloc::vec;
use alloc::vec::Vec;

use super::{Op, Value, ValueId};

/// Nodes a value's space stays reserved past its last reader. 2 covers the decode and
/// prefill fusions of the CUDA backend: QK-norm + RoPE + KV store (the rotated q is made two
/// nodes after q's last reader), a float product with the residual add after it, and a SwiGLU
/// MLP's gate, up and SwiGLU (its output made one node after the input's last reader). A
/// kernel fusing longer runs must still check for overlap itself.
pub const FUSE_SLACK: usize = 2;

/// Assigns every value an arena offset; returns the values and the arena length (elements).
pub fn plan(
    nodes: &[Op],
    cols: &[(usize, bool)],
    max_tokens: usize,
    keep: ValueId,
) -> (Vec<Value>, usize) {
    let n = cols.len();
    let mut last_use = vec![usize::MAX; n];
    for (i, op) in nodes.iter().enumerate() {
        for v in op.inputs() {
            last_use[v] = i;
        }
    }
    last_use[keep] = usize::MAX; // never freed
    let mut values: Vec<Value> = cols
        .iter()
        .map(|&(c, one_row)| Value {
            cols: c,
            one_row,
            offset: usize::MAX,
        })
        .collect();
    // Free ranges as (offset, len), sorted by offset and coalesced.
    let mut free: Vec<(usize, usize)> = Vec::new();
    let mut top = 0usize;
    // Values whose last reader is node i, released FUSE_SLACK nodes later.
    let mut due: Vec<Vec<ValueId>> = vec![Vec::new(); nodes.len()];
    for (i, op) in nodes.iter().enumerate() {
        for v in op.outputs() {
            let len = slot_len(&values[v], max_tokens);
            values[v].offset = alloc_first_fit(&mut free, &mut top, len);
            // A value nobody reads is dead right after its node.
            if last_use[v] == usize::MAX && v != keep {
                last_use[v] = i;
            }
        }
        for v in op.inputs().chain(op.outputs()) {
            if last_use[v] == i {
                due[i].push(v);
                last_use[v] = usize::MAX - 1; // listed once
            }
        }
        if let Some(j) = i.checked_sub(FUSE_SLACK) {
            for v in core::mem::take(&mut due[j]) {
                release(
                    &mut free,
                    values[v].offset,
                    slot_len(&values[v], max_tokens),
                );
            }
        }
    }
    (values, top)
}

/// Elements reserved for a value: its capacity rounded up to [`SLOT_ALIGN`], so that every
/// value starts 64-byte aligned (the CUDA kernels' vector loads rely on it).
fn slot_len(v: &Value, max_tokens: usize) -> usize {
    v.capacity(max_tokens).next_multiple_of(SLOT_ALIGN)
}

/// Alignment of every value's offset, in elements (16 f32 = 64 bytes).
pub const SLOT_ALIGN: usize = 16;

fn alloc_first_fit(free: &mut Vec<(usize, usize)>, top: &mut usize, len: usize) -> usize {
    if let Some(i) = free.iter().position(|&(_, l)| l >= len) {
        let (off, l) = free[i];
        if l == len {
            free.remove(i);
        } else {
            free[i] = (off + len, l - len);
        }
        return off;
    }
    // Grow the arena, reusing a free range that ends at the top.
    if let Some(&(off, l)) = free.last()
        && off + l == *top
    {
        free.pop();
        *top = off + len;
        return off;
    }
    let off = *top;
    *top += len;
    off
}

fn release(free: &mut Vec<(usize, usize)>, off: usize, len: usize) {
    let i = free.partition_point(|&(o, _)| o < off);
    free.insert(i, (off, len));
    // Coalesce with the neighbours.
    if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
        free[i].1 += free[i + 1].1;
        free.remove(i + 1);
    }
    if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
        free[i - 1].1 += free[i].1;
        free.remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::FUSE_SLACK;
    use alloc::vec;

    /// No two values that are live at the same time may overlap, a value counting as live
    /// until FUSE_SLACK nodes after its last reader.
    fn check_no_overlap(g: &Graph) {
        let n = g.values.len();
        let mut born = vec![usize::MAX; n];
        let mut dies = vec![0usize; n];
        for (i, op) in g.nodes.iter().enumerate() {
            for v in op.outputs() {
                born[v] = i;
                dies[v] = dies[v].max(i);
            }
            for v in op.inputs() {
                dies[v] = dies[v].max(i);
            }
        }
        for d in dies.iter_mut() {
            *d += FUSE_SLACK;
        }
        dies[g.output] = usize::MAX;
        for a in 0..n {
            for b in a + 1..n {
                let live = born[a] <= dies[b] && born[b] <= dies[a];
                let (va, vb) = (g.values[a], g.values[b]);
                let (ea, eb) = (
                    va.offset + va.capacity(g.max_tokens),
                    vb.offset + vb.capacity(g.max_tokens),
                );
                let overlap = va.offset < eb && vb.offset < ea;
                assert!(
                    !(live && overlap),
                    "values {a} and {b} overlap while both live"
                );
                assert!(ea <= g.arena_len && eb <= g.arena_len);
            }
        }
    }

    #[test]
    fn chain_reuses_memory() {
        let mut b = Builder::new(4);
        let mut x = b.value(8);
        b.push(Op::Embed { out: x });
        for _ in 0..10 {
            let y = b.value(8);
            b.push(Op::RmsNorm {
                x,
                w: Weight::OutputNorm,
                out: y,
            });
            x = y;
        }
        let g = b.finish(x);
        check_no_overlap(&g);
        assert_eq!(
            g.arena_len,
            (2 + FUSE_SLACK) * 8 * 4,
            "a chain needs two buffers, and FUSE_SLACK more"
        );
    }

    #[test]
    fn residual_stays_live() {
        let mut b = Builder::new(2);
        let x = b.value(4);
        b.push(Op::Embed { out: x });
        let h = b.value(4);
        b.push(Op::RmsNorm {
            x,
            w: Weight::OutputNorm,
            out: h,
        });
        let big = b.value(16);
        b.push(Op::MatMul {
            x: h,
            w: Weight::Output,
            out: big,
        });
        let small = b.value(4);
        b.push(Op::MatMul {
            x: big,
            w: Weight::Output,
            out: small,
        });
        let y = b.value(4);
        b.push(Op::Add {
            a: x,
            b: small,
            out: y,
        });
        let g = b.finish(y);
        check_no_overlap(&g);
    }
}
