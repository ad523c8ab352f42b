//! The generate-and-write pipeline: worker threads generate fixed-size chunks of tensor
//! data in parallel while the calling thread writes them in order. At most `window`
//! chunks are in flight, so memory stays at `window × CHUNK_BYTES` whatever the model
//! size, and every chunk's bytes depend only on its coordinates (see [`Job`]), never on
//! which thread made it.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Condvar, Mutex};

/// Target chunk size: large enough that per-chunk overhead vanishes, small enough that a
/// few per thread fit in cache-friendly memory.
pub const CHUNK_BYTES: usize = 4 << 20;

/// One chunk to generate and write.
#[derive(Clone, Debug)]
pub struct Job {
    /// Output file (index into the writer's file list).
    pub file: usize,
    /// Tensor index (into the writer's tensor list) and chunk index within it: with the
    /// seed, the chunk's random stream.
    pub tensor: usize,
    pub chunk: u64,
    /// First element unit (block or element) of the chunk within the tensor, and count.
    pub first_unit: u64,
    pub n_units: u64,
    pub n_bytes: usize,
    /// Zero bytes to write after this chunk (tensor padding).
    pub pad_after: usize,
}

/// Splits a tensor of `n_units` units of `unit_bytes` into jobs of about
/// [`CHUNK_BYTES`].
pub fn chunk_jobs(
    file: usize,
    tensor: usize,
    n_units: u64,
    unit_bytes: usize,
    pad_after: usize,
    jobs: &mut Vec<Job>,
) {
    let per = (CHUNK_BYTES / unit_bytes).max(1) as u64;
    let n_chunks = n_units.div_ceil(per).max(1);
    for c in 0..n_chunks {
        let first = c * per;
        let n = per.min(n_units - first.min(n_units));
        jobs.push(Job {
            file,
            tensor,
            chunk: c,
            first_unit: first,
            n_units: n,
            n_bytes: n as usize * unit_bytes,
            pad_after: if c + 1 == n_chunks { pad_after } else { 0 },
        });
    }
}

struct State {
    /// Next job index a worker may claim.
    next: usize,
    /// Jobs written so far.
    written: usize,
    ready: BTreeMap<usize, Vec<u8>>,
    free: Vec<Vec<u8>>,
    /// The sink failed: workers stop claiming jobs.
    abort: bool,
    /// A worker panicked: the writer stops waiting.
    worker_died: bool,
}

/// Runs `gen` for every job on `n_threads` workers and hands the results to `sink` in job
/// order.
pub fn run<G, S>(jobs: &[Job], n_threads: usize, make: G, mut sink: S) -> io::Result<()>
where
    G: Fn(&Job, &mut [u8]) + Sync,
    S: FnMut(&Job, &[u8]) -> io::Result<()>,
{
    let n_threads = n_threads.max(1);
    let window = 2 * n_threads + 2;
    let state = Mutex::new(State {
        next: 0,
        written: 0,
        ready: BTreeMap::new(),
        free: Vec::new(),
        abort: false,
        worker_died: false,
    });
    let cv = Condvar::new();
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());

    std::thread::scope(|scope| {
        for _ in 0..n_threads {
            scope.spawn(|| {
                loop {
                    let (i, mut buf) = {
                        let mut st = lock();
                        while !st.abort && st.next < jobs.len() && st.next >= st.written + window {
                            st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
                        }
                        if st.abort || st.next >= jobs.len() {
                            return;
                        }
                        let i = st.next;
                        st.next += 1;
                        (i, st.free.pop().unwrap_or_default())
                    };
                    buf.clear();
                    buf.resize(jobs[i].n_bytes, 0);
                    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        make(&jobs[i], &mut buf)
                    }));
                    let mut st = lock();
                    if made.is_err() {
                        st.abort = true;
                        st.worker_died = true;
                    } else {
                        st.ready.insert(i, buf);
                    }
                    drop(st);
                    cv.notify_all();
                }
            });
        }

        let mut result = Ok(());
        for (i, job) in jobs.iter().enumerate() {
            let buf = {
                let mut st = lock();
                loop {
                    if let Some(b) = st.ready.remove(&i) {
                        break Some(b);
                    }
                    if st.worker_died {
                        break None;
                    }
                    st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let Some(buf) = buf else {
                result = Err(io::Error::other("a generator thread panicked"));
                break;
            };
            result = sink(job, &buf);
            let mut st = lock();
            st.free.push(buf);
            st.written = i + 1;
            if result.is_err() {
                st.abort = true;
            }
            drop(st);
            cv.notify_all();
            if result.is_err() {
                break;
            }
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_in_order_whatever_the_thread_count() {
        let mut jobs = Vec::new();
        for t in 0..5 {
            chunk_jobs(0, t, 3 * CHUNK_BYTES as u64 / 7 + t as u64, 7, t, &mut jobs);
        }
        let collect = |threads| {
            let mut out = Vec::new();
            run(
                &jobs,
                threads,
                |j, b| b.fill((j.tensor * 31 + j.chunk as usize) as u8),
                |j, b| {
                    out.extend_from_slice(b);
                    out.extend(std::iter::repeat_n(0xEE, j.pad_after));
                    Ok(())
                },
            )
            .unwrap();
            out
        };
        let one = collect(1);
        assert_eq!(one, collect(3));
        let total: usize = jobs.iter().map(|j| j.n_bytes + j.pad_after).sum();
        assert_eq!(one.len(), total);
    }

    #[test]
    fn a_panicking_generator_is_an_error_not_a_hang() {
        let mut jobs = Vec::new();
        chunk_jobs(0, 0, 16 * CHUNK_BYTES as u64, 1, 0, &mut jobs);
        let r = run(
            &jobs,
            2,
            |j, _| {
                if j.chunk == 5 {
                    panic!("generator bug")
                }
            },
            |_, _| Ok(()),
        );
        assert!(r.is_err());
    }

    #[test]
    fn a_failing_sink_stops_the_workers() {
        let mut jobs = Vec::new();
        chunk_jobs(0, 0, 64 * CHUNK_BYTES as u64, 1, 0, &mut jobs);
        let mut n = 0;
        let r = run(
            &jobs,
            2,
            |_, _| {},
            |_, _| {
                n += 1;
                if n == 3 {
                    Err(io::Error::other("disk full"))
                } else {
                    Ok(())
                }
            },
        );
        assert!(r.is_err());
        assert_eq!(n, 3);
    }
}
