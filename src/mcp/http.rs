//! Streamable HTTP: rmcp's session-keeping service behind a plain hyper HTTP/1 server.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::{TcpListener, ToSocketAddrs};

use super::{McpHandler, McpServer};

/// The path the MCP endpoint is served on.
pub const MCP_PATH: &str = "/mcp";

/// The address [`McpServer::bind_http`] is meant for when nothing else is asked: loopback
/// only. Serving beyond this machine needs authentication in front (and rmcp's
/// `allowed_hosts` widened through [`McpHttp::with_config`]).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8000";

/// A bound streamable HTTP endpoint, serving on [`MCP_PATH`] once [`McpHttp::serve`] runs.
pub struct McpHttp {
    listener: TcpListener,
    server: McpServer,
    config: StreamableHttpServerConfig,
}

impl std::fmt::Debug for McpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttp")
            .field("listener", &self.listener)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// Binds a streamable HTTP endpoint (e.g. [`DEFAULT_HTTP_ADDR`]; port 0 picks a free
    /// one, see [`McpHttp::local_addr`]).
    pub async fn bind_http(self, addr: impl ToSocketAddrs) -> io::Result<McpHttp> {
        Ok(McpHttp {
            listener: TcpListener::bind(addr).await?,
            server: self,
            config: StreamableHttpServerConfig::default(),
        })
    }
}

impl McpHttp {
    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Replaces rmcp's transport settings (sessions on, loopback `Host`s only, 4 MiB request
    /// bodies by default).
    pub fn with_config(mut self, config: StreamableHttpServerConfig) -> McpHttp {
        self.config = config;
        self
    }

    /// Serves until the returned future is dropped; calls already running finish on their own
    /// tasks and settle their records. Each session gets a handler of its own; its calls run
    /// in the session's run unless they name one.
    pub async fn serve(self) -> io::Result<()> {
        let server = self.server;
        let service: StreamableHttpService<McpHandler, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(server.handler()),
                Arc::new(LocalSessionManager::default()),
                self.config,
            );
        loop {
            // A failed accept (out of file descriptors, a connection reset before it was
            // taken) concerns that connection, not the server: keep serving.
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "MCP HTTP accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let service = service.clone();
            tokio::spawn(async move {
                let route = service_fn(move |request: Request<Incoming>| {
                    let service = service.clone();
                    async move {
                        if request.uri().path() != MCP_PATH {
                            return Ok::<_, Infallible>(not_found());
                        }
                        Ok(service.handle(request).await)
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), route);
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "MCP HTTP connection ended with an error");
                }
            });
        }
    }
}

fn not_found() -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(b"not found: the MCP endpoint is /mcp")).boxed(),
    );
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}
