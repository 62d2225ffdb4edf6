//! A tiny persistent thread pool for the CPU backend.
//!
//! Decode issues a few dozen small parallel ops per token; spawning threads for each (as
//! `std::thread::scope` does) would cost more than the work itself on a small model. A job is a
//! number of chunks that participants claim from an atomic counter: the calling thread always
//! works too and never waits for a worker that has not started (a busy or oversubscribed machine
//! may not schedule it for milliseconds), only for chunks a worker has actually claimed. Workers
//! spin briefly for the next job (it usually follows within microseconds), then park on a
//! condition variable; a caller waiting for a worker's last chunk spins briefly too, then parks
//! until that worker signals. An idle pool (a server between requests) therefore uses no CPU:
//! the tests measure each thread's CPU time over an idle second.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The job type: `f(participant, chunk)`; `participant` is 0 for the caller, `1..` for workers.
type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

struct Shared {
    /// Bumped once per job; workers look for work when they see a new value.
    generation: AtomicUsize,
    /// Next chunk to claim.
    next: AtomicUsize,
    /// Chunks in the current job.
    n_chunks: AtomicUsize,
    /// Chunks finished.
    completed: AtomicUsize,
    /// Set by the caller once all chunks are done: late workers must not touch the job.
    closed: AtomicBool,
    /// Workers currently inside the job (between the `closed` check and their last chunk).
    active: AtomicUsize,
    /// Set when a worker's chunk panicked (the caller re-raises).
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// The current job, as a type-erased fat pointer; valid while `Pool::run` is on the stack.
    job: Mutex<Option<JobPtr>>,
    wake: Condvar,
    /// Signalled by the worker that completes a job's last chunk (the caller may be parked).
    done_lock: Mutex<()>,
    done: Condvar,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);
// SAFETY: the pointer is only dereferenced while `Pool::run` keeps the referent alive (see the
// `closed`/`active` protocol) and the referent is `Sync`.
unsafe impl Send for JobPtr {}

/// A fixed set of worker threads executing one data-parallel job at a time.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Serialises concurrent `run` calls from different threads.
    run_lock: Mutex<()>,
}

/// How long a worker spins for the next job before parking (iterations of `spin_loop`).
const SPIN_ITERS: usize = 1 << 14;

impl Pool {
    /// A pool of `n_threads` threads in total (the caller's thread counts as one).
    pub fn new(n_threads: usize) -> Pool {
        Self::named(n_threads, "pn-cpu")
    }

    /// [`Pool::new`] with worker threads named `{prefix}-{index}` (tests find their threads by
    /// name; Linux shows the first 15 bytes).
    fn named(n_threads: usize, prefix: &str) -> Pool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            n_chunks: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            closed: AtomicBool::new(true),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            job: Mutex::new(None),
            wake: Condvar::new(),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        });
        let workers = (1..n_threads)
            .filter_map(|index| {
                let shared = Arc::clone(&shared);
                // A pool that could not spawn a worker still works (the caller does everything).
                std::thread::Builder::new()
                    .name(format!("{prefix}-{index}"))
                    .spawn(move || worker_loop(&shared, index))
                    .ok()
            })
            .collect::<Vec<_>>();
        let n_threads = workers.len() + 1;
        Pool {
            shared,
            workers,
            n_threads,
            run_lock: Mutex::new(()),
        }
    }

    /// Number of threads a job may run on (including the caller).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(participant, chunk)` for every `chunk` in `0..n_chunks`, in parallel, and
    /// returns when all chunks are done.
    pub fn run(&self, n_chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.n_threads == 1 || n_chunks <= 1 {
            for c in 0..n_chunks {
                f(0, c);
            }
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: erase the lifetime; workers only dereference the pointer while `closed` is
        // false or they are counted in `active`, and this function waits for both below.
        let ptr: *const Job<'_> = f;
        let ptr: *const Job<'static> = unsafe { std::mem::transmute(ptr) };
        {
            let mut job = sh.job.lock().unwrap_or_else(|e| e.into_inner());
            *job = Some(JobPtr(ptr));
            sh.next.store(0, Ordering::SeqCst);
            sh.completed.store(0, Ordering::SeqCst);
            sh.n_chunks.store(n_chunks, Ordering::SeqCst);
            sh.closed.store(false, Ordering::SeqCst);
            sh.generation.fetch_add(1, Ordering::SeqCst);
        }
        sh.wake.notify_all();
        let mine = catch_unwind(AssertUnwindSafe(|| loop {
            let c = sh.next.fetch_add(1, Ordering::SeqCst);
            if c >= n_chunks {
                break;
            }
            f(0, c);
            sh.completed.fetch_add(1, Ordering::SeqCst);
        }));
        // Wait only for chunks that workers claimed and are still running: spin (they usually
        // end within microseconds), then park until the last one signals `done`.
        let mut spins = 0usize;
        while sh.completed.load(Ordering::SeqCst) < n_chunks && mine.is_ok() {
            spins += 1;
            if spins < 256 {
                std::hint::spin_loop();
            } else if spins < 512 {
                std::thread::yield_now();
            } else {
                let g = sh.done_lock.lock().unwrap_or_else(|e| e.into_inner());
                // Checked under the lock the worker takes after counting its chunk: either we
                // see the count, or its notify comes after we wait. The timeout only bounds a
                // missed wake-up (none is known).
                if sh.completed.load(Ordering::SeqCst) < n_chunks {
                    let wait = sh
                        .done
                        .wait_timeout(g, std::time::Duration::from_millis(10));
                    drop(wait.unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        sh.closed.store(true, Ordering::SeqCst);
        while sh.active.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        *sh.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if sh.panicked.swap(false, Ordering::SeqCst) {
            panic!("a CPU worker thread panicked");
        }
    }
}

fn worker_loop(sh: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        // Spin, then park, until a new generation (or shutdown) appears.
        let mut spins = 0usize;
        loop {
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = sh.generation.load(Ordering::SeqCst);
            if g != seen {
                seen = g;
                break;
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                let job = sh.job.lock().unwrap_or_else(|e| e.into_inner());
                if sh.generation.load(Ordering::SeqCst) == seen
                    && !sh.shutdown.load(Ordering::Acquire)
                {
                    drop(sh.wake.wait(job).unwrap_or_else(|e| e.into_inner()));
                }
                spins = 0;
            }
        }
        // Enter the job only if the caller has not closed it (Dekker-style with SeqCst: either
        // we see `closed`, or the caller sees us in `active` and waits).
        sh.active.fetch_add(1, Ordering::SeqCst);
        if !sh.closed.load(Ordering::SeqCst) && sh.generation.load(Ordering::SeqCst) == seen {
            let job = *sh.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(JobPtr(ptr)) = job {
                // SAFETY: the caller keeps the closure alive while we are counted in `active`.
                let f: &Job<'static> = unsafe { &*ptr };
                let n = sh.n_chunks.load(Ordering::SeqCst);
                loop {
                    let c = sh.next.fetch_add(1, Ordering::SeqCst);
                    if c >= n {
                        break;
                    }
                    if catch_unwind(AssertUnwindSafe(|| f(index, c))).is_err() {
                        sh.panicked.store(true, Ordering::SeqCst);
                    }
                    if sh.completed.fetch_add(1, Ordering::SeqCst) + 1 == n {
                        // The last chunk: wake the caller if it parked.
                        let _g = sh.done_lock.lock().unwrap_or_else(|e| e.into_inner());
                        sh.done.notify_all();
                    }
                }
            }
        }
        sh.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let _job = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::Release);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The half-open range of `0..n` that part `i` of `parts` covers (balanced split).
pub fn split_range(n: usize, i: usize, parts: usize) -> std::ops::Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once_per_job() {
        let pool = Pool::new(3);
        for n in [0usize, 1, 2, 7, 64] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|p, c| {
                    assert!(p < 3);
                    hits[c].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// CPU time (user + system, clock ticks) of this process's threads named `name`.
    #[cfg(target_os = "linux")]
    fn thread_ticks(name: &str) -> u64 {
        let mut total = 0;
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim_end() != name {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
        total
    }

    /// CPU time (user + system, clock ticks) of the calling thread.
    #[cfg(target_os = "linux")]
    fn my_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn idle_workers_park_instead_of_spinning() {
        let pool = Pool::named(3, "pnidle");
        let sum = AtomicUsize::new(0);
        let job = |_: usize, c: usize| {
            sum.fetch_add(c, Ordering::Relaxed);
        };
        pool.run(64, &job);
        // Past the spin phase (about a millisecond), then one idle second.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let before = thread_ticks("pnidle-1") + thread_ticks("pnidle-2");
        std::thread::sleep(std::time::Duration::from_secs(1));
        let idle = thread_ticks("pnidle-1") + thread_ticks("pnidle-2");
        // Two spinning workers would use up to 200 ticks (100 Hz) here, even on a busy machine
        // tens; parked ones 0. A few ticks of slack for the tick accounting itself.
        assert!(
            idle - before <= 3,
            "idle workers used {} ticks",
            idle - before
        );
        // Still works after parking.
        pool.run(64, &job);
        assert_eq!(sum.load(Ordering::Relaxed), 2 * (0..64).sum::<usize>());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn caller_parks_while_a_worker_finishes_a_long_chunk() {
        let pool = Pool::named(2, "pnwait");
        let started = AtomicBool::new(false);
        // The caller's CPU ticks (+ 1) when it began waiting; 0 if it never saw the worker.
        let before = AtomicUsize::new(0);
        pool.run(2, &|p, _| {
            if p == 0 {
                // The caller: its own chunk is instant once the worker holds the other one
                // (bounded, in case the caller claimed both).
                let t0 = std::time::Instant::now();
                while !started.load(Ordering::SeqCst) && t0.elapsed().as_secs() < 2 {
                    std::thread::yield_now();
                }
                if started.load(Ordering::SeqCst) {
                    before.store(my_ticks() as usize + 1, Ordering::SeqCst);
                }
            } else {
                started.store(true, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(600));
            }
        });
        let b = before.load(Ordering::SeqCst);
        assert!(b > 0, "the worker never took a chunk within 2 s");
        let used = my_ticks() as usize - (b - 1);
        // A spinning (or yielding) caller would use most of the 60 ticks.
        assert!(used <= 5, "waiting caller used {used} ticks over 600 ms");
    }

    #[test]
    fn split_covers_everything() {
        for n in 0..20 {
            for t in 1..5 {
                let mut next = 0;
                for i in 0..t {
                    let r = split_range(n, i, t);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
