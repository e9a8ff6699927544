//! A sandbox's share of the host's open-file table (`fs.file-max`), sized so that
//! `max_concurrent_sandboxes` sandboxes at their share together still leave a reserve: the
//! host refuses a new file to every process without CAP_SYS_ADMIN once `fs.file-max` are
//! open host-wide. Pure arithmetic, shared by the backends that apply it their own way.

/// The host's limit on open files, host-wide.
pub const FILE_MAX: &str = "/proc/sys/fs/file-max";

/// An adapter that cannot raise `fs.file-max` keeps this fraction of it for the host.
pub const HOST_FILE_RESERVE_SHARES: u64 = 2;

/// `limit` with 1/`shares` of it kept (rounded up), the rest divided among `cap` sandboxes:
/// (kept, each sandbox's).
pub fn kept_and_each(limit: u64, shares: u64, cap: u64) -> (u64, u64) {
    let reserve = limit.div_ceil(shares.max(1));
    (reserve, (limit - reserve) / cap.max(1))
}

/// `fs.file-max` now; none where it cannot be read.
pub fn read_file_max() -> Option<u64> {
    std::fs::read_to_string(FILE_MAX).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_is_kept_and_the_rest_divided() {
        assert_eq!(kept_and_each(2_470_000, 2, 32), (1_235_000, 38_593));
        // An odd limit keeps the larger half; a cap of 0 counts as one.
        assert_eq!(kept_and_each(9, 2, 0), (5, 4));
        assert_eq!(kept_and_each(0, 2, 32), (0, 0));
        assert_eq!(kept_and_each(100, 4, 3), (25, 25));
    }
}
