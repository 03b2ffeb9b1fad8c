//! Streamable HTTP: rmcp's session-keeping service behind guards (`Origin`, authentication,
//! a cap on live sessions) that travel with the service wherever a host mounts it, and idem's
//! own hyper accept loop (a header-read timeout, a cap on connections).

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServerHandler;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::Semaphore;

use super::{McpCaller, McpHandler, McpServer};

/// The path the MCP endpoint is served on.
pub const MCP_PATH: &str = "/mcp";

/// The address [`McpServer::bind_http`] is meant for when nothing else is asked: loopback
/// only. Serving beyond this machine needs authentication ([`McpHttpGuard::authenticate`])
/// and rmcp's `allowed_hosts` widened through [`McpHttp::with_config`].
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8000";

/// The live sessions a service keeps at most, by default ([`McpHttpGuard::max_sessions`]).
pub const DEFAULT_MAX_SESSIONS: usize = 1024;

/// The connections idem's accept loop serves at once, by default
/// ([`McpHttp::max_connections`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How long idem's accept loop waits for a request's headers, by default
/// ([`McpHttp::header_read_timeout`]).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The origins a browser page may call the endpoint from without being listed: pages
/// served from this machine.
const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

type Authenticate = dyn Fn(&http::request::Parts) -> Result<McpCaller, String> + Send + Sync;

/// What every request to the HTTP service passes before rmcp sees it, so it holds wherever
/// the service is mounted ([`McpServer::http_service`]: idem's accept loop, an axum
/// `nest_service`, any hyper or tower stack):
///
/// - **`Origin`**: a request with an `Origin` header is answered `403` (no session made)
///   unless the origin is on this machine (`http(s)://localhost`, `127.0.0.1`, `[::1]`, any
///   port) or listed with [`McpHttpGuard::allow_origins`]. Browsers send it, so a page on
///   another site cannot drive a local server; clients that are not browsers send none.
/// - **Authentication** ([`McpHttpGuard::authenticate`]): every request, `initialize`
///   included, is answered `401` unless the hook names its caller; the caller reaches the
///   server (it scopes the request's calls) through the request's extensions.
/// - **Live sessions**: a request that would open one more session than
///   [`McpHttpGuard::max_sessions`] is answered `503`.
#[derive(Clone)]
pub struct McpHttpGuard {
    origins: Vec<String>,
    authenticate: Option<Arc<Authenticate>>,
    max_sessions: usize,
}

impl std::fmt::Debug for McpHttpGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttpGuard")
            .field("origins", &self.origins)
            .field("authenticate", &self.authenticate.is_some())
            .field("max_sessions", &self.max_sessions)
            .finish()
    }
}

impl Default for McpHttpGuard {
    fn default() -> Self {
        McpHttpGuard {
            origins: Vec::new(),
            authenticate: None,
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

impl McpHttpGuard {
    /// The defaults: loopback origins only, no authentication, [`DEFAULT_MAX_SESSIONS`].
    pub fn new() -> McpHttpGuard {
        McpHttpGuard::default()
    }

    /// Also accepts requests from these origins (`scheme://host:port`, or `scheme://host:*`
    /// for any port), e.g. the web app that embeds the client.
    pub fn allow_origins(mut self, origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.origins.extend(origins.into_iter().map(Into::into));
        self
    }

    /// Authenticates every request from its head: `Ok(caller)` lets it through, scoped to
    /// that caller; `Err(reason)` answers `401` with `reason`, before any session exists.
    ///
    /// ```no_run
    /// use idem::mcp::{McpCaller, McpHttpGuard};
    /// let guard = McpHttpGuard::new().authenticate(|head| {
    ///     match head.headers.get("authorization").and_then(|v| v.to_str().ok()) {
    ///         Some("Bearer alice-token") => Ok(McpCaller::default().principal("alice")),
    ///         _ => Err("a bearer token is required".to_owned()),
    ///     }
    /// });
    /// ```
    pub fn authenticate(
        mut self,
        authenticate: impl Fn(&http::request::Parts) -> Result<McpCaller, String>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.authenticate = Some(Arc::new(authenticate));
        self
    }

    /// The most sessions the service keeps live at once (at least 1).
    pub fn max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = max.max(1);
        self
    }
}

/// The streamable HTTP service of a [`McpServer`] behind its [`McpHttpGuard`]: a
/// `tower::Service` over `http::Request`, for idem's accept loop or a host's own router
/// (axum: `Router::new().nest_service("/mcp", service)`). It serves whatever path it is
/// mounted at.
///
/// A host with an rmcp handler of its own (its tools joined with idem's through
/// [`McpServer::join_router`]) puts it behind the same guard with
/// [`McpHttpGuard::serve_handler`].
///
/// Cloning it is one reference count: hyper and tower clone a service for every request.
pub struct McpHttpService<H = McpHandler> {
    parts: Arc<ServiceParts<H>>,
}

/// What every clone of one [`McpHttpService`] shares.
struct ServiceParts<H> {
    inner: StreamableHttpService<H, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    guard: McpHttpGuard,
}

impl<H> Clone for McpHttpService<H> {
    fn clone(&self) -> Self {
        McpHttpService {
            parts: self.parts.clone(),
        }
    }
}

impl<H> std::fmt::Debug for McpHttpService<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttpService")
            .field("guard", &self.parts.guard)
            .finish_non_exhaustive()
    }
}

/// The response type of [`McpHttpService`].
pub type McpHttpResponse = Response<BoxBody<Bytes, Infallible>>;

impl McpServer {
    /// The streamable HTTP service of this server, behind `guard`, with rmcp's transport
    /// `config` (`StreamableHttpServerConfig::default()`: sessions on, loopback `Host`s
    /// only). The guard's origins replace the config's `allowed_origins`.
    pub fn http_service(
        &self,
        guard: McpHttpGuard,
        config: StreamableHttpServerConfig,
    ) -> McpHttpService {
        let server = self.clone();
        guard.serve_handler(move || Ok(server.handler()), config)
    }
}

impl McpHttpGuard {
    /// The streamable HTTP service of any rmcp handler `factory` makes (one per session)
    /// behind this guard, with rmcp's transport `config`. The guard's origins replace the
    /// config's `allowed_origins`.
    pub fn serve_handler<H: ServerHandler + Send + 'static>(
        self,
        factory: impl Fn() -> Result<H, io::Error> + Send + Sync + 'static,
        config: StreamableHttpServerConfig,
    ) -> McpHttpService<H> {
        let mut origins: Vec<String> = LOOPBACK_ORIGINS.iter().map(|o| (*o).to_owned()).collect();
        origins.extend(self.origins.iter().cloned());
        let config = config.with_allowed_origins(origins);
        // The session layer primes each tool call's event stream itself, from its own
        // settings (3 s by default): the host's `sse_retry` must reach it too, or turning
        // priming off would leave it on for every `tools/call`.
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.sse_retry = config.sse_retry;
        let sessions = Arc::new(sessions);
        McpHttpService {
            parts: Arc::new(ServiceParts {
                inner: StreamableHttpService::new(factory, sessions.clone(), config),
                sessions,
                guard: self,
            }),
        }
    }
}

impl<H: ServerHandler + Send + 'static> McpHttpService<H> {
    /// Answers one request: the guard's checks, then rmcp.
    pub async fn handle<B>(&self, request: Request<B>) -> McpHttpResponse
    where
        B: Body + Send + 'static,
        B::Error: Display,
        B::Data: Send,
    {
        let parts = &*self.parts;
        let (mut head, body) = request.into_parts();
        if let Some(authenticate) = &parts.guard.authenticate {
            match authenticate(&head) {
                Ok(caller) => {
                    head.extensions.insert(caller);
                }
                Err(reason) => return unauthorized(&reason),
            }
        }
        // Only a request outside any session can open one: an `initialize` of the revisions
        // with sessions. The sessionless revision names itself and opens none.
        let opens_session = head.method == http::Method::POST
            && !head.headers.contains_key("mcp-session-id")
            && head
                .headers
                .get("mcp-protocol-version")
                .and_then(|v| v.to_str().ok())
                .is_none_or(|v| v < "2026-07-28");
        if opens_session && parts.sessions.sessions.read().await.len() >= parts.guard.max_sessions {
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many live MCP sessions; try again later",
            );
        }
        parts.inner.handle(Request::from_parts(head, body)).await
    }
}

impl<H, B> tower_service::Service<Request<B>> for McpHttpService<H>
where
    H: ServerHandler + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Display,
    B::Data: Send,
{
    type Response = McpHttpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<McpHttpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move { Ok(service.handle(request).await) })
    }
}

/// A bound streamable HTTP endpoint, serving on [`MCP_PATH`] once [`McpHttp::serve`] runs.
pub struct McpHttp {
    listener: TcpListener,
    server: McpServer,
    config: StreamableHttpServerConfig,
    guard: McpHttpGuard,
    max_connections: usize,
    header_read_timeout: Duration,
}

impl std::fmt::Debug for McpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttp")
            .field("listener", &self.listener)
            .field("server", &self.server)
            .field("guard", &self.guard)
            .field("max_connections", &self.max_connections)
            .field("header_read_timeout", &self.header_read_timeout)
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
            guard: McpHttpGuard::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        })
    }
}

impl McpHttp {
    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Replaces rmcp's transport settings (sessions on, loopback `Host`s only, 4 MiB request
    /// bodies by default). Its `allowed_origins` are the guard's ([`McpHttp::guard`]).
    pub fn with_config(mut self, config: StreamableHttpServerConfig) -> McpHttp {
        self.config = config;
        self
    }

    /// Replaces the guard every request passes ([`McpHttpGuard`]; by default loopback
    /// origins, no authentication, [`DEFAULT_MAX_SESSIONS`]).
    pub fn guard(mut self, guard: McpHttpGuard) -> McpHttp {
        self.guard = guard;
        self
    }

    /// The most connections served at once (at least 1; [`DEFAULT_MAX_CONNECTIONS`]): one
    /// more waits in the listen queue until one ends.
    pub fn max_connections(mut self, max: usize) -> McpHttp {
        self.max_connections = max.max(1);
        self
    }

    /// How long a connection may take to send a request's headers before it is closed
    /// ([`DEFAULT_HEADER_READ_TIMEOUT`]), so idle or trickling clients cannot hold
    /// connections.
    pub fn header_read_timeout(mut self, timeout: Duration) -> McpHttp {
        self.header_read_timeout = timeout;
        self
    }

    /// Serves until the returned future is dropped; calls already running finish on their own
    /// tasks and settle their records.
    pub async fn serve(self) -> io::Result<()> {
        let service = self.server.http_service(self.guard, self.config);
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let header_read_timeout = self.header_read_timeout;
        loop {
            // Taken before the accept, so that past the cap connections wait in the kernel's
            // queue instead of costing a task each.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Ok(());
            };
            // A failed accept (out of file descriptors, a connection reset before it was
            // taken) concerns that connection, not the server: keep serving.
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "MCP HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let service = service.clone();
            tokio::spawn(async move {
                let route = service_fn(move |request: Request<Incoming>| {
                    let service = service.clone();
                    async move {
                        if request.uri().path() != MCP_PATH {
                            return Ok::<_, Infallible>(plain(
                                StatusCode::NOT_FOUND,
                                "not found: the MCP endpoint is /mcp",
                            ));
                        }
                        Ok(service.handle(request).await)
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_read_timeout)
                    .serve_connection(TokioIo::new(stream), route);
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "MCP HTTP connection ended with an error");
                }
                drop(slot);
            });
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> McpHttpResponse {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    response
}

fn unauthorized(reason: &str) -> McpHttpResponse {
    // Bounded: the reason is the host's, but may quote what the client sent.
    let reason: String = reason.chars().take(512).collect();
    let mut response = Response::new(Full::new(Bytes::from(reason)).boxed());
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer"),
    );
    response
}
