//! What the derived OpenAPI schemas cannot say, written into the served document in one place:
//! the agent configuration's rules (`domain::agent_config::config_json_schema`), the failure
//! context's "at least one of", the embedding's single-precision range, the policies the OPE
//! endpoint knows, a batch of ingest records, and the answers every keyed operation may give
//! (429, 503, and 400/413/415 for bodies). Each mirrors a check in a handler: a schema stricter
//! than its handler lets bad data through unannounced, a looser one rejects requests the
//! document calls valid; `scripts/schemathesis.sh` sends both kinds and checks the answers agree.

use serde_json::{Value, json};

use crate::domain::agent_config::config_json_schema;
use crate::domain::records::ORG_ID_PATTERN;
use crate::domain::{RecommendationType, RecordKind};

/// The largest magnitude an embedding value may have: single precision's.
pub const MAX_EMBEDDING_VALUE: f64 = f32::MAX as f64;

/// Applies every rule to the serialized document. A rule whose target is missing (a schema
/// renamed without this file) is reported in the returned list; the document tests insist it
/// is empty.
pub fn refine(document: &mut Value) -> Vec<&'static str> {
    let mut missing = Vec::new();
    let mut patch =
        |pointer: &'static str, apply: &dyn Fn(&mut Value)| match document.pointer_mut(pointer) {
            Some(target) => apply(target),
            None => missing.push(pointer),
        };
    patch("/components/schemas", &|schemas| {
        schemas["AgentConfig"] = config_json_schema();
    });
    patch(
        "/components/schemas/RecommendationRequest/properties/current_config",
        &|current| {
            *current = json!({
                "$ref": "#/components/schemas/AgentConfig",
                "description": "The agent configuration that failed."
            });
        },
    );
    patch("/components/schemas/FailureContextBody", &|context| {
        // Present and non-empty: null or [] says nothing about the failure.
        context["anyOf"] = json!([
            {"required": ["failure_cluster_embedding"], "properties": {"failure_cluster_embedding": {"type": "array"}}},
            {"required": ["failures"], "properties": {"failures": {"minItems": 1}}},
            {"required": ["outcome_ids"], "properties": {"outcome_ids": {"minItems": 1}}}
        ]);
    });
    patch(
        "/components/schemas/FailureContextBody/properties/failure_cluster_embedding/items",
        &|items| {
            *items = json!({
                "type": "number",
                "minimum": -MAX_EMBEDDING_VALUE,
                "maximum": MAX_EMBEDDING_VALUE
            });
        },
    );
    patch(
        "/paths/~1v1~1trajectories/post/requestBody/content/application~1json/schema",
        &|body| {
            let record = json!({"$ref": "#/components/schemas/IngestRecordBody"});
            *body = json!({"oneOf": [record, {"type": "array", "items": record, "minItems": 1}]});
        },
    );
    patch(
        "/paths/~1v1~1analytics~1ope/get/parameters",
        &|parameters| {
            let types: Vec<&str> = RecommendationType::ALL
                .map(RecommendationType::as_str)
                .to_vec();
            let pattern = format!(
                "^(heuristic|lowest_cost|uniform|type:({}))$",
                types.join("|")
            );
            for parameter in parameters.as_array_mut().into_iter().flatten() {
                if parameter["name"] == "policy" {
                    parameter["schema"]["pattern"] = json!(pattern);
                }
            }
        },
    );
    patch("/components/schemas/IngestRecordBody", &|record| {
        record["additionalProperties"] = json!(false);
        record["properties"]["kind"]["enum"] = json!(RecordKind::ALL.map(RecordKind::as_str));
        record["properties"]["org"]["pattern"] = json!(ORG_ID_PATTERN);
        record["properties"]["data"]["type"] = json!("object");
    });
    patch("/paths", &|paths| {
        for (path, item) in paths.as_object_mut().into_iter().flatten() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for (method, operation) in item.as_object_mut().into_iter().flatten() {
                if !matches!(method.as_str(), "get" | "put" | "post" | "delete" | "patch") {
                    continue;
                }
                let has_body = operation.get("requestBody").is_some();
                let responses = &mut operation["responses"];
                for (status, response) in answers_of_every_keyed_operation(has_body) {
                    if responses.get(status).is_none() {
                        responses[status] = response;
                    }
                }
            }
        }
    });
    missing
}

/// What every keyed `/v1` operation may answer whatever its handler: 429 over the key's rate
/// limit or daily quota (with `Retry-After`), 503 when the database is unreachable or handling outlasts its
/// limit, and for those with a body 400, 413 and 415. Written here, so a new route cannot
/// forget them.
fn answers_of_every_keyed_operation(has_body: bool) -> Vec<(&'static str, Value)> {
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        })
    };
    let mut rate_limited = error(
        "The key's request rate limit (`rate_limited`) or daily quota (`quota_exceeded`) is exceeded; retry after `Retry-After` seconds",
    );
    rate_limited["headers"] = json!({"Retry-After": {
        "description": "Whole seconds to wait before the key is admitted again",
        "schema": {"type": "integer", "minimum": 1}
    }});
    let mut answers = vec![
        ("429", rate_limited),
        (
            "503",
            error("The database is unreachable, or handling took longer than the server's limit"),
        ),
    ];
    if has_body {
        answers.extend([
            ("400", error("The body is not JSON")),
            (
                "413",
                error("The body is larger than the server's limit (`serve --body-limit`)"),
            ),
            (
                "415",
                error("The body is not declared as `application/json`"),
            ),
        ]);
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recommend::ope::TargetPolicy;

    #[test]
    fn every_rule_finds_its_target_in_the_generated_document() {
        let mut document = serde_json::to_value(crate::api::generated_document()).unwrap();
        assert_eq!(refine(&mut document), Vec::<&str>::new());
        assert!(document["components"]["schemas"]["AgentConfig"]["required"].is_array());
    }

    /// The OPE `policy` parameter's pattern accepts exactly what `TargetPolicy::parse` does.
    #[test]
    fn the_policy_pattern_is_target_policy_parse() {
        let document = crate::api::openapi_document().0;
        let parameters = document["paths"]["/v1/analytics/ope"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let policy = parameters.iter().find(|p| p["name"] == "policy").unwrap();
        assert_eq!(policy["in"], "query");
        let validator = jsonschema::draft202012::new(&policy["schema"]).unwrap();
        let mut names: Vec<String> = [
            "heuristic",
            "lowest_cost",
            "uniform",
            "type:",
            "type:x",
            " heuristic",
            "Heuristic",
        ]
        .map(str::to_owned)
        .to_vec();
        names.extend(RecommendationType::ALL.map(|t| format!("type:{}", t.as_str())));
        names.extend(RecommendationType::ALL.map(|t| t.as_str().to_owned()));
        for name in names {
            assert_eq!(
                validator.is_valid(&json!(name)),
                TargetPolicy::parse(&name).is_some(),
                "{name}"
            );
        }
    }
}
