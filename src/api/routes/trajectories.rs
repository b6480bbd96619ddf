//! `POST /v1/trajectories`: the platform posts records (outcomes with trajectories, or any
//! ingest kind), one or many, validated exactly as `arc-rec ingest` does.

use actix_web::{HttpRequest, HttpResponse, post, web};
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::body::read_json;
use crate::api::error::ApiError;
use crate::api::extract::Caller;
use crate::api::state::AppState;
use crate::auth::Permission;
use crate::domain::FieldError;
use crate::ingest::{BadLinePolicy, ingest};

/// One ingest record, as in `arc-rec ingest` files.
#[derive(Debug, ToSchema)]
#[expect(
    dead_code,
    reason = "documents the wire shape for OpenAPI; bodies are parsed as JSON values"
)]
pub struct IngestRecordBody {
    /// `user`, `configuration`, `config_version`, `scenario`, `simulation`, `outcome`,
    /// `failure_pattern` or `config_diff`.
    kind: String,
    /// Must be the organization of the API key.
    org: String,
    /// The record in the platform's field names.
    data: Value,
}

/// What was stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrajectoriesResponse {
    /// Records in the request.
    pub records: usize,
    pub inserted: u64,
    pub updated: u64,
    /// Records identical to what was already stored.
    pub unchanged: u64,
}

/// Store records; all or nothing. A 201 means they are durable.
#[utoipa::path(
    tag = "ingest",
    request_body(content = Vec<IngestRecordBody>, description = "one record object or an array of them"),
    responses(
        (status = 201, body = TrajectoriesResponse),
        (status = 400, body = crate::api::error::ErrorBody), (status = 401, body = crate::api::error::ErrorBody),
        (status = 403, body = crate::api::error::ErrorBody), (status = 413, body = crate::api::error::ErrorBody),
        (status = 422, body = crate::api::error::ErrorBody),
    ),
    security(("api_key" = []))
)]
#[post("/v1/trajectories")]
pub async fn post_trajectories(
    caller: Caller,
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Permission::Ingest)?;
    let body = read_json(&request, payload, state.body_limit).await?;
    let records = match body {
        Value::Array(records) => records,
        record @ Value::Object(_) => vec![record],
        _ => {
            return Err(ApiError::invalid(
                "(body)",
                "must be a record object or an array of records",
            ));
        }
    };
    if records.is_empty() {
        return Err(ApiError::invalid(
            "(body)",
            "must contain at least one record",
        ));
    }
    let org = principal.org.as_str();
    let foreign: Vec<FieldError> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.get("org")
                .and_then(Value::as_str)
                .is_some_and(|o| o != org)
        })
        .map(|(i, _)| {
            FieldError::new(
                format!("[{i}].org"),
                format!("must be `{org}`, the organization of this API key"),
            )
        })
        .collect();
    if !foreign.is_empty() {
        return Err(ApiError::Invalid(foreign));
    }
    // Record by record (the document's body schema is "one record or a non-empty array of
    // them", checked above), so a bad record's fields are named.
    for (i, record) in records.iter().enumerate() {
        state
            .request_schemas
            .check_component("IngestRecordBody", record, &format!("[{i}]"))?;
    }
    let lines: Vec<String> = records.iter().map(Value::to_string).collect();
    let report = ingest(
        &state.pool,
        lines.as_slice(),
        BadLinePolicy::RejectAll,
        &ProgressBar::hidden(),
    )
    .await?;
    for (kind, counts) in &report.stats.by_kind {
        state
            .metrics
            .record_ingested(kind.as_str(), counts.inserted + counts.updated);
    }
    let total = |f: fn(&crate::storage::record_writer::KindCounts) -> u64| {
        report.stats.by_kind.values().map(f).sum()
    };
    Ok(HttpResponse::Created().json(TrajectoriesResponse {
        records: report.lines,
        inserted: total(|c| c.inserted),
        updated: total(|c| c.updated),
        unchanged: total(|c| c.unchanged),
    }))
}
