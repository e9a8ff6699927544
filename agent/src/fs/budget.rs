//! The agent's memory for the large buffers of fs calls (a file `fs::sed` holds while it
//! rewrites it, a file `fs::grep` searches as one buffer): one budget for the whole process,
//! so concurrent calls cannot add up past it. The agent shares the sandbox's memory limit
//! with the guest's programs; its own use stays small whatever the calls ask.
//!
//! `fs::sed` waits for room (within its call's deadline); `fs::grep` searches line by line
//! instead, which needs no large buffer.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::call::Cancel;

/// Bytes of large buffers all fs calls together may hold.
pub const BUDGET_BYTES: usize = 64 * 1024 * 1024;

struct Budget {
    used: Mutex<usize>,
    freed: Condvar,
}

static BUDGET: Budget = Budget {
    used: Mutex::new(0),
    freed: Condvar::new(),
};

fn used() -> MutexGuard<'static, usize> {
    BUDGET.used.lock().unwrap_or_else(|p| p.into_inner())
}

/// Room for `bytes`, given back when dropped.
#[derive(Debug)]
pub struct Grant(usize);

impl Drop for Grant {
    fn drop(&mut self) {
        if self.0 > 0 {
            *used() -= self.0;
            BUDGET.freed.notify_all();
        }
    }
}

/// Makes glibc's allocator give large buffers back when they are freed. By default it raises
/// its mmap threshold after the first large free (up to 32 MiB) and from then on serves such
/// buffers from per-thread arenas, which keep the memory: with fs calls on many threads the
/// agent's resident size grew to twice the budget (measured: 126 MiB for six concurrent
/// greps over 12 MiB files). A fixed threshold keeps every buffer over it in a mapping of its
/// own, unmapped at free; fewer arenas keep the small allocations together.
pub fn settle_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters; it is called before the
    // agent starts any thread, and is thread-safe in glibc regardless.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1024 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Room for `bytes` now, or `None` (more than the whole budget never fits).
pub fn try_take(bytes: usize) -> Option<Grant> {
    let mut used = used();
    if bytes > BUDGET_BYTES - *used {
        return None;
    }
    *used += bytes;
    Some(Grant(bytes))
}

/// Room for `bytes`, waiting while other calls hold the budget; `None` when `cancel` says
/// the call is over, or when `bytes` exceeds the whole budget.
pub fn take(bytes: usize, cancel: &Cancel) -> Option<Grant> {
    if bytes > BUDGET_BYTES {
        return None;
    }
    let mut used = used();
    loop {
        if bytes <= BUDGET_BYTES - *used {
            *used += bytes;
            return Some(Grant(bytes));
        }
        if cancel.is_cancelled() {
            return None;
        }
        // Woken by a release; the timeout only notices a cancelled call.
        used = BUDGET
            .freed
            .wait_timeout(used, Duration::from_millis(100))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_add_up_to_the_budget_and_come_back_when_dropped() {
        // Other tests of the process take grants too: only what this test adds is checked.
        let half = BUDGET_BYTES / 2;
        assert!(try_take(BUDGET_BYTES + 1).is_none());
        assert!(take(BUDGET_BYTES + 1, &Cancel::never()).is_none());
        let first = take(half, &Cancel::never()).expect("room");
        let waiter = std::thread::spawn(move || take(BUDGET_BYTES, &Cancel::never()).is_some());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "waits while the budget is held");
        drop(first);
        assert!(waiter.join().unwrap(), "gets the room once given back");
        assert!(try_take(half).is_some());
    }
}
