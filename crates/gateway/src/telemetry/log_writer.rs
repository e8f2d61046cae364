//! Where log lines go: a buffer that a writer thread empties to stderr in
//! batches.
//!
//! The access log is a line per request, written from the data plane's
//! threads. Writing each line itself would cost a request a `write(2)`;
//! handing each line to a writer thread through a channel costs an
//! allocation per line and, whenever the writer is waiting — at moderate
//! rates, for every line — a futex wake-up and a context switch. Here a line is copied into a shared buffer under a lock;
//! only the first line into an empty buffer wakes the writer, which then
//! lets lines gather for [`BATCH_DELAY`] before writing them all at once.
//!
//! Not lossy: when the buffer holds [`CAPACITY`] bytes (stderr slower than
//! the lines coming in), writers wait for it to drain rather than drop
//! lines. Dropping the [`LogWriterGuard`] writes out everything buffered.

use std::io::Write;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tracing_subscriber::fmt::MakeWriter;

/// How long the writer lets lines gather after the first one: the most a
/// line waits before it is written.
pub const BATCH_DELAY: Duration = Duration::from_millis(10);
/// Bytes buffered before writers wait for the writer thread.
pub const CAPACITY: usize = 1 << 20;

/// The writing end, for `tracing_subscriber::fmt` layers.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Writes out what is buffered and stops the writer thread when dropped.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogWriterGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    buffer: Mutex<Buffer>,
    /// Signalled when the buffer stops being empty, and on close.
    filled: Condvar,
    /// Signalled when the writer has taken the buffer.
    drained: Condvar,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    closed: bool,
}

/// A writer thread writing to `sink`, and the handle lines are written to.
pub fn batch_writer<W: Write + Send + 'static>(
    sink: W,
) -> std::io::Result<(BatchWriter, LogWriterGuard)> {
    let shared = Arc::new(Shared {
        buffer: Mutex::new(Buffer::default()),
        filled: Condvar::new(),
        drained: Condvar::new(),
    });
    let thread = std::thread::Builder::new()
        .name("infergate-log".into())
        .spawn({
            let shared = Arc::clone(&shared);
            move || write_batches(&shared, sink)
        })?;
    Ok((
        BatchWriter {
            shared: Arc::clone(&shared),
        },
        LogWriterGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

fn write_batches<W: Write>(shared: &Shared, mut sink: W) {
    let mut batch = Vec::new();
    loop {
        let mut buffer = shared.buffer.lock();
        while buffer.bytes.is_empty() && !buffer.closed {
            shared.filled.wait(&mut buffer);
        }
        if !buffer.closed {
            // Let more lines gather: one write, and one wake-up, for all.
            shared
                .filled
                .wait_while_for(&mut buffer, |b| !b.closed, BATCH_DELAY);
        }
        let closed = buffer.closed;
        std::mem::swap(&mut batch, &mut buffer.bytes);
        drop(buffer);
        shared.drained.notify_all();
        // Nowhere to report a failing stderr; the lines are dropped.
        let _ = sink.write_all(&batch).and_then(|()| sink.flush());
        batch.clear();
        if closed && shared.buffer.lock().bytes.is_empty() {
            return;
        }
    }
}

impl Write for &BatchWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let shared = &self.shared;
        let mut buffer = shared.buffer.lock();
        while buffer.bytes.len() >= CAPACITY && !buffer.closed {
            shared.drained.wait(&mut buffer);
        }
        let was_empty = buffer.bytes.is_empty();
        buffer.bytes.extend_from_slice(line);
        drop(buffer);
        if was_empty {
            shared.filled.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
    type Writer = &'a BatchWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for LogWriterGuard {
    fn drop(&mut self) {
        self.shared.buffer.lock().closed = true;
        self.shared.filled.notify_one();
        self.shared.drained.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that records each write it gets.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_written_in_order_and_in_batches() {
        let sink = Sink::default();
        let (writer, guard) = batch_writer(sink.clone()).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        (&writer)
                            .write_all(format!("t{t} line {i}\n").as_bytes())
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let writes = sink.0.lock();
        let text = String::from_utf8(writes.concat()).unwrap();
        // Every line, whole, and each thread's lines in the order written.
        assert_eq!(text.lines().count(), 2000);
        for t in 0..4 {
            let prefix = format!("t{t} line ");
            let mine: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&prefix))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..500).collect::<Vec<_>>());
        }
        // Far fewer writes than lines.
        assert!(writes.len() < 200, "{} writes", writes.len());
    }

    #[test]
    fn a_line_is_written_without_waiting_for_more() {
        let sink = Sink::default();
        let (writer, _guard) = batch_writer(sink.clone()).unwrap();
        (&writer).write_all(b"alone\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // The writer thread writes on its own, within the batch delay; this
        // polls for that rather than sleeping a fixed time.
        while sink.0.lock().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::yield_now();
        }
        assert_eq!(sink.0.lock().concat(), b"alone\n");
    }

    #[test]
    fn a_full_buffer_holds_writers_back_instead_of_dropping_lines() {
        /// A sink that blocks until released.
        struct Gate(Arc<(Mutex<bool>, Condvar)>, Sink);
        impl Write for Gate {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let (open, cv) = &*self.0;
                let mut open = open.lock();
                while !*open {
                    cv.wait(&mut open);
                }
                self.1.write(buf)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let sink = Sink::default();
        let (writer, guard) = batch_writer(Gate(Arc::clone(&gate), sink.clone())).unwrap();
        let line = vec![b'x'; 1023];
        let total = 3 * CAPACITY / 1024;
        let producer = std::thread::spawn({
            let writer = writer.clone();
            let line = line.clone();
            move || {
                for _ in 0..total {
                    (&writer).write_all(&line).unwrap();
                    (&writer).write_all(b"\n").unwrap();
                }
            }
        });
        // With the sink blocked, the producer fills the buffer and waits.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while writer.shared.buffer.lock().bytes.len() < CAPACITY {
            assert!(std::time::Instant::now() < deadline, "buffer never filled");
            std::thread::yield_now();
        }
        assert!(!producer.is_finished());
        *gate.0.lock() = true;
        gate.1.notify_all();
        producer.join().unwrap();
        drop(guard);
        let written: usize = sink.0.lock().iter().map(Vec::len).sum();
        assert_eq!(written, total * 1024);
    }
}
