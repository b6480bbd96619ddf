//! Reading JSON bodies: a size limit answered with 413, syntax errors with 400, and type or
//! unknown-field errors with 422 naming the field's JSON path (actix's own `Json` extractor
//! names neither).

use actix_web::HttpRequest;
use actix_web::web::Payload;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;
use crate::domain::FieldError;
use crate::domain::validation::find_nul;

/// Reads the whole body (at most `limit` bytes) as JSON; [`typed`] then reads it as the
/// handler's type, and the handler checks it against the document last
/// (`RequestSchemas::check`).
pub async fn read_json(
    request: &HttpRequest,
    mut payload: Payload,
    limit: usize,
) -> Result<Value, ApiError> {
    if let Some(content_type) = request.headers().get(actix_web::http::header::CONTENT_TYPE) {
        let content_type = content_type.to_str().unwrap_or_default();
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::UnsupportedMediaType(content_type.to_owned()));
        }
    }
    let declared = request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(1024).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::MalformedJson(format!("cannot read the body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    parse_json(&body)
}

/// Reads a parsed body as `T`; errors name the field.
pub fn typed<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|err| {
        let path = err.path().to_string();
        let field = if path == "." {
            "(body)".to_owned()
        } else {
            path
        };
        ApiError::Invalid(vec![FieldError::new(field, err.into_inner().to_string())])
    })
}

/// Deserializes a query string; errors name the parameter.
pub fn parse_query<T: DeserializeOwned>(request: &HttpRequest) -> Result<T, ApiError> {
    let pairs = form_urlencoded::parse(request.query_string().as_bytes());
    serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs)).map_err(|err| {
        let field = err.path().to_string();
        let field = if field == "." {
            "(query)".to_owned()
        } else {
            field
        };
        ApiError::invalid(field, err.into_inner().to_string())
    })
}

/// Parses a body as JSON: syntax errors are 400, a NUL character (which Postgres cannot store)
/// is a 422 naming its field.
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    if let Some(error) = std::str::from_utf8(body).ok().and_then(find_nul) {
        return Err(ApiError::Invalid(vec![error]));
    }
    serde_json::from_slice(body).map_err(|err| ApiError::MalformedJson(err.to_string()))
}
