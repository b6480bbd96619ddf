//! The serving state: per organization, the candidate statistics, the cluster model and the
//! published bandit policy; a learner task per organization that applies feedback; and a
//! poller that picks up feedback other replicas stored, so every replica converges on the same
//! posterior (the linear model's updates commute, so arrival order does not matter), and model
//! candidates a new model version stored (`MODEL_CANDIDATES_RELOAD_BOUND`).
//!
//! Requests read an immutable `Arc<ThompsonPolicy>` snapshot and never wait for learning; the
//! learner applies observations in small batches, refreshes the posterior draws, and publishes
//! a new snapshot.
//!
//! A new organization (no snapshot of this policy version) first learns the platform's own
//! logged decisions (`recommend::warm_start`): its learner reads the newest
//! [`WARM_START_DECISIONS`] decided config diffs made before the organization's first decision
//! here, and rebuilds its policy from those matched to a candidate (stamped at the newest one's
//! time) before it learns any feedback. Requests rank with the prior meanwhile.
//!
//! Start-up at scale: each learner stores what it has learned in `bandit_state`
//! (`recommend::snapshot`) every [`SNAPSHOT_EVERY_LESSONS`] lessons or [`SNAPSHOT_INTERVAL`],
//! and when the server stops ([`Serving::snapshot_all`]); a server starts from the snapshots of
//! its policy version and replays only the feedback received after them, so start-up costs
//! the tail of the log, not all of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bandit::{Observation, ThompsonPolicy};
use chrono::{DateTime, Utc};
use rand::Rng;
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::PgPool;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::candidate_log::{self, CandidateEntry, CandidateLogError};
use super::decision_writer::{DecisionWriteError, DecisionWriter};
use super::engine::{
    Evidence, FloorRequest, RecommendError, RecommendInput, Shown, learning_reward, prepare, rank,
    timestamp_s,
};
use super::exposure::{ExplorationFloorOptions, Exposure, ExposureCap};
use super::features::{layout, policy_config};
use super::placement::{PlacementError, place};
use super::snapshot::{LearnedRow, Ledger, Lesson, OrgSnapshot, SNAPSHOT_FORMAT};
use super::warm_start::{LoggedDecision, WarmStartCounts};
use crate::candidates::{CandidateIndex, FailureObservation, provider_of};
use crate::clustering::{ClusterError, ClusterModel};
use crate::domain::Candidate;
use crate::storage::StorageError;
use crate::storage::bandit_state::{load_snapshots, save_snapshot};
use crate::storage::candidate_stats::{
    ModelCandidatesMark, load_model_candidates_by_cluster, model_candidates_marks,
};
use crate::storage::decisions::{
    DecisionItemRecord, DecisionRecord, FeedbackOutcome, FeedbackRecord, FeedbackStored,
    LearnableFeedback, exposure_counts, failures_of_outcomes, feedback_after, feedback_for,
    feedback_since, insert_feedback,
};
use crate::storage::export_rows::warm_start_rows;

/// A new organization's warm start learns at most this many of the platform's logged decisions
/// (the newest): reading and matching them costs about a millisecond each, off the request path,
/// and one older than a few half-lives weighs next to nothing anyway.
pub const WARM_START_DECISIONS: usize = 20_000;
/// How often replicas look for each other's feedback and for new model candidates.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// A model version's candidates stored by `arc-rec candidates` reach every running replica
/// within this long: one poll interval, then one load of the organization's model candidates
/// (a query of at most 2,000 rows).
pub const MODEL_CANDIDATES_RELOAD_BOUND: Duration = Duration::from_secs(3);
/// Feedback rows are re-read this far back on every poll: `received_at` is set at insert, and a
/// row may commit a little after a later row; re-reading a window (and skipping what was
/// applied) catches it.
const POLL_OVERLAP: chrono::TimeDelta = chrono::TimeDelta::seconds(30);
/// Answers received this long before the newest one polled are no longer remembered as
/// learned: no poll re-reads them (twice the re-read window, for margin).
const FORGET_LEARNED_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(60);
/// Old evidence is discounted (half-life in `PolicyConfig`) at the start of each epoch of this
/// length, on epoch boundaries of Unix time: every replica decays at the same instants, and the
/// linear model's state depends only on the observations and that clock, so replicas agree.
const DECAY_EPOCH_S: f64 = 86_400.0;
/// The learner publishes at most this often.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(200);
/// A learner applies at most this many lessons between publications, so a long backlog (the
/// start-up replay) reaches requests, and snapshots, in steps of about a second.
const MAX_BATCH: usize = 2_000;
/// A learner stores a snapshot after this many lessons since its last one...
pub const SNAPSHOT_EVERY_LESSONS: u64 = 20_000;
/// ...or this long after its last one when it has learned anything since.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(60);
/// A snapshot covers every row received up to this long before the newest it learned (plus the
/// rows it lists): the poll's re-read window and a poll interval of margin, since a row
/// committed just before the snapshot may not have been polled yet.
const SNAPSHOT_OVERLAP: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// A failure context to recommend for, validated.
#[derive(Debug, Clone)]
pub struct RecommendationQuery {
    pub embedding: Option<Vec<f32>>,
    pub failures: Vec<FailureObservation>,
    pub outcome_ids: Vec<String>,
    pub current_config: Value,
    pub user_role: Option<String>,
    pub domain: Option<String>,
    pub k: usize,
    pub max_cost_increase_usd_per_run: Option<f64>,
    /// The request as received, without `failure_context.failure_cluster_embedding` (logged
    /// in a column of its own), serialized for the decision log.
    pub raw: Box<RawValue>,
}

/// A served recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub recommendation_id: String,
    pub shown: Shown,
}

/// The answer to a recommendation request.
#[derive(Debug, Clone, PartialEq)]
pub struct RecommendationAnswer {
    pub event_id: Uuid,
    pub policy_version: String,
    pub cluster_id: Option<String>,
    pub recommendations: Vec<Served>,
}

/// Why a request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The context could not be placed (wrong embedding dimension, unknown outcomes...).
    #[error("{field}: {message}")]
    Context { field: String, message: String },
    /// No such event or recommendation in this organization.
    #[error("no recommendation {recommendation_id} in event {event_id}")]
    UnknownRecommendation {
        event_id: Uuid,
        recommendation_id: String,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Cluster(ClusterError),
    #[error(transparent)]
    Rank(#[from] RecommendError),
    #[error(transparent)]
    Log(#[from] DecisionWriteError),
    /// The candidate set could not be encoded for the log (over 65,535 candidates, or an id
    /// over 65,535 bytes: not expected).
    #[error("cannot encode the decision for the log")]
    LogEncoding(#[source] CandidateLogError),
    /// A lock holder panicked; the state may be inconsistent.
    #[error("serving state lock poisoned")]
    Poisoned,
    /// A snapshot could not be encoded (not expected: plain numbers and strings).
    #[error("cannot encode a bandit snapshot")]
    SnapshotEncoding(#[source] serde_json::Error),
    /// The organization's learner has stopped (the server is shutting down).
    #[error("the learner of {0} has stopped")]
    LearnerStopped(String),
}

/// The recommender model's candidates with the cluster each was generated for (`None`: any).
type ModelCandidates = Vec<(Option<String>, Candidate)>;

/// What is loaded from the database per organization.
type OrgData = (CandidateIndex, Option<ClusterModel>, ModelCandidates);

/// One organization's serving state.
struct OrgServing {
    policy: RwLock<Arc<ThompsonPolicy>>,
    index: RwLock<Arc<CandidateIndex>>,
    clusters: RwLock<Option<Arc<ClusterModel>>>,
    /// The recommender model's candidates, by cluster (`None`: for every cluster).
    model_candidates: RwLock<Arc<ModelCandidates>>,
    /// Each priced model candidate's own evidence (by candidate id, and pooled by model version
    /// under `engine::version_key`): its answers, whose surprise against the shared model
    /// corrects its prior (`engine::prior_offset`).
    evidence: RwLock<Evidence>,
    /// Decisions headed by each model version and answers about its candidates (the exposure
    /// cap on new versions).
    exposure: Mutex<Exposure>,
    /// What the policy learned from the platform's logged decisions, once its warm start is
    /// done (or restored with its snapshot).
    warm_start: OnceLock<WarmStartCounts>,
    learner: mpsc::UnboundedSender<ToLearner>,
}

/// What a learner is sent.
#[derive(Debug)]
enum ToLearner {
    /// An answer to learn: the shared model's observation and the rest of the lesson.
    Learn(Box<(Observation, Lesson)>),
    /// Store a snapshot now (after everything sent before) and say whether it was stored.
    Snapshot(tokio::sync::oneshot::Sender<Result<(), ServeError>>),
}

/// An organization's policy and ledger restored from its snapshot.
type Restored = (ThompsonPolicy, Ledger);

/// How serving runs (beyond the database).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServingOptions {
    /// The exposure cap on new model versions.
    pub exposure_cap: ExposureCap,
    /// The exploration floor for the newest model version's unanswered ideas.
    pub exploration: ExplorationFloorOptions,
}

/// How a server's state was loaded at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StartupReport {
    /// Organizations whose learner started from a stored snapshot.
    pub restored: usize,
    /// Feedback rows replayed (past the snapshots, and all of other organizations').
    pub replayed: usize,
    /// Time from the first query to the last row handed to a learner.
    pub seconds: f64,
}

/// The serving state of every organization.
pub struct Serving {
    pool: PgPool,
    options: ServingOptions,
    writer: DecisionWriter,
    policy_version: String,
    orgs: RwLock<HashMap<String, Arc<OrgServing>>>,
    /// Serialises first loads of an organization: concurrent first requests wait for one load
    /// instead of all running the statistics queries (a thundering herd at start-up).
    loading: tokio::sync::Mutex<()>,
    /// (event, recommendation) pairs learned from lately, with when their answer was received:
    /// an answer is learned at once on the server it reached, and again seen by the poller's
    /// re-read window; this keeps it from being learned twice. Entries older than that window
    /// are forgotten ([`FORGET_LEARNED_AFTER`]), so memory does not grow with the feedback log
    /// (whether an answer is an item's first is decided in SQL).
    learned: Mutex<HashMap<(Uuid, String), DateTime<Utc>>>,
    /// Per loaded organization, the model candidates' mark when they were last loaded.
    model_marks: Mutex<HashMap<String, ModelCandidatesMark>>,
    startup: Mutex<StartupReport>,
    /// The runtime `start` ran on, where learners and the poller run: not an HTTP worker's
    /// (a request may load an organization), whose runtime ends with the server while the
    /// learners must outlive it to store their snapshots.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("policy_version", &self.policy_version)
            .finish_non_exhaustive()
    }
}

/// The policy version: the model, its configuration and the feature layout, hashed, so every
/// replica and restart of the same code reports the same version.
pub fn policy_version() -> String {
    use sha2::Digest;
    // "warm start": policies since learn the platform's logged decisions first, so a snapshot
    // of one that did not is not restored.
    let description = format!("{:?}|{:?}|warm start", layout(), policy_config());
    let digest = sha2::Sha256::digest(description.as_bytes());
    format!("ts-linear-{}", hex::encode(&digest[..4]))
}

impl Serving {
    /// [`Serving::start_with`] the default options.
    pub async fn start(pool: PgPool) -> Result<Arc<Self>, ServeError> {
        Self::start_with(pool, ServingOptions::default()).await
    }

    /// Loads every organization's statistics and cluster model, rebuilds the bandit from all
    /// stored feedback, and starts the learners and the feedback poller.
    pub async fn start_with(
        pool: PgPool,
        options: ServingOptions,
    ) -> Result<Arc<Self>, ServeError> {
        let serving = Arc::new(Self {
            writer: DecisionWriter::spawn(pool.clone()),
            options,
            pool,
            policy_version: policy_version(),
            orgs: RwLock::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            learned: Mutex::new(HashMap::new()),
            model_marks: Mutex::new(HashMap::new()),
            startup: Mutex::new(StartupReport::default()),
            runtime: tokio::runtime::Handle::current(),
        });
        let started = std::time::Instant::now();
        let mut cutoffs = Vec::new();
        let mut watermark = None;
        for stored in load_snapshots(&serving.pool, &serving.policy_version).await? {
            let org = stored.org_id;
            match OrgSnapshot::restore(stored.state_version, &stored.state) {
                Ok((policy, ledger)) => {
                    if let Some(after) = ledger.replay_after(SNAPSHOT_OVERLAP) {
                        cutoffs.push((org.clone(), after));
                    }
                    watermark = watermark.max(ledger.learned_through);
                    serving.learned.lock().map_err(|_| poisoned())?.extend(
                        ledger.recent.iter().map(|row| {
                            (
                                (row.event_id, row.recommendation_id.clone()),
                                row.received_at,
                            )
                        }),
                    );
                    serving.install(&org, Some((policy, ledger))).await?;
                }
                // A snapshot this server cannot use costs time, not correctness: replay all.
                Err(err) => {
                    tracing::warn!(org = %org, error = %err, "bandit snapshot unusable; replaying the whole log");
                }
            }
        }
        let restored = cutoffs.len();
        let tail = feedback_after(&serving.pool, &cutoffs).await?;
        let replayed = tail.len();
        watermark = watermark.max(tail.iter().map(|f| f.received_at).max());
        for feedback in tail {
            serving.learn(feedback).await?;
        }
        let report = StartupReport {
            restored,
            replayed,
            seconds: started.elapsed().as_secs_f64(),
        };
        tracing::info!(
            restored,
            replayed,
            seconds = report.seconds,
            "serving state loaded: organizations restored from snapshots, feedback rows replayed"
        );
        *serving.startup.lock().map_err(|_| poisoned())? = report;
        serving
            .runtime
            .spawn(poll_feedback(Arc::downgrade(&serving), watermark));
        Ok(serving)
    }

    /// Has every loaded organization's learner store a snapshot of what it has learned so far
    /// (called when the server stops, so the next start replays nothing). Returns how many
    /// were stored.
    pub async fn snapshot_all(&self) -> Result<usize, ServeError> {
        let learners: Vec<(String, mpsc::UnboundedSender<ToLearner>)> = self
            .orgs
            .read()
            .map_err(|_| poisoned())?
            .iter()
            .map(|(org, state)| (org.clone(), state.learner.clone()))
            .collect();
        let mut stored = 0;
        for (org, learner) in learners {
            let (reply, answer) = tokio::sync::oneshot::channel();
            learner
                .send(ToLearner::Snapshot(reply))
                .map_err(|_| ServeError::LearnerStopped(org.clone()))?;
            answer
                .await
                .map_err(|_| ServeError::LearnerStopped(org.clone()))??;
            stored += 1;
        }
        Ok(stored)
    }

    /// Forgets the learned answers received before `cutoff` (no poll reads them again).
    fn forget_learned_before(&self, cutoff: DateTime<Utc>) {
        if let Ok(mut learned) = self.learned.lock() {
            learned.retain(|_, received_at| *received_at >= cutoff);
        }
    }

    /// How many answers this server remembers having learned (bounded by the poll window's
    /// traffic, not by the feedback log).
    pub fn remembered_answers(&self) -> usize {
        self.learned.lock().map_or(0, |learned| learned.len())
    }

    /// How this server's state was loaded.
    pub fn startup(&self) -> StartupReport {
        self.startup.lock().map(|r| *r).unwrap_or_default()
    }

    /// The policy version reported with every decision.
    pub fn policy_version(&self) -> &str {
        &self.policy_version
    }

    /// The policy an organization's requests are currently ranked with (`None` before its first
    /// request or feedback).
    pub fn policy(&self, org: &str) -> Option<Arc<ThompsonPolicy>> {
        let orgs = self.orgs.read().ok()?;
        let state = orgs.get(org)?;
        state.policy.read().ok().map(|p| p.clone())
    }

    /// What an organization's policy learned from the platform's logged decisions before its
    /// first answer (`None` until its warm start is done, or when it has not run: a restored
    /// snapshot taken before warm starts, or a failed read).
    pub fn warm_start(&self, org: &str) -> Option<WarmStartCounts> {
        let orgs = self.orgs.read().ok()?;
        orgs.get(org)?.warm_start.get().copied()
    }

    /// The organization's state, loading it on first use.
    async fn org(&self, org: &str) -> Result<Arc<OrgServing>, ServeError> {
        if let Some(state) = self.orgs.read().ok().and_then(|m| m.get(org).cloned()) {
            return Ok(state);
        }
        self.install(org, None).await
    }

    /// Loads an organization's state (unless another task did meanwhile) with its learner
    /// starting from `restored` (a snapshot) or else from the platform's log (its warm start).
    async fn install(
        &self,
        org: &str,
        restored: Option<Restored>,
    ) -> Result<Arc<OrgServing>, ServeError> {
        let _loading = self.loading.lock().await;
        if let Some(state) = self.orgs.read().ok().and_then(|m| m.get(org).cloned()) {
            return Ok(state);
        }
        let (index, clusters, model_candidates) = self.load_org(org).await?;
        // Answers are counted as feedback is learned (the start-up replay included); decisions
        // and what headed them come from the log.
        let (decisions, headed) = exposure_counts(&self.pool, org).await?;
        let warm_start_due = restored.is_none();
        let (mut policy, ledger) = match restored {
            Some(restored) => restored,
            None => (
                ThompsonPolicy::new(layout(), policy_config()).map_err(RecommendError::from)?,
                Ledger::default(),
            ),
        };
        let exposure = Exposure::new(
            u64::try_from(decisions).unwrap_or(0),
            headed
                .into_iter()
                .map(|(version, n)| (version, u64::try_from(n).unwrap_or(0)))
                .collect(),
            ledger.answers.clone(),
        );
        policy.refresh_bank_seeded(rand::rng().random());
        let (sender, receiver) = mpsc::unbounded_channel();
        let state = Arc::new(OrgServing {
            policy: RwLock::new(Arc::new(policy.clone())),
            index: RwLock::new(Arc::new(index)),
            clusters: RwLock::new(clusters.map(Arc::new)),
            model_candidates: RwLock::new(Arc::new(model_candidates)),
            evidence: RwLock::new(ledger.evidence.clone()),
            exposure: Mutex::new(exposure),
            warm_start: OnceLock::new(),
            learner: sender,
        });
        if let Some(counts) = ledger.warm_start {
            let _ = state.warm_start.set(counts);
        }
        self.runtime.spawn(learn_loop(
            Learner {
                org: org.to_owned(),
                policy,
                ledger,
                pool: self.pool.clone(),
                policy_version: self.policy_version.clone(),
            },
            warm_start_due,
            receiver,
            Arc::downgrade(&state),
        ));
        self.orgs
            .write()
            .map_err(|_| poisoned())?
            .insert(org.to_owned(), state.clone());
        Ok(state)
    }

    /// An organization's statistics, cluster model and model candidates from the database.
    async fn load_org(&self, org: &str) -> Result<OrgData, ServeError> {
        let index = CandidateIndex::load(&self.pool, org).await?;
        let clusters = crate::storage::clusters::load_model(&self.pool, org)
            .await?
            .map(ClusterModel::from_stored)
            .transpose()
            .map_err(ServeError::Cluster)?;
        let model_candidates = load_model_candidates_by_cluster(&self.pool, org).await?;
        Ok((index, clusters, model_candidates))
    }

    /// Reloads the model candidates of every loaded organization whose stored ones changed since
    /// they were last loaded (a new model version from `arc-rec candidates`), so a running
    /// replica serves them within [`MODEL_CANDIDATES_RELOAD_BOUND`] without a restart. An
    /// organization polled for the first time is reloaded once (its candidates may have changed
    /// between its first load and now).
    async fn reload_changed_model_candidates(&self) -> Result<usize, ServeError> {
        let orgs: Vec<String> = self
            .orgs
            .read()
            .map_err(|_| poisoned())?
            .keys()
            .cloned()
            .collect();
        if orgs.is_empty() {
            return Ok(0);
        }
        let marks = model_candidates_marks(&self.pool, &orgs).await?;
        let mut reloaded = 0;
        for (org, mark) in marks {
            let changed = self
                .model_marks
                .lock()
                .map_err(|_| poisoned())?
                .get(&org)
                .is_none_or(|seen| *seen != mark);
            if !changed {
                continue;
            }
            let candidates = load_model_candidates_by_cluster(&self.pool, &org).await?;
            let state = self.org(&org).await?;
            *state.model_candidates.write().map_err(|_| poisoned())? = Arc::new(candidates);
            self.model_marks
                .lock()
                .map_err(|_| poisoned())?
                .insert(org, mark);
            reloaded += 1;
        }
        Ok(reloaded)
    }

    /// Ranks recommendations for a failure context and logs the decision durably.
    pub async fn recommend(
        &self,
        org: &str,
        query: RecommendationQuery,
    ) -> Result<RecommendationAnswer, ServeError> {
        let state = self.org(org).await?;
        let mut failures = query.failures.clone();
        if !query.outcome_ids.is_empty() {
            let stored = failures_of_outcomes(&self.pool, org, &query.outcome_ids).await?;
            if stored.is_empty() && failures.is_empty() && query.embedding.is_none() {
                return Err(ServeError::Context {
                    field: "failure_context.outcome_ids".into(),
                    message: "none of these outcomes has recorded failures in this organization"
                        .into(),
                });
            }
            failures.extend(stored.into_iter().map(|f| FailureObservation {
                failure_category: Some(f.failure_category),
                error_message: Some(f.error_message),
                tool_name: f.tool_name,
                error_code: None,
            }));
        }
        let clusters = state.clusters.read().ok().and_then(|c| c.clone());
        let placement = match &clusters {
            Some(model) => place(model, query.embedding.as_deref(), &failures)?,
            None => None,
        };
        let index = state.index.read().map_err(|_| poisoned())?.clone();
        let cluster = placement.as_ref().map(|p| p.cluster_id.as_str());
        let all_model_candidates = state
            .model_candidates
            .read()
            .map_err(|_| poisoned())?
            .clone();
        let mut model_candidates: Vec<Candidate> = all_model_candidates
            .iter()
            .filter(|(for_cluster, _)| for_cluster.is_none() || for_cluster.as_deref() == cluster)
            .map(|(_, c)| c.clone())
            .collect();
        let (capped_versions, floor) = {
            let exposure = state.exposure.lock().map_err(|_| poisoned())?;
            let capped = exposure.capped(
                &self.options.exposure_cap,
                model_candidates
                    .iter()
                    .filter_map(|c| c.source.model_version_id()),
            );
            // The newest version's ideas come first (stored newest first).
            let floor = all_model_candidates
                .first()
                .and_then(|(_, c)| c.source.model_version_id())
                .filter(|v| {
                    self.options.exploration.share > 0.0
                        && exposure.is_new(&self.options.exposure_cap, v)
                        && !capped.iter().any(|capped| capped == v)
                })
                .map(|v| FloorRequest {
                    share: self.options.exploration.share,
                    model_version_id: v.to_owned(),
                    answers_per_idea: self.options.exploration.answers_per_idea,
                });
            (capped, floor)
        };
        if !capped_versions.is_empty() {
            model_candidates.retain(|c| {
                c.source
                    .model_version_id()
                    .is_none_or(|v| !capped_versions.iter().any(|capped| capped == v))
            });
        }
        let input = RecommendInput {
            current_config: query.current_config.clone(),
            failures,
            cluster_key: placement.as_ref().map(|p| p.label.clone()),
            reduced_embedding: placement.as_ref().map(|p| p.reduced.clone()),
            user_role: query.user_role.clone(),
            domain: query.domain.clone(),
            k: query.k,
            max_cost_increase_usd_per_run: query.max_cost_increase_usd_per_run,
            model_candidates,
        };
        let prepared = prepare(&index, &input);
        let policy = state.policy.read().map_err(|_| poisoned())?.clone();
        let seed: u64 = rand::rng().random();
        let output = {
            let evidence = state.evidence.read().map_err(|_| poisoned())?;
            rank(&policy, prepared, input.k, seed, &evidence, floor.as_ref())?
        };
        // Time-ordered (v7): the decision log's keys then grow at the right edge of their
        // B-trees, so an insert touches the same few hot pages instead of a random leaf (which,
        // after each checkpoint, costs an 8 kB full-page image in the WAL per insert).
        state
            .exposure
            .lock()
            .map_err(|_| poisoned())?
            .record_decision(
                output
                    .shown
                    .first()
                    .and_then(|s| s.candidate.source.model_version_id()),
            );
        let event_id = Uuid::now_v7();
        let cluster_id = placement.map(|p| p.cluster_id);
        let floor_pick = output.ranking.floor_pick;
        let served: Vec<Served> = output
            .shown
            .into_iter()
            .map(|shown| Served {
                recommendation_id: recommendation_id(&shown.candidate.candidate_id),
                shown,
            })
            .collect();
        let decision = DecisionRecord {
            org_id: org.to_owned(),
            event_id,
            created_at: Utc::now(),
            policy_version: self.policy_version.clone(),
            // Logged as signed: Postgres has no unsigned 64-bit type.
            seed: seed as i64,
            cluster_id: cluster_id.clone(),
            context: query.raw,
            context_embedding: query.embedding,
            // Enough to recompute another policy's choice off-line (see `recommend::ope`); the
            // features of shown items are kept with them (what replay learning needs).
            candidate_set: candidate_log(&output.candidates)?,
            context_features: output.context.iter().map(|v| *v as f32).collect(),
            user_role: query.user_role,
            domain: query.domain,
            capped_versions,
            floor_version: output.floor_version,
            floor_pick,
            items: served
                .iter()
                .map(|s| DecisionItemRecord {
                    recommendation_id: s.recommendation_id.clone(),
                    position: s.shown.item.position as i32,
                    recommendation_type: s.shown.candidate.recommendation_type.as_str().to_owned(),
                    model_provider: s
                        .shown
                        .candidate
                        .diff
                        .get("model")
                        .and_then(Value::as_str)
                        .or_else(|| query.current_config.get("model").and_then(Value::as_str))
                        .map(provider_of)
                        .map(str::to_owned),
                    diff: s.shown.candidate.diff.clone(),
                    score: s.shown.item.score,
                    propensity: s.shown.item.propensity,
                    candidate_features: s.shown.features.iter().map(|v| *v as f32).collect(),
                    source: s.shown.candidate.source.clone(),
                    predicted: s.shown.predicted,
                    expected_cost_delta_usd: Some(s.shown.candidate.expected_cost_delta_usd),
                })
                .collect(),
        };
        self.writer.write(decision).await?;
        Ok(RecommendationAnswer {
            event_id,
            policy_version: self.policy_version.clone(),
            cluster_id,
            recommendations: served,
        })
    }

    /// Stores feedback durably (idempotently) and learns from it. Returns whether it was new.
    pub async fn feedback(&self, feedback: FeedbackRecord) -> Result<bool, ServeError> {
        let stored = insert_feedback(&self.pool, &feedback).await?;
        match stored {
            FeedbackStored::UnknownRecommendation => Err(ServeError::UnknownRecommendation {
                event_id: feedback.event_id,
                recommendation_id: feedback.recommendation_id,
            }),
            FeedbackStored::Duplicate => Ok(false),
            FeedbackStored::Inserted => {
                // Learn now rather than at the next poll; the poll will skip it.
                let rows = feedback_for(
                    &self.pool,
                    &feedback.org_id,
                    feedback.event_id,
                    &feedback.recommendation_id,
                )
                .await?;
                for row in rows {
                    self.learn(row).await?;
                }
                Ok(true)
            }
        }
    }

    /// Hands one stored feedback row to its organization's learner, once.
    async fn learn(&self, row: LearnableFeedback) -> Result<(), ServeError> {
        let Some(observation) = observation_of(&row) else {
            return Ok(());
        };
        {
            let mut learned = self.learned.lock().map_err(|_| poisoned())?;
            match learned.entry((row.event_id, row.recommendation_id.clone())) {
                std::collections::hash_map::Entry::Occupied(_) => return Ok(()),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(row.received_at);
                }
            }
        }
        let state = self.org(&row.org_id).await?;
        if let Some(version) = &row.model_version_id {
            state
                .exposure
                .lock()
                .map_err(|_| poisoned())?
                .record_answer(version);
        }
        // A priced model candidate's own evidence: the shared model's observation of the
        // answer (reward = answer − the prior mean logged with it), so a restart and every
        // replica replay the same.
        let priced_candidate = row
            .prior_mean
            .is_some()
            .then(|| candidate_id(&row.recommendation_id));
        if let Some(candidate) = &priced_candidate {
            let layout = *state.policy.read().map_err(|_| poisoned())?.layout();
            let recorded = state.evidence.write().map_err(|_| poisoned())?.record(
                &layout,
                candidate,
                row.model_version_id.as_deref(),
                &observation,
            );
            if let Err(err) = recorded {
                // The learner will refuse the same features; nothing to learn from.
                tracing::warn!(org = %row.org_id, candidate, error = %err, "evidence not recorded");
            }
        }
        let lesson = Lesson {
            row: LearnedRow {
                event_id: row.event_id,
                recommendation_id: row.recommendation_id,
                received_at: row.received_at,
            },
            priced_candidate,
            model_version: row.model_version_id,
        };
        // A closed channel means the learner stopped (shutdown); nothing to do.
        let _ = state
            .learner
            .send(ToLearner::Learn(Box::new((observation, lesson))));
        Ok(())
    }
}

/// The candidate set as logged (`recommend::candidate_log`): enough to recompute another
/// policy's choice off-line (see `recommend::ope`).
fn candidate_log(candidates: &[(Candidate, Vec<f64>)]) -> Result<Vec<u8>, ServeError> {
    candidate_log::encode(candidates.iter().map(|(c, _)| CandidateEntry {
        candidate_id: &c.candidate_id,
        kind: c.recommendation_type,
        expected_reliability_delta: c.expected_reliability_delta,
        expected_cost_delta_usd: c.expected_cost_delta_usd,
    }))
    .map_err(ServeError::LogEncoding)
}

impl From<PlacementError> for ServeError {
    fn from(error: PlacementError) -> Self {
        match error {
            PlacementError::Context { field, message } => ServeError::Context { field, message },
            PlacementError::Cluster(e) => ServeError::Cluster(e),
        }
    }
}

fn poisoned() -> ServeError {
    ServeError::Poisoned
}

/// `r-` and the candidate's hash: stable for the same change, unique within a request.
fn recommendation_id(candidate_id: &str) -> String {
    format!("r-{}", candidate_id.trim_start_matches("c-"))
}

/// The candidate id a recommendation id was made from ([`recommendation_id`]'s inverse).
fn candidate_id(recommendation_id: &str) -> String {
    format!("c-{}", recommendation_id.trim_start_matches("r-"))
}

/// The bandit observation of a feedback row: accepted or applied → 1, rejected → 0, less the
/// prior mean a priced model candidate was ranked with (`engine::learning_reward`).
fn observation_of(row: &LearnableFeedback) -> Option<Observation> {
    let accepted = match FeedbackOutcome::parse(&row.outcome)? {
        FeedbackOutcome::Accepted | FeedbackOutcome::Applied => true,
        FeedbackOutcome::Rejected => false,
    };
    let context: Vec<f64> = row
        .context_features
        .as_ref()?
        .iter()
        .map(|v| f64::from(*v))
        .collect();
    let candidate: Vec<f64> = row
        .candidate_features
        .as_ref()?
        .iter()
        .map(|v| f64::from(*v))
        .collect();
    let observation = Observation {
        id: format!("{}/{}", row.event_id, row.recommendation_id),
        timestamp_s: timestamp_s(row.decided_at),
        context,
        candidate,
        reward: learning_reward(accepted, row.prior_mean),
    };
    Some(observation)
}

/// A learner's own state: the policy it updates and its account of what that policy learned.
struct Learner {
    org: String,
    policy: ThompsonPolicy,
    ledger: Ledger,
    pool: PgPool,
    policy_version: String,
}

impl Learner {
    /// Discounts to the current epoch, applies a batch of lessons to the policy and the ledger,
    /// and redraws the bank.
    fn learn_batch(&mut self, batch: Vec<(Observation, Lesson)>) {
        let org = self.org.as_str();
        let epoch = current_epoch();
        if self.policy.clock_s().is_some_and(|clock| clock < epoch)
            && let Err(err) = self.policy.decay_to(epoch)
        {
            tracing::warn!(org, error = %err, "cannot discount old evidence");
        }
        for (observation, lesson) in batch {
            match self.policy.update(&observation) {
                // The ledger records only what the policy learned, so the two stay in step.
                Ok(()) => {
                    if let Err(err) = self
                        .ledger
                        .record(lesson, &observation, self.policy.layout())
                    {
                        tracing::warn!(org, id = %observation.id, error = %err, "evidence not recorded");
                    }
                }
                Err(err) => {
                    tracing::warn!(org, id = %observation.id, error = %err, "feedback not learned");
                }
            }
        }
        self.policy.refresh_bank_seeded(rand::rng().random());
    }

    /// The warm start: rebuilds the (untaught) policy from the platform's logged decisions made
    /// before the organization's first decision here (an arc-rec recommendation the platform
    /// then records as a diff is learned once, from its feedback), matched against the
    /// organization's candidates and clusters as they are now. Every replica reads the same
    /// rows and rebuilds at an epoch boundary, so they agree (`learn_batch`).
    /// On an error nothing changed.
    async fn warm_start(&mut self, state: &OrgServing) -> Result<WarmStartCounts, ServeError> {
        let rows = warm_start_rows(&self.pool, &self.org, WARM_START_DECISIONS).await?;
        let index = state.index.read().map_err(|_| poisoned())?.clone();
        let clusters = state.clusters.read().map_err(|_| poisoned())?.clone();
        let mut policy = self.policy.clone();
        let (policy, counts) = tokio::task::spawn_blocking(move || {
            let logged: Vec<LoggedDecision> = rows
                .into_iter()
                .map(LoggedDecision::of_export_row)
                .collect();
            let (observations, counts) =
                super::warm_start::observations(&index, clusters.as_deref(), &logged);
            if !observations.is_empty() {
                policy
                    .rebuild(&observations, current_epoch())
                    .map_err(RecommendError::from)?;
                policy.refresh_bank_seeded(rand::rng().random());
            }
            Ok::<_, ServeError>((policy, counts))
        })
        .await
        .map_err(|err| ServeError::Storage(StorageError::Task(err)))??;
        self.policy = policy;
        self.ledger.warm_start = Some(counts);
        Ok(counts)
    }

    /// Stores a snapshot of the policy and ledger (the most advanced replica's wins). The
    /// ledger forgets the rows the snapshot's cutoff covers first, so between snapshots it holds
    /// at most a snapshot interval's rows.
    async fn snapshot(&mut self) -> Result<(), ServeError> {
        self.ledger.prune(SNAPSHOT_OVERLAP);
        let snapshot = OrgSnapshot::take(&self.policy, &self.ledger);
        // ~2 MB of JSON at this layout: serialised off the runtime.
        let json = tokio::task::spawn_blocking(move || serde_json::to_string(&snapshot))
            .await
            .map_err(|err| ServeError::Storage(StorageError::Task(err)))?
            .map_err(ServeError::SnapshotEncoding)?;
        save_snapshot(
            &self.pool,
            &self.org,
            &self.policy_version,
            SNAPSHOT_FORMAT,
            &json,
            i64::try_from(self.ledger.lessons).unwrap_or(i64::MAX),
        )
        .await?;
        Ok(())
    }
}

/// The start of the current decay epoch (Unix seconds).
fn current_epoch() -> f64 {
    (timestamp_s(Utc::now()) / DECAY_EPOCH_S).floor() * DECAY_EPOCH_S
}

/// Applies observations in batches and publishes policies until the organization is dropped;
/// stores a snapshot when one is due or asked for. With `warm_start_due`, first runs the warm
/// start ([`Learner::warm_start`]); feedback sent meanwhile waits in the channel.
async fn learn_loop(
    mut learner: Learner,
    warm_start_due: bool,
    mut receiver: mpsc::UnboundedReceiver<ToLearner>,
    state: std::sync::Weak<OrgServing>,
) {
    if warm_start_due && let Some(state) = state.upgrade() {
        let started = std::time::Instant::now();
        match learner.warm_start(&state).await {
            Ok(counts) => {
                if let Ok(mut slot) = state.policy.write() {
                    *slot = Arc::new(learner.policy.clone());
                }
                let _ = state.warm_start.set(counts);
                tracing::info!(
                    org = %learner.org,
                    logged = counts.logged,
                    matched = counts.matched,
                    lever_matched = counts.lever_matched,
                    seconds = started.elapsed().as_secs_f64(),
                    "warm start: learned the platform's logged decisions"
                );
            }
            // The policy serves from the prior: slower to learn, still correct.
            Err(err) => {
                tracing::warn!(org = %learner.org, error = %telemetry::error_chain(&err), "warm start failed; learning from feedback alone");
            }
        }
    }
    let mut snapshotted = (learner.ledger.lessons, std::time::Instant::now());
    let mut behind = false;
    while let Some(first) = receiver.recv().await {
        // A batch runs up to the first snapshot request, which is answered after it.
        let mut batch = Vec::new();
        let mut asked = None;
        match first {
            ToLearner::Learn(lesson) => batch.push(*lesson),
            ToLearner::Snapshot(reply) => asked = Some(reply),
        }
        if asked.is_none() {
            // Behind (the last batch was full): no waiting for more to arrive.
            if !behind {
                tokio::time::sleep(PUBLISH_INTERVAL).await;
            }
            while batch.len() < MAX_BATCH
                && let Ok(more) = receiver.try_recv()
            {
                match more {
                    ToLearner::Learn(lesson) => batch.push(*lesson),
                    ToLearner::Snapshot(reply) => {
                        asked = Some(reply);
                        break;
                    }
                }
            }
        }
        behind = batch.len() >= MAX_BATCH;
        let Some(state) = state.upgrade() else { return };
        if !batch.is_empty() {
            // The maths is CPU work (~0.1 ms per observation, ~0.1 s per bank refresh): off the
            // runtime.
            let result = tokio::task::spawn_blocking(move || {
                learner.learn_batch(batch);
                learner
            })
            .await;
            match result {
                Ok(updated) => {
                    learner = updated;
                    if let Ok(mut slot) = state.policy.write() {
                        *slot = Arc::new(learner.policy.clone());
                    }
                }
                Err(err) => {
                    tracing::error!(error = %err, "learner stopped");
                    return;
                }
            }
        }
        let due = learner.ledger.lessons > snapshotted.0
            && (learner.ledger.lessons - snapshotted.0 >= SNAPSHOT_EVERY_LESSONS
                || snapshotted.1.elapsed() >= SNAPSHOT_INTERVAL);
        if due || asked.is_some() {
            // Asked for (the server is stopping, and there is no next time): retried past
            // connections the stopped HTTP workers left dead (`storage::SHUTDOWN_ATTEMPTS`);
            // a periodic snapshot is simply taken again later.
            let attempts = if asked.is_some() {
                crate::storage::SHUTDOWN_ATTEMPTS
            } else {
                1
            };
            let mut stored = learner.snapshot().await;
            for attempt in 1..=attempts {
                match &stored {
                    Ok(()) => {
                        snapshotted = (learner.ledger.lessons, std::time::Instant::now());
                        break;
                    }
                    Err(err) => {
                        let unavailable =
                            matches!(err, ServeError::Storage(e) if e.is_unavailable());
                        let retry = unavailable && attempt < attempts;
                        if !retry {
                            tracing::warn!(
                                org = %learner.org,
                                attempt,
                                error = %telemetry::error_chain(err),
                                "cannot store a bandit snapshot"
                            );
                            break;
                        }
                        tracing::debug!(org = %learner.org, attempt, error = %telemetry::error_chain(err), "bandit snapshot failed; retrying");
                        stored = learner.snapshot().await;
                    }
                }
            }
            if let Some(reply) = asked {
                let _ = reply.send(stored);
            }
        }
    }
}

/// Learns feedback other replicas stored.
async fn poll_feedback(serving: std::sync::Weak<Serving>, mut watermark: Option<DateTime<Utc>>) {
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    loop {
        ticker.tick().await;
        let Some(serving) = serving.upgrade() else {
            return;
        };
        let since = watermark.map(|w| w - POLL_OVERLAP);
        match feedback_since(&serving.pool, since).await {
            Ok(rows) => {
                if let Some(max) = rows.iter().map(|r| r.received_at).max() {
                    watermark = Some(watermark.map_or(max, |w| w.max(max)));
                }
                for row in rows {
                    if let Err(err) = serving.learn(row).await {
                        tracing::warn!(error = %telemetry::error_chain(&err), "cannot learn polled feedback");
                    }
                }
                if let Some(watermark) = watermark {
                    serving.forget_learned_before(watermark - FORGET_LEARNED_AFTER);
                }
            }
            Err(err) => {
                tracing::warn!(error = %telemetry::error_chain(&err), "feedback poll failed");
            }
        }
        match serving.reload_changed_model_candidates().await {
            Ok(0) => {}
            Ok(orgs) => tracing::info!(orgs, "reloaded changed model candidates"),
            Err(err) => tracing::warn!(error = %err, "model candidate poll failed"),
        }
    }
}
