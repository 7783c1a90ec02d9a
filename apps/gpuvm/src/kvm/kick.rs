//! Kicking a vCPU out of `KVM_RUN` when its time is up, so that `--timeout` also stops a guest
//! that spins without ever exiting, and a VM can be stopped when it has not exited for a
//! while (a stall timeout: a wedged guest).
//!
//! The VMM's run loop checks its deadline only when `KVM_RUN` returns. A guest spinning in a
//! loop with no port I/O, MMIO or fault never returns to it, so each VM thread arms a
//! [`Kicker`]: a timer thread that, at the deadline (or `stall` after the last exit the VM
//! thread reported with [`Kicker::exited`]), sends the VM thread a real-time signal
//! ([`kick_signal`], `SIGRTMIN + 2`; Cloud Hypervisor and Firecracker kick vCPUs the same way).
//! The signal's handler sets `immediate_exit` in the thread's `kvm_run` structure (KVM's API for
//! this, `Documentation/virt/kvm/api.rst`): a signal that arrives while the vCPU runs makes
//! `KVM_RUN` return `EINTR`; one that arrives just before `KVM_RUN` is entered makes it return
//! `EINTR` at once instead of being lost. The timer re-sends the signal every 50 ms until the VM
//! thread disarms it. The run loop then sees its deadline passed and stops the VM.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    /// The `kvm_run` structure of the vCPU this thread runs (null: none).
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal that kicks a vCPU thread.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN() + 2
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let p = KVM_RUN.with(Cell::get);
    if !p.is_null() {
        // SAFETY: `p` is the mmap'ed `kvm_run` of the vCPU this thread owns, registered by
        // `Kicker::arm` and cleared by `Kicker::drop` before the vCPU is closed; KVM reads
        // `immediate_exit` on entry to `KVM_RUN`. A volatile byte store is async-signal-safe.
        unsafe { std::ptr::addr_of_mut!((*p).immediate_exit).write_volatile(1) };
    }
}

fn install_handler() -> anyhow::Result<()> {
    static ONCE: Once = Once::new();
    let mut r = Ok(());
    ONCE.call_once(|| {
        r = register_signal_handler(kick_signal(), on_kick)
            .map_err(|e| anyhow::anyhow!("registering the vCPU kick signal handler: {e}"));
    });
    r
}

/// Shared between the VM thread and its timer.
struct State {
    done: Mutex<bool>,
    cv: Condvar,
    fired: AtomicBool,
    /// The last exit, ns after `base`.
    last_exit_ns: AtomicU64,
    base: Instant,
}

impl State {
    fn last_exit(&self) -> Instant {
        self.base + Duration::from_nanos(self.last_exit_ns.load(Ordering::SeqCst))
    }
}

/// A timer that kicks this thread's vCPU out of `KVM_RUN` at a deadline (see the module doc).
/// Dropping it disarms the timer and unregisters the vCPU.
pub struct Kicker {
    state: Arc<State>,
    timer: Option<std::thread::JoinHandle<()>>,
}

impl Kicker {
    /// Arms the timer for `vcpu`, which this thread runs, to fire at `deadline` or when the
    /// vCPU has not exited for `stall`.
    pub fn arm(
        vcpu: &mut VcpuFd,
        deadline: Instant,
        stall: Option<Duration>,
    ) -> anyhow::Result<Kicker> {
        install_handler()?;
        let run: *mut kvm_run = vcpu.get_kvm_run();
        KVM_RUN.with(|c| c.set(run));
        // SAFETY: pthread_self has no preconditions.
        let target = unsafe { libc::pthread_self() };
        let state = Arc::new(State {
            done: Mutex::new(false),
            cv: Condvar::new(),
            fired: AtomicBool::new(false),
            last_exit_ns: AtomicU64::new(0),
            base: Instant::now(),
        });
        let st = state.clone();
        let timer = std::thread::Builder::new()
            .name("vcpu-kick".into())
            .spawn(move || {
                let mut done = st.done.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if *done {
                        return;
                    }
                    let now = Instant::now();
                    let due = match stall {
                        Some(s) => deadline.min(st.last_exit() + s),
                        None => deadline,
                    };
                    let wait = if st.fired.load(Ordering::SeqCst) || now >= due {
                        st.fired.store(true, Ordering::SeqCst);
                        // SAFETY: `target` is the VM thread, alive until it has disarmed this
                        // timer (it joins the timer in `Drop` after setting `done`, which
                        // cannot happen while this thread holds the lock).
                        unsafe { libc::pthread_kill(target, kick_signal()) };
                        Duration::from_millis(50)
                    } else {
                        due - now
                    };
                    done = st
                        .cv
                        .wait_timeout(done, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            })?;
        Ok(Kicker {
            state,
            timer: Some(timer),
        })
    }

    /// True once the timer has kicked the vCPU.
    pub fn fired(&self) -> bool {
        self.state.fired.load(Ordering::SeqCst)
    }

    /// The vCPU exited (call after every `KVM_RUN`).
    pub fn exited(&self) {
        let ns = self.state.base.elapsed().as_nanos() as u64;
        self.state.last_exit_ns.store(ns, Ordering::SeqCst);
    }

    /// How long since the last reported exit.
    pub fn since_exit(&self) -> Duration {
        self.state.last_exit().elapsed()
    }
}

impl Drop for Kicker {
    fn drop(&mut self) {
        *self.state.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.state.cv.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
    }
}
