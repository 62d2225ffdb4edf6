//! A file truncated while it is memory-mapped: a clean, named error instead of a bare SIGBUS.
//!
//! Reading a page of a map past the file's current end raises SIGBUS, whose default action
//! kills the process with no message ("Bus error", exit status 135). That happens when a model
//! is truncated or rewritten in place (`cp new.gguf model.gguf` truncates first) while `pn run`
//! or `pn serve` has it mapped. Every tensor read would need a check to catch it otherwise, so
//! the one place is the signal: [`install_sigbus_report`] installs a handler that looks the
//! faulting address up in the maps registered here ([`MapWatch`], held by every mapped
//! [`GgufFile`](crate::GgufFile) and checkpoint shard), writes
//! `error: <file> changed while in use ...` to stderr and exits with [`EXIT_FILE_CHANGED`].
//! A fault outside every registered map restores the default action and re-faults, so other
//! bus errors still dump core as before.
//!
//! The handler is opt-in (a library should not take a process-wide signal without being
//! asked): the `pn` program installs it at start. Only async-signal-safe calls run in it:
//! atomic loads, `write(2)` and `_exit(2)`.
//!
//! A file rewritten in place at the same length raises no fault: the map then shows the new
//! bytes. [`MapWatch::changed`] compares the open file's length and modification time with the
//! values at open, for callers that check between requests; `--no-mmap` (reading the file into
//! memory) is immune to both.

use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The exit status after a mapped file changed under the process (`EX_IOERR` of sysexits.h:
/// an input/output error, not a crash).
pub const EXIT_FILE_CHANGED: i32 = 74;

/// Most maps watched at once (a model, its MTP draft, checkpoint shards); later ones are still
/// mapped, only unwatched.
const SLOTS: usize = 256;

/// One watched range: `start..start + len` of the address space, and the file's path as a
/// leaked, NUL-free byte string (`path`, `path_len`), kept until the slot is reused.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            path: AtomicPtr::new(std::ptr::null_mut()),
            path_len: AtomicUsize::new(0),
        }
    }
}

static WATCHED: [Slot; SLOTS] = [const { Slot::empty() }; SLOTS];

/// Registration of one mapped file, undone on drop.
#[derive(Debug)]
pub struct MapWatch {
    slot: Option<usize>,
    /// The open file, for [`MapWatch::changed`].
    file: Option<std::fs::File>,
    /// Length and modification time at open.
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl MapWatch {
    /// Watches `bytes` (a map of `file` at `path`): a bus error inside it reports `path`.
    pub fn new(bytes: &[u8], file: &std::fs::File, path: &Path) -> MapWatch {
        let meta = file.metadata().ok();
        let slot = register(bytes, path);
        MapWatch {
            slot,
            file: file.try_clone().ok(),
            len: meta.as_ref().map_or(0, |m| m.len()),
            modified: meta.and_then(|m| m.modified().ok()),
        }
    }

    /// `Some(reason)` when the file's length or modification time is no longer what it was at
    /// open (it was truncated, grown or rewritten in place: the mapped bytes are not the ones
    /// validated); `None` while it is unchanged. A file replaced by renaming another over its
    /// path is unchanged: the map keeps the old file.
    pub fn changed(&self) -> Option<String> {
        let meta = self.file.as_ref()?.metadata().ok()?;
        if meta.len() != self.len {
            return Some(format!(
                "its length changed from {} to {} bytes",
                self.len,
                meta.len()
            ));
        }
        if meta.modified().ok() != self.modified {
            return Some("it was rewritten (its modification time changed)".into());
        }
        None
    }
}

impl Drop for MapWatch {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            // Clear the range first: the handler never matches a slot being torn down. The
            // path's bytes stay allocated until the slot is reused (a handler running on
            // another thread may still be reading them).
            WATCHED[i].len.store(0, Ordering::SeqCst);
            WATCHED[i].start.store(0, Ordering::SeqCst);
        }
    }
}

fn register(bytes: &[u8], path: &Path) -> Option<usize> {
    if bytes.is_empty() {
        return None;
    }
    let text = path.to_string_lossy().replace('\0', "?");
    for (i, s) in WATCHED.iter().enumerate() {
        // Claim a free slot: start 0 -> 1 marks it taken while it is filled in (len stays 0,
        // so the handler cannot match it yet).
        if s.start
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            continue;
        }
        let old = s.path.load(Ordering::SeqCst);
        let old_len = s.path_len.load(Ordering::SeqCst);
        let leaked: &'static mut [u8] = Box::leak(text.into_bytes().into_boxed_slice());
        s.path_len.store(leaked.len(), Ordering::SeqCst);
        s.path.store(leaked.as_mut_ptr(), Ordering::SeqCst);
        if !old.is_null() {
            // SAFETY: `old`/`old_len` are a slice leaked by an earlier registration of this
            // slot, whose range was cleared when it was dropped; no handler can match it now.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(old, old_len)) });
        }
        s.start.store(bytes.as_ptr() as usize, Ordering::SeqCst);
        s.len.store(bytes.len(), Ordering::SeqCst);
        return Some(i);
    }
    None
}

/// Installs the SIGBUS handler described in the [module docs](self). Idempotent; a no-op on
/// platforms without POSIX signals.
pub fn install_sigbus_report() {
    #[cfg(unix)]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: a zeroed sigaction with a valid handler and an empty mask is a valid
            // argument; the handler only makes async-signal-safe calls.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_sigbus as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
            }
        });
    }
}

#[cfg(unix)]
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &WATCHED {
        let start = s.start.load(Ordering::SeqCst);
        let len = s.len.load(Ordering::SeqCst);
        if len == 0 || addr < start || addr - start >= len {
            continue;
        }
        let path = s.path.load(Ordering::SeqCst);
        let path_len = s.path_len.load(Ordering::SeqCst);
        let mut msg = Msg::default();
        msg.push(b"error: ");
        // SAFETY: the slot's path is a live leaked slice of `path_len` bytes (see register).
        msg.push(unsafe { std::slice::from_raw_parts(path, path_len) });
        msg.push(b" changed while in use: reading byte ");
        msg.push_num(addr - start);
        msg.push(b" of its ");
        msg.push_num(len);
        msg.push(
            b"-byte map failed (the file was truncated or rewritten in place). Replace model \
files by renaming a new file over the old one, or run with --no-mmap.\n",
        );
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, msg.buf.as_ptr().cast(), msg.n);
            libc::_exit(EXIT_FILE_CHANGED);
        }
    }
    // Not one of ours: the default action (core dump) when the faulting access is retried.
    // SAFETY: resetting a disposition is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

/// A fixed buffer for the handler's message (no allocation in a signal handler).
#[cfg(unix)]
struct Msg {
    buf: [u8; 4096],
    n: usize,
}

#[cfg(unix)]
impl Default for Msg {
    fn default() -> Self {
        Msg {
            buf: [0; 4096],
            n: 0,
        }
    }
}

#[cfg(unix)]
impl Msg {
    fn push(&mut self, b: &[u8]) {
        let room = self.buf.len() - self.n;
        let k = b.len().min(room);
        self.buf[self.n..self.n + k].copy_from_slice(&b[..k]);
        self.n += k;
    }

    fn push_num(&mut self, mut v: usize) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_registers_and_unregisters_its_range() {
        let dir = std::env::temp_dir().join(format!("mapwatch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.bin");
        std::fs::write(&p, [1u8; 64]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let bytes = vec![0u8; 64];
        let w = MapWatch::new(&bytes, &f, &p);
        let i = w.slot.expect("a free slot");
        assert_eq!(
            WATCHED[i].start.load(Ordering::SeqCst),
            bytes.as_ptr() as usize
        );
        assert_eq!(WATCHED[i].len.load(Ordering::SeqCst), 64);
        assert_eq!(w.changed(), None);
        std::fs::write(&p, [1u8; 32]).unwrap();
        assert!(
            w.changed().unwrap().contains("from 64 to 32"),
            "{:?}",
            w.changed()
        );
        drop(w);
        assert_eq!(WATCHED[i].len.load(Ordering::SeqCst), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn numbers_format_in_the_handler_buffer() {
        let mut m = Msg::default();
        m.push_num(0);
        m.push(b" ");
        m.push_num(1234567);
        assert_eq!(&m.buf[..m.n], b"0 1234567");
    }
}
