//! Listeners: accept connections, serve HTTP/1.1 and h2c on them, and
//! drain them on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::ResponseBody;

/// Serve `handler` on `listener` until `stop` turns true, then stop
/// accepting and let open connections finish through `graceful`.
pub fn serve<H, F>(
    listener: TcpListener,
    handler: H,
    mut stop: watch::Receiver<bool>,
    graceful: Arc<GracefulShutdown>,
) -> tokio::task::JoinHandle<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    tokio::spawn(async move {
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of file descriptors and the like: keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
                _ = stop.wait_for(|s| *s) => break,
            };
            let _ = stream.set_nodelay(true);
            let handler = handler.clone();
            let service = service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
    })
}

pub async fn bind(address: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}
