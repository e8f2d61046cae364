//! A sequence lock over a few `u64` words: one writer at a time, readers
//! that never block and never write shared memory.
//!
//! The writer makes the generation odd, writes the words, and makes it even
//! again; a reader that saw the same even generation before and after its
//! reads has a consistent copy. A reader that races a write gets nothing
//! and decides for itself what to do instead.

use std::sync::atomic::{AtomicU64, Ordering, fence};

#[derive(Debug)]
pub(crate) struct SeqLock<const N: usize> {
    /// Odd while a write is in progress; 0 until the first write.
    generation: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> Default for SeqLock<N> {
    fn default() -> Self {
        SeqLock {
            generation: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl<const N: usize> SeqLock<N> {
    /// Only one writer at a time (the caller serialises).
    pub(crate) fn write(&self, words: [u64; N]) {
        let start = self.generation.load(Ordering::Relaxed);
        self.generation
            .store(start.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (cell, word) in self.words.iter().zip(words) {
            cell.store(word, Ordering::Relaxed);
        }
        self.generation
            .store(start.wrapping_add(2), Ordering::Release);
    }

    /// The generation and a consistent copy of the words, or `None` if a
    /// write was in progress. Generation 0 means never written (the words
    /// are then all 0); every write changes it.
    #[inline]
    pub(crate) fn read(&self) -> Option<(u64, [u64; N])> {
        let before = self.generation.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        if before == 0 {
            return Some((0, [0; N]));
        }
        let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if self.generation.load(Ordering::Relaxed) != before {
            return None;
        }
        Some((before, words))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;

    use super::*;

    #[test]
    fn reads_back_the_last_write() {
        let lock = SeqLock::<3>::default();
        assert_eq!(lock.read(), Some((0, [0, 0, 0])));
        lock.write([1, 2, 3]);
        let (first, words) = lock.read().unwrap();
        assert_eq!(words, [1, 2, 3]);
        assert!(first > 0 && first % 2 == 0);
        lock.write([1, 2, 3]);
        assert_ne!(lock.read().unwrap().0, first, "same words, new generation");
    }

    #[test]
    fn a_reader_never_sees_a_torn_write() {
        let lock = Arc::new(SeqLock::<4>::default());
        let writer = {
            let lock = Arc::clone(&lock);
            thread::spawn(move || {
                for n in 1..=20_000u64 {
                    lock.write([n; 4]);
                }
            })
        };
        loop {
            if let Some((_, words)) = lock.read() {
                assert!(words.iter().all(|&w| w == words[0]), "torn: {words:?}");
                if words[0] == 20_000 {
                    break;
                }
            }
        }
        writer.join().unwrap();
    }
}
