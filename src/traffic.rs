//! The synthetic world as a platform's users, over HTTP (`arc-rec bench loop`): a phase sends
//! one organization's stream of failure contexts to a running `arc-rec serve` (`POST
//! /v1/recommendations`), answers the shown top item from the world's acceptance model (`POST
//! /v1/feedback`), and notes each shown item's *true* acceptance probability for the scores
//! (`recommend::loop_bench`). The server never sees the world: only what a platform sends.
//! Imports only `world`.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::world::{Context, Environment};

/// Why a phase could not be played.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("request to arc-rec serve failed")]
    Http(#[from] reqwest::Error),
    #[error("arc-rec serve answered {status} to {what}: {body}")]
    Status {
        what: &'static str,
        status: u16,
        body: String,
    },
    #[error("arc-rec serve's answer lacks {0}")]
    Answer(&'static str),
    #[error("world has no context of organization {0} in 100,000 draws")]
    NoContext(String),
}

/// Where the traffic goes.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `http://host:port`.
    pub base_url: String,
    /// A platform key of the organization.
    pub key: String,
}

/// One shown item as the phase scored it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShownItem {
    pub recommendation_id: String,
    pub model_version_id: Option<String>,
    /// The world's acceptance probability of its diff in the decision's context.
    pub truth: f64,
}

/// One decision of a phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Played {
    pub event_id: Uuid,
    /// Best first, as shown.
    pub shown: Vec<ShownItem>,
    /// The drawn answer to the top item.
    pub accepted: bool,
}

/// The first `n` contexts of `org` in traffic stream `seed`: the same every phase, so phases
/// compare on the same traffic.
pub fn contexts(
    environment: &Environment,
    org: &str,
    n: usize,
    seed: u64,
) -> Result<Vec<Context>, LoopError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut found = Vec::with_capacity(n);
    let mut draws = 0usize;
    while found.len() < n {
        let ctx = environment.next_context(&mut rng);
        draws += 1;
        if ctx.org == org {
            found.push(ctx);
        } else if draws > 100_000 && found.is_empty() {
            return Err(LoopError::NoContext(org.to_owned()));
        }
    }
    Ok(found)
}

/// The recommendation request for a world context (what the platform sends: its failures,
/// embedding, configuration and user; `k` items).
pub fn request_body(ctx: &Context, k: usize) -> Value {
    let mut failure_context = json!({ "failures": ctx.failures });
    if let Some(embedding) = &ctx.embedding {
        failure_context["failure_cluster_embedding"] = json!(embedding);
    }
    json!({
        "failure_context": failure_context,
        "current_config": ctx.current_config,
        "user_context": {"user_role": ctx.user.role, "domain": ctx.user.domain},
        "k": k,
    })
}

/// Plays one phase: every context once, the top item answered with a draw from stream
/// `answer_seed`.
pub async fn play(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    environment: &Environment,
    contexts: &[Context],
    k: usize,
    answer_seed: u64,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Played>, LoopError> {
    let mut answers = ChaCha8Rng::seed_from_u64(answer_seed);
    let mut played = Vec::with_capacity(contexts.len());
    for (i, ctx) in contexts.iter().enumerate() {
        let body = post(
            client,
            endpoint,
            "/v1/recommendations",
            &request_body(ctx, k),
        )
        .await?;
        let event_id: Uuid = body["event_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or(LoopError::Answer("event_id"))?;
        let shown = body["recommendations"]
            .as_array()
            .ok_or(LoopError::Answer("recommendations"))?
            .iter()
            .map(|item| {
                Ok(ShownItem {
                    recommendation_id: item["recommendation_id"]
                        .as_str()
                        .ok_or(LoopError::Answer("recommendation_id"))?
                        .to_owned(),
                    model_version_id: item["model_version_id"].as_str().map(str::to_owned),
                    truth: environment.acceptance_probability(ctx, &item["diff"]),
                })
            })
            .collect::<Result<Vec<_>, LoopError>>()?;
        let mut accepted = false;
        if let Some(top) = body["recommendations"].get(0) {
            let answer = environment.feedback(ctx, &top["diff"], &mut answers);
            accepted = answer.accepted;
            let feedback = json!({
                "event_id": event_id,
                "recommendation_id": shown[0].recommendation_id,
                "outcome": if accepted { "accepted" } else { "rejected" },
                "reliability_delta": answer.reliability_delta,
            });
            post(client, endpoint, "/v1/feedback", &feedback).await?;
        }
        played.push(Played {
            event_id,
            shown,
            accepted,
        });
        progress(i + 1);
    }
    Ok(played)
}

async fn post(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    path: &'static str,
    body: &Value,
) -> Result<Value, LoopError> {
    let response = client
        .post(format!("{}{path}", endpoint.base_url))
        .bearer_auth(&endpoint.key)
        .json(body)
        .send()
        .await?;
    let status = response.status();
    if !status.is_success() {
        return Err(LoopError::Status {
            what: path,
            status: status.as_u16(),
            body: response.text().await.unwrap_or_default(),
        });
    }
    Ok(response.json().await.unwrap_or(Value::Null))
}
