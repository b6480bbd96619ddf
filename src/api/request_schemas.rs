//! Request bodies checked against the served OpenAPI document, after the handler's own checks:
//! the document is the contract, and a body it calls invalid is refused even where serde and a
//! handler would let it through (a JSON array read as a struct's fields in order, a value the
//! handler does not look at). The handlers' checks run first because their messages say more;
//! this is the backstop that makes "schema-violating request accepted" impossible.

use std::collections::HashMap;
use std::sync::OnceLock;

use jsonschema::paths::LocationSegment;
use serde_json::{Value, json};

use super::OpenApiDocument;
use super::error::ApiError;
use crate::domain::FieldError;

/// One compiled validator per operation with a JSON request body, by (method, path), and one
/// per component schema, by name.
pub struct RequestSchemas {
    validators: HashMap<(String, String), jsonschema::Validator>,
    components: HashMap<String, jsonschema::Validator>,
}

impl std::fmt::Debug for RequestSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSchemas")
            .field("operations", &self.validators.len())
            .finish()
    }
}

impl RequestSchemas {
    /// The served document's ([`super::openapi_document`]) request schemas, compiled once per
    /// process: every server of a process (tests start many) and the fuzz targets share them.
    pub fn served() -> Result<&'static RequestSchemas, String> {
        static SERVED: OnceLock<Result<RequestSchemas, String>> = OnceLock::new();
        SERVED
            .get_or_init(|| Self::from_document(&super::openapi_document()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles the request body schema of every operation of `document` (their `$ref`s resolve
    /// against the document's components).
    pub fn from_document(document: &OpenApiDocument) -> Result<Self, String> {
        let components = document.0.get("components").cloned().unwrap_or(Value::Null);
        let compile = |schema: &Value, what: &dyn std::fmt::Display| {
            // The schema at the root, the components beside it for `#/components/...`.
            let root = json!({"allOf": [schema], "components": components});
            jsonschema::draft202012::new(&root)
                .map_err(|err| format!("the schema of {what} does not compile: {err}"))
        };
        let mut by_name = HashMap::new();
        for (name, schema) in components["schemas"].as_object().into_iter().flatten() {
            by_name.insert(
                name.clone(),
                compile(schema, &format_args!("component {name}"))?,
            );
        }
        let mut validators = HashMap::new();
        let paths = document.0["paths"].as_object().into_iter().flatten();
        for (path, item) in paths {
            for (method, operation) in item.as_object().into_iter().flatten() {
                let Some(schema) =
                    operation.pointer("/requestBody/content/application~1json/schema")
                else {
                    continue;
                };
                let validator = compile(schema, &format_args!("the body of {method} {path}"))?;
                validators.insert((method.to_ascii_uppercase(), path.clone()), validator);
            }
        }
        Ok(Self {
            validators,
            components: by_name,
        })
    }

    /// Refuses `body` of `method path` with 422 naming each field the document's schema rejects;
    /// an operation without a body schema accepts anything.
    pub fn check(&self, method: &str, path: &str, body: &Value) -> Result<(), ApiError> {
        match self.validators.get(&(method.to_owned(), path.to_owned())) {
            Some(validator) => refuse(validator, body, ""),
            None => Ok(()),
        }
    }

    /// Refuses `value` with 422 unless it is a valid `name` (a component schema); fields are
    /// named under `prefix` (e.g. `[3]` for the fourth record of a batch). An unknown name
    /// accepts anything.
    pub fn check_component(&self, name: &str, value: &Value, prefix: &str) -> Result<(), ApiError> {
        match self.components.get(name) {
            Some(validator) => refuse(validator, value, prefix),
            None => Ok(()),
        }
    }
}

fn refuse(validator: &jsonschema::Validator, body: &Value, prefix: &str) -> Result<(), ApiError> {
    let errors: Vec<FieldError> = validator
        .iter_errors(body)
        .map(|error| {
            let field = field_path(prefix, error.instance_path().segments());
            if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } =
                error.kind()
                && let [name] = unexpected.as_slice()
            {
                return FieldError::new(join(&field, name), "unknown field");
            }
            FieldError::new(field, error.to_string())
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Invalid(errors))
    }
}

/// A JSON path as the API's errors write it: `failures[2].tool_name`, `(body)` for the root.
fn field_path<'a>(prefix: &str, segments: impl Iterator<Item = LocationSegment<'a>>) -> String {
    let path = segments.fold(prefix.to_owned(), |path, segment| match segment {
        LocationSegment::Property(name) => join(&path, &name),
        LocationSegment::Index(i) => format!("{path}[{i}]"),
    });
    if path.is_empty() {
        "(body)".to_owned()
    } else {
        path
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() || path == "(body)" {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_document_compiles_and_names_the_fields_it_refuses() {
        let schemas = RequestSchemas::served().unwrap();
        let body = json!({
            "failure_context": {"failures": [{"failure_category": "x", "error_message": "y", "colour": 1}]},
            "current_config": {"model": "m", "temperature": 9},
            "user_context": ["a", "b"]
        });
        let Err(ApiError::Invalid(errors)) = schemas.check("POST", "/v1/recommendations", &body)
        else {
            panic!("refused");
        };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        for field in [
            "failure_context.failures[0].colour",
            "current_config.temperature",
            "user_context",
        ] {
            assert!(fields.contains(&field), "{field} in {fields:?}");
        }
        let record = json!({"kind": "user", "org": "acme", "data": []});
        let Err(ApiError::Invalid(errors)) =
            schemas.check_component("IngestRecordBody", &record, "[3]")
        else {
            panic!("refused");
        };
        assert_eq!(errors[0].field, "[3].data");
        assert!(schemas.check("GET", "/v1/nothing", &json!(1)).is_ok());
    }
}
