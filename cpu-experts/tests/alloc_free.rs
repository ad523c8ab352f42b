//! A decode step allocates nothing: a counting global allocator watches it.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use lagoon_cpu::{Session, SessionOptions};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_and_prefill_steps_allocate_nothing() {
    let c = common::config();
    let store = common::Store::new(&c, Some(1));
    let w = store.weights(&c);
    let mut s = Session::new(
        &c,
        &w,
        SessionOptions {
            n_ctx: 64,
            ubatch: 8,
            all_logits: false,
            n_threads: 0,
            reference: false,
            repack: None,
        },
    );
    s.step(&[1, 2, 3, 4, 5, 6, 7]).unwrap();
    let before = ALLOCS.load(Ordering::SeqCst);
    let mut tok = 3u32;
    for _ in 0..20 {
        let logits = s.step(&[tok]).unwrap();
        tok = lagoon_core::sample::argmax(logits);
    }
    s.step(&[5, 6, 7, 8]).unwrap();
    let mid = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(mid - before, 0, "steps allocated {} times", mid - before);
    // A larger prefill step (every expert busy, several tokens per expert, the grouped
    // expert path and the pool-split quantisation and routing) on 1 and 3 threads.
    for threads in [1, 3] {
        let mut big = Session::new(
            &c,
            &w,
            SessionOptions {
                n_ctx: 96,
                ubatch: 40,
                all_logits: true,
                n_threads: threads,
                reference: false,
                repack: None,
            },
        );
        let toks: Vec<u32> = (0..40)
            .map(|i| (i * 13 + 1) % c.vocab_size as u32)
            .collect();
        let before = ALLOCS.load(Ordering::SeqCst);
        big.step(&toks).unwrap();
        big.step(&toks[..33]).unwrap();
        big.step(&toks[..1]).unwrap();
        let after = ALLOCS.load(Ordering::SeqCst);
        assert_eq!(
            after - before,
            0,
            "prefill steps allocated {} times",
            after - before
        );
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    // The counter does see allocations (the test can fail).
    let v = std::hint::black_box(vec![0u8; 16]);
    assert!(ALLOCS.load(Ordering::SeqCst) > after);
    drop(v);
}
