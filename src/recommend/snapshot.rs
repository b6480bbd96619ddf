//! What an organization's learner has learned, as one snapshot stored in `bandit_state`, so a
//! server starts from the snapshot and replays only the feedback past it instead of the whole
//! log (issue: start-up at scale). Pure: the service reads and writes it through `storage`.
//!
//! The snapshot is the learner's own account ([`Ledger`]): the policy it updated and, beside
//! it, everything else its lessons taught (each priced candidate's evidence, each model
//! version's answers) and which feedback rows they were. Requests see those maps earlier (the
//! service updates them when it hands a row over), but the snapshot must hold exactly what the
//! policy holds, so the learner keeps its own copy, applied with the policy, lesson by lesson.
//!
//! Which rows are in it: every row received at or before `learned_through − overlap`, where
//! `overlap` is the feedback poll's re-read window (a row commits at most that long after its
//! `received_at`, the poll's own assumption), plus the rows listed in `recent`. A restart
//! replays rows received after `learned_through − overlap` and skips those in `recent`.
//!
//! A new organization's policy first learns the platform's logged decisions (the warm start,
//! `recommend::warm_start`); the ledger counts them apart from lessons, since they are no
//! feedback rows.

use std::collections::HashMap;

use bandit::{FeatureLayout, Observation, PolicyState, ThompsonPolicy};
use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::engine::Evidence;
use super::warm_start::WarmStartCounts;

/// The snapshot format this code writes and reads (`bandit_state.state_version`).
/// Format 2: a priced candidate's evidence holds the sums of its answers' rewards and
/// interaction vectors instead of a running sum of surprises (a format-1 snapshot is refused and
/// the server replays the whole log, which rebuilds it).
pub const SNAPSHOT_FORMAT: i32 = 2;

/// One feedback row the learner learned: its item and when it was received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedRow {
    pub event_id: Uuid,
    pub recommendation_id: String,
    pub received_at: DateTime<Utc>,
}

/// What one answer teaches besides the shared model's observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Lesson {
    pub row: LearnedRow,
    /// A priced model candidate's answer: its candidate id (the shared model's observation of
    /// the answer is the evidence).
    pub priced_candidate: Option<String>,
    /// The model version whose candidate was answered (the exposure cap counts answers).
    pub model_version: Option<String>,
}

/// The learner's account of what its policy has learned (everything but the policy).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ledger {
    /// Each priced model candidate's evidence, by candidate id, and pooled by model version
    /// (`engine::version_key`).
    pub evidence: Evidence,
    /// Answers about each model version's candidates.
    pub answers: HashMap<String, u64>,
    /// The newest `received_at` learned.
    pub learned_through: Option<DateTime<Utc>>,
    /// The rows learned that were received after `learned_through − overlap` (pruned when the
    /// snapshot is taken).
    pub recent: Vec<LearnedRow>,
    /// Lessons learned, in all.
    pub lessons: u64,
    /// What the policy learned from the platform's logged decisions before its first lesson
    /// (`recommend::warm_start`; `None`: no warm start ran). Its observations are the policy's
    /// too: the policy holds `lessons` + `warm_start.matched`.
    #[serde(default)]
    pub warm_start: Option<WarmStartCounts>,
}

impl Ledger {
    /// Records one lesson the policy has just learned as `observation`. A priced candidate's
    /// evidence needs its features to fit `layout`, the policy's (they do when the policy took
    /// the observation); if they do not, the lesson is counted and the error returned.
    pub fn record(
        &mut self,
        lesson: Lesson,
        observation: &Observation,
        layout: &FeatureLayout,
    ) -> Result<(), bandit::BanditError> {
        let Lesson {
            row,
            priced_candidate,
            model_version,
        } = lesson;
        let received_at = row.received_at;
        self.learned_through = Some(
            self.learned_through
                .map_or(received_at, |t| t.max(received_at)),
        );
        self.recent.push(row);
        self.lessons += 1;
        if let Some(version) = &model_version {
            *self.answers.entry(version.clone()).or_insert(0) += 1;
        }
        match priced_candidate {
            Some(candidate_id) => {
                self.evidence
                    .record(layout, &candidate_id, model_version.as_deref(), observation)
            }
            None => Ok(()),
        }
    }

    /// Forgets the rows received at or before `learned_through − overlap`: the cutoff covers
    /// them.
    pub fn prune(&mut self, overlap: TimeDelta) {
        if let Some(cutoff) = self.replay_after(overlap) {
            self.recent.retain(|row| row.received_at > cutoff);
        }
    }

    /// Rows received after this (all rows when `None`) may be missing from the snapshot: a
    /// restart replays them, skipping those in `recent`.
    pub fn replay_after(&self, overlap: TimeDelta) -> Option<DateTime<Utc>> {
        self.learned_through.map(|t| t - overlap)
    }
}

/// One organization's stored snapshot: the policy and the learner's ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrgSnapshot {
    pub policy: PolicyState,
    pub ledger: Ledger,
}

/// Why a stored snapshot cannot be used (the server then replays the whole log).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot format {found}, this server reads {SNAPSHOT_FORMAT}")]
    Format { found: i32 },
    #[error("snapshot is not valid JSON for this format: {0}")]
    Syntax(#[from] serde_json::Error),
    #[error("snapshot policy: {0}")]
    Policy(#[from] bandit::BanditError),
    #[error(
        "snapshot counts {lessons} lessons and {warm} logged decisions but its policy {observations} observations"
    )]
    Inconsistent {
        lessons: u64,
        warm: u64,
        observations: u64,
    },
    #[error("snapshot {0}")]
    Evidence(String),
}

impl OrgSnapshot {
    /// The snapshot of `policy` and its `ledger` (pruned by the caller, [`Ledger::prune`], to
    /// the rows a restart needs).
    pub fn take(policy: &ThompsonPolicy, ledger: &Ledger) -> Self {
        Self {
            policy: policy.to_state(),
            ledger: ledger.clone(),
        }
    }

    /// Parses and checks a stored snapshot, restoring its policy (bit-identical to the one
    /// snapshotted, `bandit::state`).
    pub fn restore(format: i32, json: &str) -> Result<(ThompsonPolicy, Ledger), SnapshotError> {
        if format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format { found: format });
        }
        let snapshot: Self = serde_json::from_str(json)?;
        let policy = ThompsonPolicy::from_state(&snapshot.policy)?;
        let warm = snapshot.ledger.warm_start.map_or(0, |w| w.matched);
        if policy.observations() != snapshot.ledger.lessons.saturating_add(warm) {
            return Err(SnapshotError::Inconsistent {
                lessons: snapshot.ledger.lessons,
                warm,
                observations: policy.observations(),
            });
        }
        snapshot
            .ledger
            .evidence
            .check(policy.dim())
            .map_err(SnapshotError::Evidence)?;
        Ok((policy, snapshot.ledger))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recommend::features::{layout, policy_config};

    fn row(second: i64, id: &str) -> LearnedRow {
        LearnedRow {
            event_id: Uuid::nil(),
            recommendation_id: id.into(),
            received_at: DateTime::from_timestamp(1_700_000_000 + second, 0).unwrap(),
        }
    }

    fn lesson(second: i64, id: &str) -> Lesson {
        Lesson {
            row: row(second, id),
            priced_candidate: Some("c-1".into()),
            model_version: Some("mv".into()),
        }
    }

    /// The shared model's observation of an acceptance of an idea priced 0.25.
    fn accepted(id: &str) -> Observation {
        let layout = layout();
        let mut context = vec![0.0; layout.context_dims()];
        context[0] = 1.0;
        Observation {
            id: id.into(),
            timestamp_s: 0.0,
            context,
            candidate: vec![0.5; layout.candidate_dims],
            reward: crate::recommend::engine::learning_reward(true, Some(0.25)),
        }
    }

    #[test]
    fn the_ledger_keeps_only_the_rows_past_the_cutoff() {
        let mut ledger = Ledger::default();
        for (second, id) in [(0, "a"), (50, "b"), (100, "c"), (90, "d")] {
            ledger
                .record(lesson(second, id), &accepted(id), &layout())
                .unwrap();
        }
        ledger.prune(TimeDelta::seconds(30));
        let kept: Vec<&str> = ledger
            .recent
            .iter()
            .map(|r| r.recommendation_id.as_str())
            .collect();
        assert_eq!(kept, ["c", "d"]);
        assert_eq!(ledger.learned_through, Some(row(100, "").received_at));
        assert_eq!(ledger.lessons, 4);
        assert_eq!(ledger.answers["mv"], 4);
        assert_eq!(ledger.evidence.get("c-1").unwrap().answers, 4);
        let own = ledger.evidence.get("c-1").unwrap();
        assert!((own.residual - 3.0).abs() < 1e-12);
        assert!((own.interactions[0] - 2.0).abs() < 1e-12);
        let pooled = ledger
            .evidence
            .get(&crate::recommend::engine::version_key("mv"))
            .unwrap();
        assert_eq!(pooled.answers, 4);
        // A lesson whose features do not fit the layout is counted, its evidence refused.
        let mut bad = accepted("e");
        bad.candidate.pop();
        assert!(ledger.record(lesson(120, "e"), &bad, &layout()).is_err());
        assert_eq!(ledger.lessons, 5);
        assert_eq!(ledger.evidence.get("c-1").unwrap().answers, 4);
    }

    #[test]
    fn a_snapshot_round_trips_and_refuses_what_does_not_add_up() {
        let mut policy = ThompsonPolicy::new(layout(), policy_config()).unwrap();
        policy.refresh_bank_seeded(7);
        let mut ledger = Ledger::default();
        let json = serde_json::to_string(&OrgSnapshot::take(&policy, &ledger)).unwrap();
        let (restored, restored_ledger) = OrgSnapshot::restore(SNAPSHOT_FORMAT, &json).unwrap();
        assert_eq!(restored.to_state(), policy.to_state());
        assert_eq!(restored_ledger, ledger);

        ledger
            .record(lesson(0, "a"), &accepted("a"), &layout())
            .unwrap();
        let json = serde_json::to_string(&OrgSnapshot::take(&policy, &ledger)).unwrap();
        assert!(matches!(
            OrgSnapshot::restore(SNAPSHOT_FORMAT, &json),
            Err(SnapshotError::Inconsistent {
                lessons: 1,
                warm: 0,
                observations: 0
            })
        ));
        assert!(matches!(
            OrgSnapshot::restore(SNAPSHOT_FORMAT + 1, &json),
            Err(SnapshotError::Format { .. })
        ));
        assert!(matches!(
            OrgSnapshot::restore(SNAPSHOT_FORMAT, "{\"policy\": 1}"),
            Err(SnapshotError::Syntax(_))
        ));
        // With the lesson learned, the evidence round-trips with the policy.
        policy.update(&accepted("a")).unwrap();
        let json = serde_json::to_string(&OrgSnapshot::take(&policy, &ledger)).unwrap();
        let (restored, restored_ledger) = OrgSnapshot::restore(SNAPSHOT_FORMAT, &json).unwrap();
        assert_eq!(restored.to_state(), policy.to_state());
        assert_eq!(restored_ledger, ledger);
        // Evidence that does not fit the policy (a damaged row) is refused, naming its key.
        let mut damaged: serde_json::Value = serde_json::from_str(&json).unwrap();
        damaged["ledger"]["evidence"]["c-1"]["interactions"]
            .as_array_mut()
            .unwrap()
            .pop();
        let err = OrgSnapshot::restore(SNAPSHOT_FORMAT, &damaged.to_string()).unwrap_err();
        assert!(
            matches!(&err, SnapshotError::Evidence(why) if why.contains("c-1")),
            "{err}"
        );
    }
}
