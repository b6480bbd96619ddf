//! Reading JSON bodies: a size limit answered with 413, syntax errors with 400, and type or
//! unknown-field errors with 422 naming the field's JSON path (actix's own `Json` extractor
//! names neither).

use actix_web::HttpRequest;
use actix_web::web::Payload;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::domain::FieldError;

/// Reads the whole body (at most `limit` bytes) and deserializes it.
pub async fn read_json<T: DeserializeOwned>(
    request: &HttpRequest,
    mut payload: Payload,
    limit: usize,
) -> Result<T, ApiError> {
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

/// Deserializes with serde_path_to_error so the error names the field.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_data() {
            let field = if path == "." {
                "(body)".to_owned()
            } else {
                path
            };
            let message = inner.to_string();
            let message = message
                .rsplit_once(" at line ")
                .map_or(message.clone(), |(m, _)| m.to_owned());
            ApiError::Invalid(vec![FieldError::new(field, message)])
        } else {
            ApiError::MalformedJson(inner.to_string())
        }
    })?;
    deserializer
        .end()
        .map_err(|err| ApiError::MalformedJson(err.to_string()))?;
    Ok(value)
}
