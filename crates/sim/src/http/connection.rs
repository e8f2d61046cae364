//! Killing one connection the way a dying server process would: the
//! `cut_after_tokens` and `crash_after_tokens` faults.
//!
//! A handler cannot close its connection through hyper, and an abrupt close
//! must not lose the events already handed over: hyper buffers what a body
//! yields and writes it out later. So every accepted socket is wrapped in
//! [`Watched`], which sees hyper's flushes, and each request gets the
//! connection's [`Kill`] switch (a request extension). A stream that is cut
//! arms the switch and yields nothing more; the next flush of the socket
//! (hyper flushes once it has nothing left to write, buffered events
//! included) fires it: the connection task drops the connection — a close
//! mid-body, without a closing chunk — or the replica crashes. A request
//! that has written nothing fires it at once.
//!
//! HTTP/2 connections are closed whole, as a dead process closes them.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::state::{StopMode, StopSignal};

const ARMED_NONE: u8 = 0;
const ARMED_CLOSE: u8 = 1;
const ARMED_CRASH: u8 = 2;

/// One connection's kill switch.
#[derive(Debug)]
pub(crate) struct Kill {
    armed: AtomicU8,
    close: Notify,
    stop: Arc<StopSignal>,
}

impl Kill {
    pub(super) fn new(stop: Arc<StopSignal>) -> Arc<Self> {
        Arc::new(Self {
            armed: AtomicU8::new(ARMED_NONE),
            close: Notify::new(),
            stop,
        })
    }

    /// Closes the connection at once.
    pub(crate) fn close_now(&self) {
        self.close.notify_one();
    }

    /// Crashes the replica at once.
    pub(crate) fn crash_now(&self) {
        self.stop.request(StopMode::Crash);
    }

    /// Closes the connection once what was written so far has left.
    pub(crate) fn close_after_flush(&self) {
        self.armed.store(ARMED_CLOSE, Ordering::SeqCst);
    }

    /// Crashes the replica once what was written so far has left.
    pub(crate) fn crash_after_flush(&self) {
        self.armed.store(ARMED_CRASH, Ordering::SeqCst);
    }

    /// Resolves when the connection is to be closed.
    pub(super) async fn closed(&self) {
        self.close.notified().await;
    }

    fn flushed(&self) {
        match self.armed.swap(ARMED_NONE, Ordering::SeqCst) {
            ARMED_CLOSE => self.close_now(),
            ARMED_CRASH => self.crash_now(),
            _ => {}
        }
    }
}

/// A socket whose flushes fire its connection's armed [`Kill`].
pub(super) struct Watched<T> {
    inner: T,
    kill: Arc<Kill>,
}

impl<T> Watched<T> {
    pub(super) fn new(inner: T, kill: Arc<Kill>) -> Self {
        Self { inner, kill }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.kill.flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
