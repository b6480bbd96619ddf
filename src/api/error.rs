//! The one error type of the HTTP API and its wire format:
//! `{"error": {"code": "...", "message": "...", "fields": [{"field": "...", "message": "..."}]}}`.
//! Every domain error maps to a status here, exhaustively; 500 bodies are opaque and the error
//! chain is logged once, at this boundary.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::{AuthError, Permission, Role};
use crate::domain::FieldError;
use crate::ingest::IngestError;
use crate::recommend::decision_writer::DecisionWriteError;
use crate::recommend::service::ServeError;
use crate::storage::StorageError;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No key, a malformed key, or an unknown or revoked one.
    #[error("missing or invalid API key (send `Authorization: Bearer arc_...`)")]
    Unauthorized,
    /// The key's role does not allow the action.
    #[error("this key's role ({role}) may not {action}")]
    Forbidden {
        role: &'static str,
        action: &'static str,
    },
    /// The body is not JSON at all.
    #[error("malformed JSON: {0}")]
    MalformedJson(String),
    /// The body is JSON but some fields are wrong.
    #[error("invalid request: {}", summarize(.0))]
    Invalid(Vec<FieldError>),
    /// The body exceeds the configured limit.
    #[error("request body exceeds {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The body is not declared as JSON.
    #[error("unsupported content type {0:?}; send application/json")]
    UnsupportedMediaType(String),
    /// The thing asked for does not exist (in this organization).
    #[error("{0}")]
    NotFound(String),
    /// The key sent more requests than its rate limit allows; retry after the wait.
    #[error("rate limit exceeded for this key; retry in {} s", retry_after_seconds(*.retry_after))]
    RateLimited { retry_after: std::time::Duration },
    /// The key used up its daily quota; it starts again at the next UTC midnight.
    #[error(
        "daily quota of {quota} requests used up for this key; it starts again in {retry_after_seconds} s (00:00 UTC)"
    )]
    QuotaExceeded {
        quota: u64,
        retry_after_seconds: u64,
    },
    /// Handling took longer than the server's limit.
    #[error("the request took longer than {} s to handle", .0.as_secs_f64())]
    HandlingTimeout(std::time::Duration),
    /// The path exists, the method does not.
    #[error("{method} is not allowed here; allowed: {}", .allowed.join(", "))]
    MethodNotAllowed {
        method: String,
        allowed: Vec<&'static str>,
    },
    /// A dependency (the database) is down.
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// Anything else; the client sees only "internal error".
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// `Retry-After` in whole seconds (the header takes no fractions), rounded up so a client that
/// waits that long is admitted.
fn retry_after_seconds(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

fn summarize(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ApiError {
    /// A 403 for `role` attempting `permission`.
    pub fn forbidden(role: Role, permission: Permission) -> Self {
        let action = match permission {
            Permission::Recommend => "request recommendations",
            Permission::Feedback => "send feedback",
            Permission::Ingest => "ingest data",
            Permission::ReadAnalytics => "read analytics",
            Permission::ManageKeys => "manage API keys",
        };
        ApiError::Forbidden {
            role: role.as_str(),
            action,
        }
    }

    /// One invalid field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid(vec![FieldError::new(field, message)])
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::Invalid(_) => "invalid_request",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::HandlingTimeout(_) => "handling_timeout",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

/// The error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_request`.
    pub code: String,
    pub message: String,
    /// For `invalid_request`: each bad field by JSON path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldErrorBody>,
}

/// One bad field.
#[derive(Debug, Serialize, ToSchema)]
pub struct FieldErrorBody {
    /// JSON path, e.g. `current_config.temperature`.
    pub field: String,
    pub message: String,
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RateLimited { .. } | ApiError::QuotaExceeded { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::HandlingTimeout(_) | ApiError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let message = match self {
            ApiError::Internal(err) => {
                tracing::error!(error = ?err, "request failed");
                "internal error".to_owned()
            }
            other => other.to_string(),
        };
        let fields = match self {
            ApiError::Invalid(errors) => errors
                .iter()
                .map(|e| FieldErrorBody {
                    field: e.field.clone(),
                    message: e.message.clone(),
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::RateLimited { retry_after } => {
                response.insert_header((
                    actix_web::http::header::RETRY_AFTER,
                    retry_after_seconds(*retry_after),
                ));
            }
            ApiError::QuotaExceeded {
                retry_after_seconds,
                ..
            } => {
                response
                    .insert_header((actix_web::http::header::RETRY_AFTER, *retry_after_seconds));
            }
            ApiError::MethodNotAllowed { allowed, .. } => {
                response.insert_header((actix_web::http::header::ALLOW, allowed.join(", ")));
            }
            _ => {}
        }
        response.json(ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message,
                fields,
            },
        })
    }
}

impl From<StorageError> for ApiError {
    fn from(err: StorageError) -> Self {
        if err.is_unavailable() {
            // The chain only: under an outage this fires per request, and with RUST_BACKTRACE
            // set a captured backtrace would be taken and symbolized each time (the first
            // symbolization alone loads the binary's debug info, ~70 MB, heaptrack).
            tracing::warn!(error = %telemetry::error_chain(&err), "database unreachable");
            ApiError::Unavailable("database unreachable".into())
        } else {
            ApiError::Internal(anyhow::Error::new(err))
        }
    }
}

impl From<ServeError> for ApiError {
    fn from(err: ServeError) -> Self {
        match err {
            ServeError::Context { field, message } => ApiError::invalid(field, message),
            ServeError::UnknownRecommendation {
                event_id,
                recommendation_id,
            } => ApiError::NotFound(format!(
                "no recommendation {recommendation_id} was shown in event {event_id} of this organization"
            )),
            ServeError::Storage(storage) => storage.into(),
            ServeError::Log(DecisionWriteError::Stopped) => {
                ApiError::Unavailable("shutting down".into())
            }
            ServeError::Log(DecisionWriteError::Unavailable(_)) => {
                ApiError::Unavailable("database unreachable".into())
            }
            ServeError::LearnerStopped(_) => ApiError::Unavailable("shutting down".into()),
            ServeError::Cluster(_)
            | ServeError::Rank(_)
            | ServeError::Log(_)
            | ServeError::LogEncoding(_)
            | ServeError::SnapshotEncoding(_)
            | ServeError::Poisoned => ApiError::Internal(anyhow::Error::new(err)),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> Self {
        match err {
            AuthError::Malformed | AuthError::Unknown => ApiError::Unauthorized,
            AuthError::Storage(storage) => storage.into(),
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(err: IngestError) -> Self {
        match err {
            IngestError::Rejected { errors, .. } => ApiError::Invalid(
                errors
                    .into_iter()
                    .flat_map(|line| {
                        // Records are numbered from 0 in the body, lines from 1 in files.
                        let index = line.line - 1;
                        line.errors.into_iter().map(move |e| {
                            FieldError::new(format!("[{index}].{}", e.field), e.message)
                        })
                    })
                    .collect(),
            ),
            IngestError::Read { .. } => ApiError::Internal(anyhow::Error::new(err)),
            IngestError::Storage(storage) => storage.into(),
        }
    }
}
