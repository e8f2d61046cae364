//! The process's limit on open file descriptors, for the tests that change
//! it (each in a test binary of its own, as the limit is the process's).

/// The soft limit lowered for a test's span, restored when dropped.
pub struct DescriptorLimit(libc::rlimit);

impl DescriptorLimit {
    pub fn lower_to(soft: u64) -> Self {
        let old = Self::read();
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        // SAFETY: a plain call on a valid rlimit value.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) }, 0);
        Self(old)
    }

    pub fn soft() -> u64 {
        Self::read().rlim_cur
    }

    pub fn hard() -> u64 {
        Self::read().rlim_max
    }

    fn read() -> libc::rlimit {
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a plain call on a valid rlimit value.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        now
    }
}

impl Drop for DescriptorLimit {
    fn drop(&mut self) {
        // SAFETY: restores the value read before.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

/// Descriptors the process has open.
pub fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}
