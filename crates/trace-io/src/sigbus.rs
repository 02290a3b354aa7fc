//! A clear message instead of a silent crash when a mapped trace shrinks under the reader.
//!
//! Reading a page of a memory-mapped file beyond its current end raises SIGBUS, which kills the
//! process without a word. While a trace is mapped, its address range and a preformatted message
//! naming the file sit in a fixed table of slots; a SIGBUS handler looks the faulting address up
//! there and, when it falls inside a mapped trace, writes the message to stderr with `write(2)`
//! and ends the process with `_exit(1)` (both async-signal-safe; the handler allocates nothing and
//! takes no lock). A fault outside every registered trace goes to the previous handler (Rust's
//! stack-overflow reporter, or the default action).

#![expect(unsafe_code, reason = "the SIGBUS handler guarding the mapped traces of file.rs")]

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// Traces mapped at once that get the message (further ones keep the default behaviour).
const SLOTS: usize = 64;

/// One mapped trace: its address range and message. `start == 0` means free for the handler.
struct Slot {
    used: AtomicBool,
    start: AtomicUsize,
    len: AtomicUsize,
    msg: AtomicPtr<u8>,
    msg_len: AtomicUsize,
}

#[expect(clippy::declare_interior_mutable_const, reason = "the initializer of the static table")]
const FREE: Slot = Slot {
    used: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    msg: AtomicPtr::new(std::ptr::null_mut()),
    msg_len: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// The disposition of SIGBUS before ours, restored for a fault that is not in a mapped trace.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered mapping; unregisters it when dropped (before the mapping is unmapped).
pub(crate) struct Guard {
    slot: usize,
}

/// The message written when the mapping of `path` faults.
fn message(path: &Path) -> Box<[u8]> {
    format!(
        "error: {}: the trace file changed or was truncated while in use (moe-offload reads traces through a memory \
         map: do not modify, truncate or rewrite a trace in place while a command reads it; replace it by renaming \
         a new file over it)\n",
        path.display()
    )
    .into_bytes()
    .into_boxed_slice()
}

/// Registers the mapped bytes `range` of the trace at `path`. `None` when every slot is taken
/// (that mapping then has no message) or the handler cannot be installed.
pub(crate) fn register(range: &[u8], path: &Path) -> Option<Guard> {
    if range.is_empty() || !install() {
        return None;
    }
    let slot =
        TABLE.iter().position(|s| s.used.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok())?;
    let s = &TABLE[slot];
    let msg = Box::into_raw(message(path));
    s.msg_len.store(msg.len(), Ordering::Release);
    s.msg.store(msg.cast::<u8>(), Ordering::Release);
    s.len.store(range.len(), Ordering::Release);
    s.start.store(range.as_ptr() as usize, Ordering::Release);
    Some(Guard { slot })
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        s.start.store(0, Ordering::Release);
        s.len.store(0, Ordering::Release);
        let len = s.msg_len.swap(0, Ordering::AcqRel);
        let msg = s.msg.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !msg.is_null() {
            // SAFETY: `msg` and `len` come from the `Box::into_raw` of `register` for this slot and
            // are taken out of the slot exactly once (swapped to null). The handler only reads the
            // message of a slot whose mapping is live, and this mapping is being dropped.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(msg, len)) });
        }
        s.used.store(false, Ordering::Release);
    }
}

/// Installs the handler once; whether it is installed.
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: a zeroed `sigaction` is a valid value of the C struct (no handler, empty flags);
        // the fields set below give it our handler. `sigaction(2)` only reads `new` and writes
        // `old`, both valid for the call.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&raw mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &raw const new, &raw mut old) != 0 {
                return false;
            }
            let _ = PREVIOUS.set(old);
        }
        true
    })
}

/// The SIGBUS handler: the message of the mapped trace holding the faulting address, or the
/// previous disposition.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler; for SIGBUS,
    // `si_addr` is the faulting address.
    let addr = unsafe { fault_address(info) };
    for s in &TABLE {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        if start != 0 && addr >= start && addr - start < len {
            let msg = s.msg.load(Ordering::Acquire);
            let n = s.msg_len.load(Ordering::Acquire);
            // SAFETY: `msg` points to the live `n`-byte message of this slot (freed only after
            // the slot is cleared, when its mapping is dropped); `write(2)` and `_exit(2)` are
            // async-signal-safe.
            unsafe {
                if !msg.is_null() {
                    let _ = libc::write(2, msg.cast(), n);
                }
                libc::_exit(1);
            }
        }
    }
    // Not ours: put the previous disposition back and return; the faulting access repeats and
    // meets it (the default action terminates the process).
    // SAFETY: `sigaction(2)` is async-signal-safe; the stored value came from the kernel.
    unsafe {
        match PREVIOUS.get() {
            Some(prev) => libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut()),
            None => {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &raw const dfl, std::ptr::null_mut())
            }
        };
    }
}

/// The faulting address of a SIGBUS.
///
/// # Safety
/// `info` must be the `siginfo_t` the kernel passed to the handler.
#[cfg(any(target_os = "linux", target_os = "android"))]
unsafe fn fault_address(info: *mut libc::siginfo_t) -> usize {
    // SAFETY: guaranteed by the caller.
    unsafe { (*info).si_addr() as usize }
}

/// The faulting address of a SIGBUS.
///
/// # Safety
/// `info` must be the `siginfo_t` the kernel passed to the handler.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
unsafe fn fault_address(info: *mut libc::siginfo_t) -> usize {
    // SAFETY: guaranteed by the caller.
    unsafe { (*info).si_addr as usize }
}
