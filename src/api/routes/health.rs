//! Liveness, readiness, Prometheus metrics and the OpenAPI document.

use actix_web::{HttpResponse, get, web};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::error::ApiError;
use crate::api::state::AppState;
use crate::storage;

/// Health status.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
}

/// The process is up.
#[utoipa::path(tag = "operations", responses((status = 200, body = Health)))]
#[get("/healthz")]
pub async fn healthz() -> web::Json<Health> {
    web::Json(Health { status: "ok" })
}

/// The process can serve: the database answers and has every migration this binary knows.
#[utoipa::path(tag = "operations", responses((status = 200, body = Health), (status = 503, body = crate::api::error::ErrorBody)))]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> Result<web::Json<Health>, ApiError> {
    let pending = storage::pending_migrations(&state.pool)
        .await
        .map_err(|_| ApiError::Unavailable("database not answering".into()))?;
    if !pending.is_empty() {
        let versions: Vec<String> = pending.iter().map(ToString::to_string).collect();
        return Err(ApiError::Unavailable(format!(
            "migrations pending: {} (run `arc-rec migrate`, or restart a server: it applies them)",
            versions.join(", ")
        )));
    }
    Ok(web::Json(Health { status: "ok" }))
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(tag = "operations", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(telemetry::Metrics::CONTENT_TYPE)
        .body(state.metrics.render())
}

/// The OpenAPI document, generated from the handlers and their types.
#[utoipa::path(tag = "operations", responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
#[get("/openapi.json")]
pub async fn openapi(document: web::Data<crate::api::OpenApiDocument>) -> HttpResponse {
    HttpResponse::Ok().json(&document.0)
}
