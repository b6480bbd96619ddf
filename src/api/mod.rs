//! The HTTP API (actix-web), versioned under `/v1`. Thin handlers over HTTP-free library code;
//! one error type ([`error::ApiError`]); the OpenAPI document is collected from the registered
//! handlers by utoipa-actix-web, so it cannot drift from the routes.

pub mod body;
pub mod error;
pub mod extract;
pub mod request_schemas;
pub mod routes;
pub mod schema_rules;
pub mod state;

use std::net::TcpListener;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::{App, HttpServer, web};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_actix_web::AppExt;

use self::state::AppState;

/// Largest request body accepted by default (a batch of trajectories).
pub const DEFAULT_BODY_LIMIT: usize = 8 << 20;

/// Longest a request may take to handle by default: a full body of trajectories ingests in a
/// few seconds; anything near this is stuck (on a lock, a saturated pool), and the client is
/// better told so than left waiting.
pub const DEFAULT_HANDLING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long an idle client connection is kept open by default: longer than the idle timeouts
/// of common load balancers and HTTP client pools (60 s), so that they, not the server, close
/// idle connections. When the server closes first, a client can send a request on the
/// connection at the moment it closes and get no answer at all (a load balancer answers 502):
/// the soak saw 2–4 such requests in 300,000 with actix's default of 5 s.
pub const DEFAULT_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(75);

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Address to bind, e.g. `127.0.0.1:8080`; port 0 picks a free port (tests).
    pub listen: String,
    /// Worker threads (actix); default: one per core.
    pub workers: usize,
    /// How long an idle client connection is kept open ([`DEFAULT_KEEP_ALIVE`]).
    pub keep_alive: std::time::Duration,
}

/// A bound, not yet running server.
pub struct Application {
    port: u16,
    server: Server,
}

impl std::fmt::Debug for Application {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Application")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Application {
    /// Binds the listener and builds the server; nothing is served until
    /// [`Application::run_until_stopped`].
    pub fn build(settings: &ServerSettings, state: AppState) -> std::io::Result<Self> {
        let listener = TcpListener::bind(&settings.listen)?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(state);
        let document = web::Data::new(openapi_document());
        let server = HttpServer::new(move || {
            let (app, _) = App::new()
                .app_data(state.clone())
                .app_data(document.clone())
                .wrap(from_fn(record_request))
                .into_utoipa_app()
                .configure(routes_config)
                .split_for_parts();
            app.configure(routes::dashboard::configure)
                .default_service(web::to(unmatched))
        })
        .workers(settings.workers.max(1))
        .keep_alive(settings.keep_alive)
        // We stop on our own signal handling (see `arc-rec serve`), draining requests.
        .disable_signals()
        .listen(listener)?
        .run();
        Ok(Self { port, server })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle to stop the server gracefully.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until stopped through the handle.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

fn routes_config(config: &mut utoipa_actix_web::service_config::ServiceConfig<'_>) {
    config
        .service(routes::health::healthz)
        .service(routes::health::readyz)
        .service(routes::health::metrics)
        .service(routes::health::openapi)
        .service(routes::recommendations::post_recommendations)
        .service(routes::feedback::post_feedback)
        .service(routes::trajectories::post_trajectories)
        .service(routes::analytics::acceptance)
        .service(routes::analytics::ope);
}

/// The OpenAPI document as served: [`generated_document`] with [`schema_rules::refine`]'s rules.
#[derive(Debug, Clone)]
pub struct OpenApiDocument(pub serde_json::Value);

/// The OpenAPI document served at `/openapi.json`.
pub fn openapi_document() -> OpenApiDocument {
    let mut document = serde_json::to_value(generated_document()).unwrap_or_else(|err| {
        tracing::error!(error = %err, "cannot serialize the OpenAPI document");
        serde_json::Value::Null
    });
    for pointer in schema_rules::refine(&mut document) {
        tracing::error!(pointer, "an OpenAPI schema rule found nothing to refine");
    }
    OpenApiDocument(document)
}

/// The OpenAPI document of every handler registered in [`routes_config`], as derived.
pub fn generated_document() -> utoipa::openapi::OpenApi {
    let (_, mut document) = App::new()
        .into_utoipa_app()
        .configure(routes_config)
        .split_for_parts();
    document.info.title = "arc-rec".to_owned();
    document.info.version = env!("CARGO_PKG_VERSION").to_owned();
    document.info.description =
        Some("Configuration recommendations for an LLM-agent evaluation platform".to_owned());
    let components = document.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "api_key",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("arc_<id>_<secret>")
                .build(),
        ),
    );
    document
}

/// Answers a request no route took: 405 with `Allow` when the path exists under other methods
/// (from the OpenAPI document, which lists every route), else 404; JSON bodies either way.
async fn unmatched(
    request: actix_web::HttpRequest,
    document: web::Data<OpenApiDocument>,
) -> actix_web::HttpResponse {
    let path = request.path();
    use actix_web::ResponseError as _;
    match document.0["paths"].get(path) {
        Some(item) => {
            let allowed = ["GET", "PUT", "POST", "DELETE", "PATCH"]
                .into_iter()
                .filter(|method| item.get(method.to_ascii_lowercase()).is_some())
                .collect();
            error::ApiError::MethodNotAllowed {
                method: request.method().to_string(),
                allowed,
            }
        }
        None => error::ApiError::NotFound(format!("no such route: {path}")),
    }
    .error_response()
}

/// Counts and times every request by route pattern (not raw path, to bound cardinality), and
/// answers 503 for one whose handling outlasts the configured limit. A handler stopped that way
/// never answered 2xx, so nothing it was writing was acknowledged.
async fn record_request(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = request.method().to_string();
    let state = request.app_data::<web::Data<AppState>>().cloned();
    let timeout = state
        .as_ref()
        .map_or(DEFAULT_HANDLING_TIMEOUT, |s| s.handling_timeout);
    let path = request.path().to_owned();
    let Ok(response) = tokio::time::timeout(timeout, next.call(request)).await else {
        tracing::warn!(%path, timeout_s = timeout.as_secs_f64(), "request outlasted the handling limit");
        if let Some(state) = state {
            // The request went into the handler, so its route is not known here any more:
            // timed-out requests are counted under one label of their own.
            state
                .metrics
                .record_http_request(&method, "timed_out", 503, started.elapsed());
        }
        return Err(error::ApiError::HandlingTimeout(timeout).into());
    };
    let response = response?;
    if let Some(state) = state {
        let route = response
            .request()
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_owned());
        state.metrics.record_http_request(
            &method,
            &route,
            response.status().as_u16(),
            started.elapsed(),
        );
    }
    Ok(response)
}
