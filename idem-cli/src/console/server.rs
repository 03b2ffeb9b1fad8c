//! The HTTP server: the state every handler shares, the guard every request passes (the
//! token, the `Origin` of a POST, the log line), and the store, opened at start or, if it
//! could not be reached then, on the next request that needs it.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use idem_runtime::registry::Registry;
use idem_runtime::store::IdemStore;
use tokio::sync::{mpsc, oneshot};

use super::auth::{self, Auth};
use super::{forms, pages, Settings};
use crate::store_url::{open_store_with, StoreOptions};

/// A request for the registry, answered by the task that owns the store's opening.
type OpenRequest = oneshot::Sender<Result<Arc<Registry>, String>>;

/// What every handler shares.
pub(crate) struct Console {
    pub(crate) auth: Auth,
    /// The name the decision forms are prefilled with.
    pub(crate) operator: String,
    /// The origins a POST may come from (`http://ADDR`, and `http://localhost:PORT` on
    /// loopback); any origin matching the `Host` when listening on every address.
    origins: Vec<String>,
    any_host: bool,
    registry: OnceLock<Arc<Registry>>,
    open: mpsc::Sender<OpenRequest>,
}

/// The shared state, as handlers extract it.
pub(crate) type Shared = Arc<Console>;

impl Console {
    /// The registry over the store, opening the store first if that failed before. An
    /// error says why the store cannot be reached.
    pub(crate) async fn registry(&self) -> Result<Arc<Registry>, String> {
        if let Some(r) = self.registry.get() {
            return Ok(r.clone());
        }
        let (tx, rx) = oneshot::channel();
        if self.open.send(tx).await.is_err() {
            return Err("the console is shutting down".into());
        }
        rx.await
            .unwrap_or_else(|_| Err("the console is shutting down".into()))
    }

    /// The store, as [`Console::registry`] opens it.
    pub(crate) async fn store(&self) -> Result<Arc<dyn IdemStore>, String> {
        Ok(self.registry().await?.store().clone())
    }

    fn origin_allowed(&self, origin: &str, headers: &HeaderMap) -> bool {
        if self.origins.iter().any(|o| o == origin) {
            return true;
        }
        self.any_host
            && headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .is_some_and(|host| origin == format!("http://{host}"))
    }
}

/// Serves the console until interrupted (Ctrl-C). Prints the URL to open, with the token.
pub(crate) async fn serve<F, Fut>(
    url: String,
    options: StoreOptions,
    settings: Settings,
    registry: F,
) -> ExitCode
where
    F: FnOnce(Arc<dyn IdemStore>) -> Fut,
    Fut: Future<Output = Registry>,
{
    let fail = |e: String| {
        eprintln!("idem: {}", crate::escape::Esc(&e));
        ExitCode::from(2)
    };
    let listener = match tokio::net::TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", settings.listen)),
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(format!("cannot listen on {}: {e}", settings.listen)),
    };
    if !addr.ip().is_loopback() {
        eprintln!(
            "idem: warning: the console listens on {addr}, not only on loopback: anyone who \
             can reach this address and has the token can settle records"
        );
    }
    let token = match settings.token {
        Some(t) => t,
        None => match auth::generate_token() {
            Ok(t) => t,
            Err(e) => return fail(e),
        },
    };
    let auth = match Auth::new(&token, addr.port()) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let (open_tx, mut open_rx) = mpsc::channel::<OpenRequest>(16);
    let console = Arc::new(Console {
        auth,
        operator: settings.operator.unwrap_or_default(),
        origins: origins(addr),
        any_host: addr.ip().is_unspecified(),
        registry: OnceLock::new(),
        open: open_tx,
    });
    let mut server = tokio::spawn(
        axum::serve(listener, router(console.clone()))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .into_future(),
    );
    let shown = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    println!("idem console: open http://{shown}/?token={token}");
    // The factory is called once, when the store first opens: at start or, if the store
    // could not be reached then, on a later request.
    let mut factory = Some(registry);
    if let Err(e) = open(&url, &options, &mut factory, &console).await {
        eprintln!(
            "idem: warning: {}; the console serves a page saying so, and tries again on the \
             next request",
            crate::escape::Esc(&e)
        );
    }
    loop {
        tokio::select! {
            asked = open_rx.recv() => match asked {
                Some(reply) => {
                    let _ = reply.send(open(&url, &options, &mut factory, &console).await);
                }
                None => break,
            },
            done = &mut server => {
                return match done {
                    Ok(Ok(())) => ExitCode::SUCCESS,
                    Ok(Err(e)) => fail(format!("the console stopped: {e}")),
                    Err(e) => fail(format!("the console stopped: {e}")),
                };
            }
        }
    }
    ExitCode::SUCCESS
}

/// Opens the store and builds the registry on it, unless done already.
async fn open<F, Fut>(
    url: &str,
    options: &StoreOptions,
    factory: &mut Option<F>,
    console: &Console,
) -> Result<Arc<Registry>, String>
where
    F: FnOnce(Arc<dyn IdemStore>) -> Fut,
    Fut: Future<Output = Registry>,
{
    if let Some(r) = console.registry.get() {
        return Ok(r.clone());
    }
    let store = open_store_with(url, options)
        .await
        .map_err(|e| format!("the store is unreachable: {e}"))?;
    let Some(build) = factory.take() else {
        return Err("the store's registry could not be built".into());
    };
    let registry = Arc::new(build(store).await);
    Ok(console.registry.get_or_init(|| registry).clone())
}

/// The origins of the console's own pages.
fn origins(addr: SocketAddr) -> Vec<String> {
    let mut out = vec![format!("http://{addr}")];
    if addr.ip().is_loopback() {
        out.push(format!("http://localhost:{}", addr.port()));
    }
    out
}

/// The console's routes, behind [`guard`].
fn router(console: Shared) -> Router {
    Router::new()
        .route("/", get(pages::list))
        .route("/records/{key}", get(pages::record))
        .route("/records/{key}/confirm", post(forms::confirm))
        .route("/records/{key}/resolve", post(forms::resolve))
        .fallback(|| async {
            pages::message(
                StatusCode::NOT_FOUND,
                "Not found",
                "No such page.",
                Some("/"),
            )
        })
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console)
}

/// Every request: the token (else 401, and nothing read from the store), the `Origin` of a
/// POST (else 403), headers that keep the pages out of caches and frames, and one log line
/// with the method, the path without its query, and the status: never an argument or an
/// output.
async fn guard(State(console): State<Shared>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut response = admit(&console, req, next).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        // `same-origin`, not `no-referrer`: with the latter a browser sends `Origin: null`.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    eprintln!(
        "idem console: {method} {} {}",
        crate::escape::Esc(&path),
        response.status().as_u16()
    );
    response
}

async fn admit(console: &Console, req: Request, next: Next) -> Response {
    let auth = &console.auth;
    // First visit: `?token=` sets the cookie and redirects to the same address without it,
    // so the token leaves the address bar and the history.
    if let Some(query) = req.uri().query() {
        let (tokens, rest): (Vec<&str>, Vec<&str>) =
            query.split('&').partition(|p| p.starts_with("token="));
        if let Some(given) = tokens.first() {
            let given = &given["token=".len()..];
            if !auth.accepts(given) || req.method() != Method::GET {
                return unauthorized();
            }
            let mut location = req.uri().path().to_owned();
            if !rest.is_empty() {
                location.push('?');
                location.push_str(&rest.join("&"));
            }
            let mut response = Redirect::to(&location).into_response();
            if let Ok(cookie) = HeaderValue::from_str(&auth.set_cookie(given)) {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            return response;
        }
    }
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .find_map(|h| auth.token_in_cookies(h));
    if !bearer.or(cookie).is_some_and(|t| auth.accepts(t)) {
        return unauthorized();
    }
    if req.method() == Method::POST {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let ok = origin
                .to_str()
                .is_ok_and(|o| console.origin_allowed(o, headers));
            if !ok {
                return pages::message(
                    StatusCode::FORBIDDEN,
                    "Refused",
                    "This decision was sent from a page that is not the console's own; \
                     nothing was changed.",
                    Some("/"),
                );
            }
        }
    }
    next.run(req).await
}

fn unauthorized() -> Response {
    pages::message(
        StatusCode::UNAUTHORIZED,
        "Token required",
        "Open the console with the address `idem console` printed at start (it ends in \
         ?token=…), or send the token as `Authorization: Bearer TOKEN`.",
        None,
    )
}
