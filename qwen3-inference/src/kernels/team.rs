//! A team of threads for the matrix products' parallel loops (decode's, and a prompt's).
//!
//! Decoding one token runs about 140 parallel loops (four products and attention in each of 28
//! layers, then the classifier), most of them short. Under rayon each loop is a tree of tasks
//! that the other threads steal, and its start and end cost enough to show: over every q8 matrix
//! of Qwen3-0.6B, two threads on fixed halves of each matrix streamed faster than rayon's loops
//! whenever the machine's memory was fast, and as fast in slow moments (measured:
//! docs/performance.md, "The thread team").
//!
//! Fixed halves alone are fragile, though: when the hypervisor or another process takes a core
//! away from one thread, the other waits for it at the end of every loop. So each member owns a
//! contiguous run of a loop's parts and takes them in order (streaming its slice of the weights
//! as with fixed halves), and a member that has finished its own parts takes the parts that
//! another member has not started yet. A part is claimed by bumping its owner's counter, so
//! nothing is done twice. The caller never waits for a worker to start: if the workers are
//! asleep or descheduled, the caller takes every part itself, and waits only for the parts a
//! worker is in the middle of.
//!
//! The team is the calling thread plus `size - 1` workers, started once per team size and kept.
//! Between jobs a worker waits busily for [`SPIN`] (the next product of a step comes within
//! microseconds), then sleeps on a condition variable, so an idle process does not keep a core
//! busy. Every busy wait gives up its core after [`YIELD_AFTER`] (see [`Wait`]).
//!
//! A prompt's matrix products run on the team too (`matmul.rs`): its loops are longer, but the
//! team's start and end still cost less than rayon's, and one job takes a layer's q, k and v
//! together. The rest of a prompt's forward pass (attention, norms) keeps rayon; a worker that
//! waits busily between products yields its core every [`YIELD_AFTER`], so rayon's threads get
//! it (measured on two threads: docs/kernels.md, "Prompts on AVX-512").
//!
//! The team runs one job at a time. A caller that finds it busy (a server's image tower encodes
//! on a thread of its own while the engine decodes; tests run sessions side by side) does not
//! wait: it runs its job's parts on rayon's loops (its own pool's, or the global one), the same
//! parts, so the same bits. Waiting would put a decode step behind a tower's product of tens of
//! milliseconds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, TryLockError};
use std::thread;
use std::time::{Duration, Instant};

/// How long a worker waits for the next job by spinning before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// Each member's share of an output is cut into about this many parts. One part is the most a
/// descheduled member can hold up the others by, and at the end of a job the caller waits for
/// the part a worker is in the middle of; each part costs one atomic add. More parts shorten
/// the wait at a job's end, fewer save atomic adds: 16 decodes as fast as 8 and holds up the
/// others about half as long, while 32 made the steps slightly slower (measured:
/// docs/performance.md, "The thread team").
const PARTS_PER_MEMBER: usize = 16;

/// A job: `parts(owner)` parts belong to each member `owner`, and `run(owner, i)` does part `i`
/// of them. Every part is run exactly once, by some member.
struct Job<'a> {
    parts: &'a (dyn Fn(usize) -> usize + Sync),
    run: &'a (dyn Fn(usize, usize) + Sync),
}

/// `state` packs the job number (high bits), whether the job is open to workers, and how many
/// workers are inside it (low bits). Packing them in one word is what lets a worker enter only
/// the job it saw open, and the caller close a job only when no worker is inside.
const OPEN: u64 = 1 << 23;
const INSIDE: u64 = OPEN - 1;
const ONE_JOB: u64 = 1 << 24;

/// An atomic on a cache line of its own, so that two members' counters do not share one.
#[repr(align(128))]
struct Padded(AtomicUsize);

struct Shared {
    size: usize,
    /// The current job, valid while `state` says it is open or a worker is inside it.
    job: AtomicPtr<Job<'static>>,
    state: AtomicU64,
    /// `next[m]`: the next of member `m`'s parts to be taken (by `m` or by another member).
    next: Box<[Padded]>,
    /// A member's part panicked (the caller panics in turn).
    panicked: AtomicBool,
    /// Workers sleeping, or about to (see `worker`).
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// The team (see the module's documentation).
pub struct Team {
    shared: Arc<Shared>,
    /// Held while a job runs: one job at a time (see the module's documentation for a caller
    /// that finds it held).
    one_job: Mutex<()>,
}

impl Team {
    /// The team of `size` members (the caller and `size - 1` workers), started on first use and
    /// kept for the life of the process.
    pub fn of_size(size: usize) -> &'static Team {
        static TEAMS: Mutex<Vec<&'static Team>> = Mutex::new(Vec::new());
        let mut teams = TEAMS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(team) = teams.iter().find(|t| t.shared.size == size) {
            return team;
        }
        let team: &'static Team = Box::leak(Box::new(Team::start(size.clamp(1, INSIDE as usize))));
        teams.push(team);
        team
    }

    /// The team of [`super::decode_threads`] members: as large as rayon's pool on this thread
    /// (which `--threads` sets), but no larger than the cores this process may run on.
    pub fn current() -> &'static Team {
        Team::of_size(super::decode_threads())
    }

    fn start(size: usize) -> Team {
        let shared = Arc::new(Shared {
            size,
            job: AtomicPtr::new(std::ptr::null_mut()),
            state: AtomicU64::new(0),
            next: (0..size).map(|_| Padded(AtomicUsize::new(0))).collect(),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        for member in 1..size {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("qwen3-team-{member}"))
                .spawn(move || worker(&shared, member))
                .expect("cannot start a thread of the decode team");
        }
        Team {
            shared,
            one_job: Mutex::new(()),
        }
    }

    /// Runs every part of `job` once, on whichever members get to it, and returns when all are
    /// done. A panic in any part is raised again here. A part must not start a job of its own
    /// (jobs do not nest).
    fn run(&self, job: &Job<'_>) {
        let s = &*self.shared;
        if s.size == 1 {
            return (0..(job.parts)(0)).for_each(|i| (job.run)(0, i));
        }
        let _one = match self.one_job.try_lock() {
            Ok(one) => one,
            Err(TryLockError::Poisoned(one)) => one.into_inner(),
            Err(TryLockError::WouldBlock) => return on_rayon(s.size, job),
        };
        for next in s.next.iter() {
            next.0.store(0, Ordering::Relaxed);
        }
        s.panicked.store(false, Ordering::Relaxed);
        // Open the job. Nobody is inside the last one (it was closed with no worker inside), so
        // a plain store is enough; its Release publishes the job and the counters above.
        //
        // Lifetime: `job` and what it borrows stay alive until this function returns. A worker
        // reads `s.job` only after entering the job (see `worker`), and the job is closed below
        // only when no worker is inside; after that, no worker can enter it (entering needs the
        // state this store writes, and the number in it changes with every job; it would take
        // 2^40 jobs while one worker is stopped between a load and the next instruction for the
        // number to come back). So erasing the lifetime never lets a worker see `job` dangle.
        let erased = (job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
        s.job.store(erased, Ordering::Relaxed);
        let number = (s.state.load(Ordering::Relaxed) & !(ONE_JOB - 1)).wrapping_add(ONE_JOB);
        s.state.store(number | OPEN, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _lock = s.sleep.lock().unwrap_or_else(PoisonError::into_inner);
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| take_parts(s, job, 0)));
        // Every part is taken; close the job once the workers inside have finished theirs. The
        // Acquire pairs with a worker's Release on leaving: its writes are visible after this.
        let mut wait = Wait::new();
        loop {
            let now = s.state.load(Ordering::Acquire);
            if now & INSIDE == 0
                && s.state
                    .compare_exchange_weak(now, now & !OPEN, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            wait.spin();
        }
        s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if let Err(panic) = mine {
            std::panic::resume_unwind(panic);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a thread of the decode team panicked");
        }
    }

    /// Cuts each of `outs` into parts (boundaries on multiples of `align` values, except the
    /// end) and runs `f(k, start, part, run_end)` once for every part `start .. start +
    /// part.len()` of `outs[k]`. Each member owns a contiguous run of every output's parts, and
    /// `run_end` is where the run holding this part ends: its owner does the values up to there
    /// next (a kernel may prefetch what they read, and should not read further ahead).
    pub fn split<const N: usize>(
        &self,
        outs: [&mut [f32]; N],
        align: usize,
        f: impl Fn(usize, usize, &mut [f32], usize) + Sync,
    ) {
        let size = self.shared.size;
        let lens = outs.each_ref().map(|o| o.len());
        let align = align.max(1);
        let part_len = lens.map(|len| {
            len.div_ceil(size * PARTS_PER_MEMBER)
                .next_multiple_of(align)
                .max(align)
        });
        // Output k has `count[k]` parts; member m owns parts `count[k] * m / size ..
        // count[k] * (m + 1) / size` of it, and numbers its parts of every output in turn.
        let count: [usize; N] = std::array::from_fn(|k| lens[k].div_ceil(part_len[k]));
        let owned = |k: usize, m: usize| count[k] * m / size..count[k] * (m + 1) / size;
        let ptrs = outs.map(|o| SendPtr(o.as_mut_ptr()));
        let parts = |m: usize| (0..N).map(|k| owned(k, m).len()).sum();
        let run = |m: usize, mut i: usize| {
            for k in 0..N {
                let mine = owned(k, m);
                if i < mine.len() {
                    let start = (mine.start + i) * part_len[k];
                    let end = (start + part_len[k]).min(lens[k]);
                    // SAFETY: `ptrs[k]` is `outs[k]`, borrowed mutably for this whole call, and
                    // `run` returns only when every part is done. Parts are runs of `part_len[k]`
                    // values with distinct indices, ending at most at `lens[k]`, and `run` does
                    // each (owner, index) once: each `&mut` covers values no other part touches.
                    let part = unsafe {
                        std::slice::from_raw_parts_mut(ptrs[k].0.add(start), end - start)
                    };
                    return f(k, start, part, (mine.end * part_len[k]).min(lens[k]));
                }
                i -= mine.len();
            }
        };
        self.run(&Job {
            parts: &parts,
            run: &run,
        });
    }
}

/// A job for a busy team: every part, each once, on rayon's loops (the pool of the calling
/// thread, or rayon's global pool). The parts are the team's, so the results are the same bits;
/// only the threads that run them differ.
fn on_rayon(size: usize, job: &Job<'_>) {
    use rayon::prelude::*;
    (0..size).into_par_iter().for_each(|owner| {
        (0..(job.parts)(owner))
            .into_par_iter()
            .for_each(|i| (job.run)(owner, i))
    });
}

/// Member `me` takes its own parts in order, then any part other members have not taken yet.
fn take_parts(s: &Shared, job: &Job<'_>, me: usize) {
    for owner in (me..s.size).chain(0..me) {
        let parts = (job.parts)(owner);
        loop {
            // Relaxed is enough: the counter only hands out distinct numbers; the parts' data
            // is published by the job's open and close.
            let i = s.next[owner].0.fetch_add(1, Ordering::Relaxed);
            if i >= parts {
                break;
            }
            (job.run)(owner, i);
        }
    }
}

/// A pointer to an output that the members write disjoint parts of (see [`Team::split`]).
struct SendPtr(*mut f32);
// SAFETY: the pointee is an `&mut [f32]` held by `split` until every part is done, and each part
// is written by one member only.
unsafe impl Sync for SendPtr {}

/// A worker: enters each job it sees open, takes parts until none is left, and leaves.
fn worker(s: &Shared, member: usize) {
    // The number of the last job this worker entered: it enters each job once.
    let mut last = 0;
    let mut wait = Wait::new();
    loop {
        let now = s.state.load(Ordering::Acquire);
        let number = now & !(ONE_JOB - 1);
        if now & OPEN != 0 && number != last {
            // Enter: count this worker inside, only if the state is still the one just read.
            if s.state
                .compare_exchange_weak(now, now + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            last = number;
            // SAFETY: this worker entered the job while it was open, and the caller does not
            // close it (nor return from `run`) while a worker is inside: the `Job` is alive
            // until the `fetch_sub` below.
            let job = unsafe { &*s.job.load(Ordering::Relaxed) };
            if catch_unwind(AssertUnwindSafe(|| take_parts(s, job, member))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
            s.state.fetch_sub(1, Ordering::Release);
            wait = Wait::new();
            continue;
        }
        if wait.spin() < SPIN {
            continue;
        }
        // Sleep until the job number moves. `sleepers` is raised before the state is read
        // again (both SeqCst), and the caller opens a job before it reads `sleepers`: either
        // the caller sees a sleeper and wakes it, or this thread sees the new number.
        let mut lock = s.sleep.lock().unwrap_or_else(PoisonError::into_inner);
        s.sleepers.fetch_add(1, Ordering::SeqCst);
        while s.state.load(Ordering::SeqCst) & !(ONE_JOB - 1) == number {
            lock = s.wake.wait(lock).unwrap_or_else(PoisonError::into_inner);
        }
        s.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(lock);
        wait = Wait::new();
    }
}

/// A busy wait that gives up its core once it has lasted [`YIELD_AFTER`]. A job's parts and the
/// gaps between jobs are a few microseconds, and spinning sees the end of one sooner than any
/// sleep. But when more threads are ready to run than there are cores (`--threads` above the
/// core count, or another busy process), a spinning thread can hold the core that the thread it
/// waits for needs. `yield_now` lets that thread run, and costs a system call when nothing else
/// is waiting.
struct Wait {
    since: Instant,
    spins: u32,
}

/// How long a wait spins before it starts to yield its core.
const YIELD_AFTER: Duration = Duration::from_micros(20);

impl Wait {
    fn new() -> Wait {
        Wait {
            since: Instant::now(),
            spins: 0,
        }
    }

    /// One round of waiting; returns how long the wait has lasted (read every 64 rounds, else
    /// zero).
    fn spin(&mut self) -> Duration {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(64) {
            std::hint::spin_loop();
            return Duration::ZERO;
        }
        let waited = self.since.elapsed();
        if waited < YIELD_AFTER {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
        waited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until `flag` is set, or 5 s have passed (the test's assertions then fail).
    /// A team of the tests' own: the shared teams ([`Team::of_size`]) serve the other tests
    /// running meanwhile, and a job that finds its team busy runs on rayon's threads instead
    /// (`on_rayon`), where a test of the team's own threads would see none of them.
    fn own_team(size: usize) -> &'static Team {
        Box::leak(Box::new(Team::start(size)))
    }

    fn wait_for(flag: &AtomicBool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn split_covers_every_value_once() {
        for size in [1, 2, 3] {
            let team = own_team(size);
            for (len_a, len_b, align) in [
                (0, 5, 16),
                (1, 1, 16),
                (100, 1000, 16),
                (4096, 96, 256),
                (151936, 1024, 16),
            ] {
                for _ in 0..50 {
                    let (mut a, mut b) = (vec![0f32; len_a], vec![0f32; len_b]);
                    team.split([&mut a, &mut b], align, |k, start, part, run_end| {
                        assert!(start % align == 0, "part starts at {start}");
                        let len = [len_a, len_b][k];
                        assert!(start + part.len() <= run_end && run_end <= len);
                        for (i, v) in part.iter_mut().enumerate() {
                            *v += (k * 1000000 + start + i) as f32 + 1.0;
                        }
                    });
                    for (i, v) in a.iter().enumerate() {
                        assert_eq!(*v, i as f32 + 1.0, "size {size} a[{i}]");
                    }
                    for (i, v) in b.iter().enumerate() {
                        assert_eq!(*v, (1000000 + i) as f32 + 1.0, "size {size} b[{i}]");
                    }
                }
            }
        }
    }

    #[test]
    fn a_stalled_worker_does_not_stall_the_job() {
        // The worker stops for 300 ms in the first part it takes. The caller waits for it to
        // have taken one (so that the worker does enter the job), then takes every other part,
        // its own and the worker's: the worker ends up with that one part only.
        let team = own_team(2);
        let mut out = vec![0f32; 1024];
        let by_caller = AtomicUsize::new(0);
        let stalled = AtomicBool::new(false);
        let caller = thread::current().id();
        team.split([&mut out], 16, |_, _, part, _| {
            if thread::current().id() == caller {
                wait_for(&stalled);
                by_caller.fetch_add(part.len(), Ordering::Relaxed);
            } else if !stalled.swap(true, Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(300));
            }
            part.fill(1.0);
        });
        assert!(out.iter().all(|&v| v == 1.0));
        assert!(
            stalled.load(Ordering::Relaxed),
            "the worker never took a part"
        );
        // 1024 values in parts of 1024 / (2 * PARTS_PER_MEMBER) (a multiple of 16).
        let part = 1024 / (2 * PARTS_PER_MEMBER);
        assert_eq!(by_caller.load(Ordering::Relaxed), 1024 - part);
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller() {
        let team = own_team(2);
        let caller = thread::current().id();
        let r = catch_unwind(AssertUnwindSafe(|| {
            // The caller's parts wait until the worker has panicked, so the worker does take
            // one of them.
            let failed = AtomicBool::new(false);
            let mut out = vec![0f32; 1024];
            team.split([&mut out], 16, |_, _, _, _| {
                if thread::current().id() != caller {
                    failed.store(true, Ordering::Relaxed);
                    panic!("worker's part fails");
                }
                wait_for(&failed);
            });
        }));
        assert!(r.is_err());
        // The team still works afterwards.
        let mut out = vec![0f32; 100];
        team.split([&mut out], 1, |_, _, part, _| part.fill(2.0));
        assert!(out.iter().all(|&v| v == 2.0));
    }

    #[test]
    fn a_busy_team_is_not_waited_for() {
        // Each value records the part that wrote it (its start and the end of its owner's
        // run), so the two runs below agree only if they cut the job into the same parts.
        let team = own_team(2);
        let job = |out: &mut Vec<f32>| {
            team.split([out], 16, |_, start, part, run_end| {
                part.fill((start * 10_000 + run_end) as f32)
            })
        };
        let mut free = vec![f32::NAN; 1000];
        job(&mut free);
        // Busy with another caller's job (its lock held here) for the rest of the test: a job
        // from another thread must still end, with every part done once as above.
        let _busy = team.one_job.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, finished) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let mut out = vec![f32::NAN; 1000];
            job(&mut out);
            done.send(out).unwrap();
        });
        let busy = finished
            .recv_timeout(Duration::from_secs(10))
            .expect("a job waited for the busy team");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&busy), bits(&free));
    }

    #[test]
    fn workers_wake_from_sleep() {
        let team = own_team(2);
        let caller = thread::current().id();
        for _ in 0..3 {
            std::thread::sleep(SPIN * 5);
            // The caller's parts wait until a worker has done one, so a worker must wake.
            let woke = AtomicBool::new(false);
            let mut out = vec![0f32; 1024];
            team.split([&mut out], 16, |_, _, part, _| {
                if thread::current().id() != caller {
                    woke.store(true, Ordering::Relaxed);
                } else {
                    wait_for(&woke);
                }
                part.fill(3.0);
            });
            assert!(woke.load(Ordering::Relaxed), "no worker woke within 5 s");
            assert!(out.iter().all(|&v| v == 3.0));
        }
    }
}
