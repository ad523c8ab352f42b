//! A persistent, allocation-free thread pool: `run(f)` calls `f(i)` once on each of `n`
//! threads (the caller is thread 0) and returns when all are done.
//!
//! Workers spin briefly on a generation counter (a decode step dispatches hundreds of small
//! jobs, and a futex wake costs more than the job), then park on a condvar. Nothing is
//! allocated per job: the job is a reference to the caller's closure, published through an
//! atomic pointer and valid until `run` returns (which waits for every worker).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The closure of the current job, behind a thin pointer.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    job: AtomicPtr<Job<'static>>,
    generation: AtomicUsize,
    remaining: AtomicUsize,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// Spin iterations before a worker parks (~50–100 µs on a current core). Past
/// `SPIN_YIELD` the spinner also yields its core, so an oversubscribed machine (more busy
/// threads than cores) keeps making progress instead of burning the time slice.
const SPIN_LIMIT: usize = 1 << 14;
const SPIN_YIELD: usize = 1 << 10;

/// A fixed set of worker threads.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.n_threads())
    }
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1; the caller's thread counts as one).
    pub fn new(n_threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            generation: AtomicUsize::new(0),
            remaining: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("lagoon-cpu-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawning a CPU worker thread")
            })
            .collect();
        let pool = ThreadPool { shared, workers };
        // Wait until every worker runs: a thread's start-up (the runtime records its name
        // for the stack-overflow handler) allocates, and must not land in a later job.
        pool.run(&|_| {});
        pool
    }

    /// Threads that run each job (workers + the caller).
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every thread index `i` in `0..n_threads()`, `f(0)` on the caller.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let job = Job { f };
        let s = &*self.shared;
        s.remaining.store(self.workers.len(), Ordering::Relaxed);
        s.job.store(
            &job as *const Job<'_> as *mut Job<'static>,
            Ordering::Relaxed,
        );
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(0);
        let mut spins = 0usize;
        while s.remaining.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // Every worker is done with `job` before it goes out of scope.
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0;
        let g = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen || s.shutdown.load(Ordering::Acquire) {
                break g;
            }
            spins += 1;
            if spins < SPIN_YIELD {
                std::hint::spin_loop();
            } else if spins < SPIN_LIMIT {
                std::thread::yield_now();
            } else {
                let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                // Re-check under the lock: `run` notifies under the same lock.
                let guard = s
                    .wake
                    .wait_while(guard, |_| {
                        s.generation.load(Ordering::SeqCst) == seen
                            && !s.shutdown.load(Ordering::Acquire)
                    })
                    .unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(guard);
                spins = 0;
            }
        };
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = g;
        let job = s.job.load(Ordering::Acquire);
        // SAFETY: `run` published `job` before bumping the generation (Release/Acquire) and
        // does not return, so the `Job` on its stack stays alive, until `remaining` reaches
        // zero, which happens only after this call.
        let f = unsafe { (*job).f };
        f(index);
        s.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Splits `0..n` into `parts` near-equal ranges; returns part `i`.
pub fn chunk(n: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Work handed out on demand: each call of `next` claims the next `grain` items of `0..n`
/// (an atomic counter shared by the threads of one dispatch). Threads that run fast or
/// start early take more, so one slow core (a noisy neighbour, a late wake-up) does not hold
/// the whole dispatch back as a static split would. Which thread gets an item never changes
/// what is computed for it.
pub struct Dynamic {
    next: AtomicUsize,
    n: usize,
    grain: usize,
}

impl Dynamic {
    pub fn new(n: usize, grain: usize) -> Dynamic {
        Dynamic {
            next: AtomicUsize::new(0),
            n,
            grain: grain.max(1),
        }
    }

    /// A grain that gives each of `threads` about `per_thread` claims.
    pub fn balanced(n: usize, threads: usize, per_thread: usize) -> Dynamic {
        Dynamic::new(n, n.div_ceil(threads * per_thread))
    }

    /// The next range of items, or `None` when all are claimed.
    pub fn claim(&self) -> Option<std::ops::Range<usize>> {
        let start = self.next.fetch_add(self.grain, Ordering::Relaxed);
        (start < self.n).then(|| start..(start + self.grain).min(self.n))
    }

    /// Every item this thread claims, one at a time.
    pub fn items(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::from_fn(|| self.claim()).flatten()
    }
}

/// A raw pointer to an output buffer that several threads write at disjoint indices
/// (f32 values, or bytes of quantised activation rows).
pub struct SharedOut<T = f32>(*mut T, usize);

impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SharedOut<T> {}

// SAFETY: only used through `slice`/`set`/`add`, whose callers promise disjoint ranges per
// thread (or a happens-before edge between one thread's writes and another's access).
unsafe impl<T: Send> Sync for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedOut<T> {}

impl<T> SharedOut<T> {
    pub fn new(s: &mut [T]) -> SharedOut<T> {
        SharedOut(s.as_mut_ptr(), s.len())
    }

    /// A view of `len` elements at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for writes for as long as the `SharedOut` is used, and
    /// accessed through nothing else meanwhile.
    pub unsafe fn from_raw(ptr: *mut T, len: usize) -> SharedOut<T> {
        SharedOut(ptr, len)
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.1
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.1 == 0
    }

    /// A mutable view of `range`.
    ///
    /// # Safety
    /// No other live reference (from any thread) may overlap `range`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.1);
        // SAFETY: in bounds (checked); exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(range.start), range.len()) }
    }
}

impl SharedOut<f32> {
    /// Writes one element.
    ///
    /// # Safety
    /// No other thread may access index `i` concurrently.
    pub unsafe fn set(&self, i: usize, v: f32) {
        assert!(i < self.1);
        // SAFETY: in bounds (checked); exclusivity is the caller's promise.
        unsafe { *self.0.add(i) = v }
    }

    /// Adds to one element.
    ///
    /// # Safety
    /// No other thread may access index `i` concurrently.
    pub unsafe fn add(&self, i: usize, v: f32) {
        assert!(i < self.1);
        // SAFETY: in bounds (checked); exclusivity is the caller's promise.
        unsafe { *self.0.add(i) += v }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_once() {
        for n in [1, 2, 5] {
            let pool = ThreadPool::new(n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..1000 {
                pool.run(&|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1000));
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(3);
        let sum = AtomicUsize::new(0);
        pool.run(&|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        pool.run(&|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn dynamic_claims_every_item_once() {
        let pool = ThreadPool::new(3);
        for (n, grain) in [(0, 1), (1, 4), (100, 7), (1000, 1)] {
            let d = Dynamic::new(n, grain);
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|_| {
                for i in d.items() {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn chunks_cover_exactly() {
        for n in [0, 1, 7, 100] {
            for parts in [1, 3, 8] {
                let mut next = 0;
                for i in 0..parts {
                    let r = chunk(n, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
