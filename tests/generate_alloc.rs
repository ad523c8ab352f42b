//! After the first generation, a generation with the same generator allocates nothing:
//! sampler, detokenizer and stop-string buffers are reused (the bundled model's session is
//! allocation-free per step on its own, `cpu-experts/tests/alloc_free.rs`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use lagoon::generate::{Event, GenerateParams, Generator, end_of_generation_ids};
use lagoon::sample::SamplerParams;
use lagoon::tokenizer::Tokenizer;
use lagoon::{Checkpoint, Session, SessionOptions};

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
fn second_generation_allocates_nothing() {
    let ckpt = Checkpoint::open(lagoon::BUNDLED_MODEL).unwrap();
    let weights = lagoon::weights(&ckpt).unwrap();
    let tok = Tokenizer::from_checkpoint(&ckpt).unwrap();
    let mut s = Session::new(
        &ckpt.config,
        &weights,
        SessionOptions {
            n_ctx: 128,
            ubatch: 8,
            all_logits: false,
            n_threads: 1,
            reference: false,
            repack: None,
        },
    );
    let params = GenerateParams {
        sampler: SamplerParams {
            temperature: 0.9,
            top_p: 0.9,
            min_p: 0.01,
            repetition_penalty: 1.1,
            presence_penalty: 0.1,
            frequency_penalty: 0.1,
            ..Default::default()
        },
        seed: 9,
        max_tokens: 40,
        // Never matches (not in the vocabulary's alphabet), but makes text pass through
        // the matcher; a reasoning budget exercises the forcing path.
        stop: vec!["\u{1F600}\u{1F600}".into()],
        reasoning_budget: Some(8),
        ..Default::default()
    };
    let ends = end_of_generation_ids(&ckpt.config.eos_tokens, &tok);
    let mut g = Generator::new(&tok, ckpt.config.vocab_size, &ends, params).unwrap();
    let think = g.think_tokens();
    let prompt: Vec<u32> = [2, 5, 40, 41, 8, 23]
        .into_iter()
        .chain(think.start)
        .collect();

    let mut n_text = 0usize;
    let start = ALLOCS.load(Ordering::SeqCst);
    let first = g
        .generate(&mut s, &prompt, |e| {
            if let Event::Text { text, .. } = e {
                n_text += text.len();
            }
        })
        .unwrap();
    // The counter sees the first call's setup (the output list is sized then).
    assert!(ALLOCS.load(Ordering::SeqCst) > start);
    let first_tokens = g.tokens().to_vec();
    s.reset();

    let before = ALLOCS.load(Ordering::SeqCst);
    let mut n_text2 = 0usize;
    let second = g
        .generate(&mut s, &prompt, |e| {
            if let Event::Text { text, .. } = e {
                n_text2 += text.len();
            }
        })
        .unwrap();
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(allocs, 0, "the second generation allocated {allocs} times");
    // Same seed, same session state: the same tokens.
    assert_eq!(g.tokens(), &first_tokens[..]);
    assert_eq!((first.finish, n_text), (second.finish, n_text2));
    assert!(first.n_generated > 8, "{first:?}");
}
