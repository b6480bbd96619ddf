//! The HTTP API: authentication and roles, error bodies that name the field, size limits,
//! trajectories ingest, analytics, OpenAPI.

use serde_json::{Value, json};

use crate::helpers::{Limits, contract_lines, spawn_app, spawn_app_with};

fn contract_records() -> Value {
    Value::Array(
        contract_lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    )
}

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("error bodies are JSON");
    (status, body["error"].clone())
}

#[tokio::test]
async fn health_and_readiness_need_no_key() {
    let app = spawn_app().await;
    assert_eq!(app.get("/healthz", None).await.status(), 200);
    assert_eq!(app.get("/readyz", None).await.status(), 200);
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    assert!(metrics.contains("http_server_request"), "{metrics}");
}

#[tokio::test]
async fn keys_and_roles() {
    let app = spawn_app().await;
    let body = contract_records();
    let (status, error) = error_of(app.post("/v1/trajectories", None, &body).await).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let forged = format!("arc_{}_{}", "0".repeat(16), "0".repeat(64));
    assert_eq!(
        app.post("/v1/trajectories", Some(&forged), &body)
            .await
            .status(),
        401
    );
    let (status, error) = error_of(
        app.post("/v1/trajectories", Some(&app.analyst_key), &body)
            .await,
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        error["message"].as_str().unwrap().contains("analyst"),
        "{error}"
    );
    assert_eq!(
        app.get(
            "/v1/analytics/acceptance?group_by=type",
            Some(&app.platform_key)
        )
        .await
        .status(),
        403
    );
    assert_eq!(
        app.get(
            "/v1/analytics/acceptance?group_by=type",
            Some(&app.admin_key)
        )
        .await
        .status(),
        200
    );
}

#[tokio::test]
async fn trajectories_store_durably_and_idempotently() {
    let app = spawn_app().await;
    let body = contract_records();
    let response = app
        .post("/v1/trajectories", Some(&app.platform_key), &body)
        .await;
    assert_eq!(response.status(), 201);
    let report: Value = response.json().await.unwrap();
    assert_eq!(
        report,
        json!({"records": 7, "inserted": 7, "updated": 0, "unchanged": 0})
    );
    // A 201 means the rows are committed: visible to another connection right away.
    let outcomes: i64 = sqlx::query_scalar("SELECT count(*) FROM outcomes")
        .fetch_one(app.db.pool())
        .await
        .unwrap();
    assert_eq!(outcomes, 1);
    let again: Value = app
        .post("/v1/trajectories", Some(&app.platform_key), &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["unchanged"], 7);
    // One record on its own is accepted too.
    let one = body[2].clone();
    assert_eq!(
        app.post("/v1/trajectories", Some(&app.platform_key), &one)
            .await
            .status(),
        201
    );
}

#[tokio::test]
async fn bad_bodies_name_the_field() {
    let app = spawn_app().await;
    let key = Some(app.platform_key.as_str());
    let mut body = contract_records();
    body[1]["data"]["parsed_config"]["temperature"] = json!(7);
    let (status, error) = error_of(app.post("/v1/trajectories", key, &body).await).await;
    assert_eq!(status, 422);
    assert_eq!(
        error["fields"][0]["field"], "[1].data.parsed_config.temperature",
        "{error}"
    );

    let mut body = contract_records();
    body[2]["data"]["difficulty"] = json!("hard");
    let (status, error) = error_of(app.post("/v1/trajectories", key, &body).await).await;
    assert_eq!(status, 422);
    assert_eq!(
        error["fields"][0]["field"], "[2].data.difficulty",
        "{error}"
    );

    let mut body = contract_records();
    body[0]["org"] = json!("globex");
    let (status, error) = error_of(app.post("/v1/trajectories", key, &body).await).await;
    assert_eq!(status, 422);
    assert_eq!(error["fields"][0]["field"], "[0].org");

    let malformed = app
        .client
        .post(format!("{}/v1/trajectories", app.address))
        .bearer_auth(&app.platform_key)
        .header("content-type", "application/json")
        .body("{\"kind\": ")
        .send()
        .await
        .unwrap();
    let (status, error) = error_of(malformed).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (400, Some("malformed_json"))
    );

    let (status, error) = error_of(
        app.get(
            "/v1/analytics/acceptance?group_by=colour",
            Some(&app.analyst_key),
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(error["fields"][0]["field"], "group_by");
    // Nothing of the rejected bodies was written.
    let configs: i64 = sqlx::query_scalar("SELECT count(*) FROM configurations")
        .fetch_one(app.db.pool())
        .await
        .unwrap();
    assert_eq!(configs, 0);
}

#[tokio::test]
async fn oversized_body_is_413() {
    let app = spawn_app_with(Limits {
        body: 1024,
        ..Limits::default()
    })
    .await;
    let body = contract_records();
    let (status, error) = error_of(
        app.post("/v1/trajectories", Some(&app.platform_key), &body)
            .await,
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (413, Some("payload_too_large"))
    );
}

/// What Schemathesis found, each fixed: an undeclared method on a known path is 405 with
/// `Allow`, an unknown path a JSON 404; a NUL character is a 422 naming its field (Postgres
/// cannot store it; it was a 500); an array where the document says object is refused (serde
/// reads a struct from an array); `3.0` is the integer 3, as JSON Schema counts it.
#[tokio::test]
async fn the_api_answers_as_its_openapi_document_says() {
    let app = spawn_app().await;
    let response = app
        .client
        .delete(format!("{}/v1/recommendations", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["allow"], "POST");
    let (status, error) = error_of(response).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    let (status, error) = error_of(app.get("/v1/nothing", None).await).await;
    assert_eq!((status, error["code"].as_str()), (404, Some("not_found")));

    let key = Some(app.platform_key.as_str());
    let mut request = crate::helpers::contract_request();
    request["failure_context"]["failures"][0]["tool_name"] = json!("web\u{0}search");
    let (status, error) = error_of(app.post("/v1/recommendations", key, &request).await).await;
    assert_eq!(status, 422);
    assert_eq!(
        error["fields"][0]["field"],
        "failure_context.failures[0].tool_name"
    );
    let mut record: Value = serde_json::from_str(&contract_lines()[0]).unwrap();
    record["data"]["user_id"] = json!("u\u{0}");
    let (status, error) = error_of(app.post("/v1/trajectories", key, &record).await).await;
    assert_eq!(
        (status, error["fields"][0]["field"].as_str()),
        (422, Some("data.user_id"))
    );

    let mut request = crate::helpers::contract_request();
    request["user_context"] = json!(["senior_ml_engineer", "fintech"]);
    let (status, error) = error_of(app.post("/v1/recommendations", key, &request).await).await;
    assert_eq!(
        (status, error["fields"][0]["field"].as_str()),
        (422, Some("user_context"))
    );
    let mut request = crate::helpers::contract_request();
    request["failure_context"]["failure_cluster_embedding"] = json!([3.5e38]);
    let (status, error) = error_of(app.post("/v1/recommendations", key, &request).await).await;
    assert_eq!(
        (status, error["fields"][0]["field"].as_str()),
        (422, Some("failure_context.failure_cluster_embedding[0]"))
    );

    let response = app
        .post(
            "/v1/recommendations",
            key,
            &crate::helpers::contract_request(),
        )
        .await;
    let shown: Value = response.json().await.unwrap();
    let feedback = json!({
        "event_id": shown["event_id"],
        "recommendation_id": shown["recommendations"][0]["recommendation_id"],
        "outcome": "accepted",
        "feedback_score": 3.0
    });
    assert_eq!(app.post("/v1/feedback", key, &feedback).await.status(), 201);
}

/// A request whose handling outlasts the server's limit is answered 503 with its own code (here
/// a limit no database round trip fits in), and counted in the metrics.
#[tokio::test]
async fn handling_past_the_limit_is_503() {
    let app = spawn_app_with(Limits {
        handling: std::time::Duration::from_nanos(1),
        ..Limits::default()
    })
    .await;
    let response = app
        .post(
            "/v1/trajectories",
            Some(&app.platform_key),
            &contract_records(),
        )
        .await;
    let (status, error) = error_of(response).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (503, Some("handling_timeout"))
    );
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    assert!(metrics.contains("timed_out"), "{metrics}");
}

/// 400 requests from one key as fast as one client sends them: the role's limit (analysts:
/// 20/s with a burst of 40) lets the burst through and answers the rest 429 with a whole-second
/// `Retry-After`, after which the key is admitted again; another key is not held back.
#[tokio::test]
async fn rapid_requests_from_one_key_get_429_with_retry_after() {
    let app = spawn_app().await;
    let path = "/v1/analytics/acceptance?group_by=type";
    let started = std::time::Instant::now();
    let (mut ok, mut limited, mut retry_after) = (0u32, 0u32, Vec::new());
    for _ in 0..400 {
        let response = app.get(path, Some(&app.analyst_key)).await;
        match response.status().as_u16() {
            200 => ok += 1,
            429 => {
                limited += 1;
                let header = response.headers()["retry-after"].to_str().unwrap();
                retry_after.push(header.parse::<u64>().expect("whole seconds"));
                if limited == 1 {
                    let (_, error) = error_of(response).await;
                    assert_eq!(error["code"], "rate_limited", "{error}");
                }
            }
            other => panic!("status {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(ok + limited, 400);
    assert!(ok >= 40, "the burst passes: {ok} admitted");
    assert!(
        f64::from(ok) <= 40.0 + 20.0 * elapsed + 1.0,
        "{ok} admitted in {elapsed:.2} s is over 20/s with a burst of 40"
    );
    assert!(limited > 0);
    assert!(retry_after.iter().all(|&s| s >= 1), "{retry_after:?}");
    assert_eq!(
        app.get(path, Some(&app.admin_key)).await.status(),
        200,
        "keys are limited one by one"
    );
    tokio::time::sleep(std::time::Duration::from_secs(*retry_after.last().unwrap())).await;
    assert_eq!(app.get(path, Some(&app.analyst_key)).await.status(), 200);
}

/// A key's own limit (`keys create|set-rate-limit --rate-limit`) wins over its role's.
#[tokio::test]
async fn a_key_s_own_rate_limit_wins_over_its_role_s() {
    use arc_rec::auth::{Role, create_key};
    use arc_rec::rate_limit::RateLimit;
    let app = spawn_app().await;
    let org = arc_rec::domain::OrgId::parse("acme").unwrap();
    let limit = RateLimit::new(0.5, 2).unwrap();
    let key = create_key(
        app.db.pool(),
        &org,
        Role::Analyst,
        None,
        arc_rec::auth::KeyLimits {
            rate_limit: Some(limit),
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .token;
    let path = "/v1/analytics/acceptance?group_by=type";
    for _ in 0..2 {
        assert_eq!(app.get(path, Some(&key)).await.status(), 200);
    }
    let response = app.get(path, Some(&key)).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
}

/// Daily quotas: a role's (`serve --daily-quota`) and a key's own (which wins); the request
/// over it is 429 `quota_exceeded` with Retry-After to the next 00:00 UTC; the count is stored,
/// so a second server (a replica, or this one restarted) refuses the key too.
#[tokio::test]
async fn a_key_over_its_daily_quota_gets_429_until_midnight_on_every_replica() {
    use arc_rec::auth::{KeyLimits, Role, create_key};
    use arc_rec::quota::DailyQuota;
    let mut quotas = arc_rec::auth::RoleQuotas::default();
    quotas.apply(&"analyst=3".parse().unwrap());
    let limits = Limits {
        quotas,
        ..Limits::default()
    };
    let app = spawn_app_with(limits.clone()).await;
    let org = arc_rec::domain::OrgId::parse("acme").unwrap();
    let own = create_key(
        app.db.pool(),
        &org,
        Role::Analyst,
        None,
        KeyLimits {
            daily_quota: Some(DailyQuota(5)),
            ..KeyLimits::default()
        },
    )
    .await
    .unwrap()
    .token;
    let path = "/v1/analytics/acceptance?group_by=type";
    for (key, quota) in [(&app.analyst_key, 3), (&own, 5)] {
        for i in 0..quota {
            assert_eq!(app.get(path, Some(key)).await.status(), 200, "request {i}");
        }
        let (status, error) = error_of(app.get(path, Some(key)).await).await;
        assert_eq!(status, 429);
        assert_eq!(error["code"], "quota_exceeded", "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(&format!("{quota} requests")), "{message}");
    }
    let response = app.get(path, Some(&own)).await;
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let to_midnight = arc_rec::quota::seconds_to_next_day(chrono::Utc::now());
    assert!(
        retry_after.abs_diff(to_midnight) <= 2,
        "{retry_after} vs {to_midnight}"
    );
    // Admin keys have no quota by default.
    for _ in 0..8 {
        assert_eq!(app.get(path, Some(&app.admin_key)).await.status(), 200);
    }
    // Stored as `serve` does every second: a second server reads the count and refuses the key
    // at its first request; a key under its quota is still admitted there.
    arc_rec::storage::api_keys::store_usage(app.db.pool(), &limits.quota_ledger)
        .await
        .unwrap();
    let used: Vec<(i64,)> = sqlx::query_as("SELECT requests FROM api_key_usage ORDER BY requests")
        .fetch_all(app.db.pool())
        .await
        .unwrap();
    assert_eq!(used, vec![(3,), (5,)], "refused requests count nothing");
    let (replica, _serving, _handle) = crate::helpers::spawn_server(
        app.db.pool(),
        Limits {
            quota_ledger: Default::default(),
            ..limits
        },
    )
    .await;
    let response = app
        .client
        .get(format!("{replica}{path}"))
        .bearer_auth(&own)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let platform = app
        .client
        .post(format!("{replica}/v1/recommendations"))
        .bearer_auth(&app.platform_key)
        .json(&crate::helpers::contract_request())
        .send()
        .await
        .unwrap();
    assert_ne!(platform.status(), 429, "the platform role has no quota");
}

#[tokio::test]
async fn openapi_lists_every_route() {
    let app = spawn_app().await;
    let document: Value = app.get("/openapi.json", None).await.json().await.unwrap();
    let paths: Vec<&str> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/trajectories",
        "/v1/recommendations",
        "/v1/feedback",
        "/v1/analytics/acceptance",
        "/v1/analytics/ope",
    ] {
        assert!(paths.contains(&path), "{path} missing from {paths:?}");
    }
    assert_eq!(
        paths.len(),
        9,
        "a route without an OpenAPI entry, or the other way round: {paths:?}"
    );
    for (path, operations) in document["paths"].as_object().unwrap() {
        if path.starts_with("/v1/") {
            for (method, operation) in operations.as_object().unwrap() {
                let limited = &operation["responses"]["429"];
                assert!(
                    limited["headers"]["Retry-After"].is_object(),
                    "{method} {path}: {limited}"
                );
                assert!(operation["responses"]["503"].is_object(), "{method} {path}");
            }
        }
    }
    for schema in [
        "AcceptanceResponse",
        "RecommendationRequest",
        "RecommendationResponse",
        "FeedbackRequest",
        "OpeResponse",
    ] {
        assert!(
            document["components"]["schemas"][schema].is_object(),
            "{schema}"
        );
    }
    // Kept out of the logged JSON by `skip_serializing`, but still part of the request.
    assert!(
        document["components"]["schemas"]["FailureContextBody"]["properties"]
            ["failure_cluster_embedding"]
            .is_object(),
        "{}",
        document["components"]["schemas"]["FailureContextBody"]
    );
    // Each recommendation says where it came from (an addition to CONTRACTS.md's shape).
    let recommendation = &document["components"]["schemas"]["RecommendationBody"];
    for field in ["source", "model_version_id"] {
        assert!(
            recommendation["properties"][field].is_object(),
            "{field}: {recommendation}"
        );
    }
    assert!(
        document["components"]["schemas"]["CandidateOrigin"]["enum"]
            .as_array()
            .is_some_and(|values| values.len() == 2),
        "{}",
        document["components"]["schemas"]["CandidateOrigin"]
    );
    assert!(document["components"]["securitySchemes"]["api_key"].is_object());
}
