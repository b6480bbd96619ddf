//! A model version's lifecycle (`arc-rec models`): what each version served and how it was
//! answered, and its status. Only `live` versions' candidates are served
//! (`candidate_stats::load_model_candidates_by_cluster`); `retired` takes a version's ideas out of
//! serving, `live` puts them back.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{QueryContext, StorageError};

/// Whether a version's candidates are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionStatus {
    Live,
    Retired,
}

impl VersionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionStatus::Live => "live",
            VersionStatus::Retired => "retired",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "live" => Some(VersionStatus::Live),
            "retired" => Some(VersionStatus::Retired),
            _ => None,
        }
    }
}

/// One model version of one organization, with what serving did with its ideas.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct VersionSummary {
    pub org_id: String,
    pub model_version_id: String,
    pub base_model: String,
    pub created_at: DateTime<Utc>,
    #[sqlx(try_from = "String")]
    pub status: VersionStatus,
    pub status_changed_at: DateTime<Utc>,
    /// Candidate rows it holds now (a later version's `candidates` takes over the rows of ideas
    /// it also had).
    pub candidates: i64,
    /// Decisions that showed one of its ideas (at any position).
    pub decisions: i64,
    /// Its shown ideas that got an answer, and those accepted (the analytics' definition: an
    /// `accepted` or `applied` answer).
    pub answered: i64,
    pub accepted: i64,
    /// What the exploration floor did for it (`arc-rec serve --explore-share`).
    #[sqlx(flatten)]
    pub floor: FloorCounts,
}

/// The exploration floor's decisions for one version: those where it could put one of the
/// version's unanswered ideas first, the picks it made, and how the first item of each kind was
/// answered. The coin is independent of the context, so the floor's eligible decisions that it
/// left to the policy show what the policy would have earned in the picks' contexts.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct FloorCounts {
    pub floor_decisions: i64,
    pub floor_picks: i64,
    pub pick_answered: i64,
    pub pick_accepted: i64,
    pub policy_answered: i64,
    pub policy_accepted: i64,
}

/// The acceptance the exploration floor gave up, per eligible decision.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct FloorPrice {
    /// First-item acceptance of the floor's picks and of the policy's own choices in the
    /// floor's eligible decisions.
    pub pick_acceptance: f64,
    pub policy_acceptance: f64,
    /// (policy − picks) × the share of eligible decisions the floor picked: first-item
    /// acceptance lost per eligible decision (negative: the picks did better).
    pub given_up: f64,
    /// Its 95 % interval (Newcombe's difference of Wilson intervals, times the share).
    pub given_up_ci95: [f64; 2],
}

impl TryFrom<String> for VersionStatus {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        VersionStatus::parse(&text).ok_or_else(|| format!("unknown model version status {text:?}"))
    }
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl VersionSummary {
    /// Accepted among answered, with its Wilson 95 % interval; `None` before the first answer.
    pub fn acceptance(&self) -> Option<(f64, [f64; 2])> {
        let (answered, accepted) = (count(self.answered), count(self.accepted));
        let (lo, hi) = bandit::interval::wilson(accepted, answered, 1.96)?;
        Some((accepted as f64 / answered as f64, [lo, hi]))
    }
}

impl FloorCounts {
    /// The floor's price; `None` until both its picks and the policy's choices in its eligible
    /// decisions have answered first items.
    pub fn price(&self) -> Option<FloorPrice> {
        let (pn, pk) = (count(self.pick_answered), count(self.pick_accepted));
        let (qn, qk) = (count(self.policy_answered), count(self.policy_accepted));
        let (pl, pu) = bandit::interval::wilson(pk, pn, 1.96)?;
        let (ql, qu) = bandit::interval::wilson(qk, qn, 1.96)?;
        let (p, q) = (pk as f64 / pn as f64, qk as f64 / qn as f64);
        let share = count(self.floor_picks) as f64 / count(self.floor_decisions).max(1) as f64;
        let d = q - p;
        let lo = d - ((q - ql).powi(2) + (pu - p).powi(2)).sqrt();
        let hi = d + ((qu - q).powi(2) + (p - pl).powi(2)).sqrt();
        Some(FloorPrice {
            pick_acceptance: p,
            policy_acceptance: q,
            given_up: d * share,
            given_up_ci95: [lo * share, hi * share],
        })
    }
}

/// Every model version of `org` (of every organization when `None`), newest first.
pub async fn list(pool: &PgPool, org: Option<&str>) -> Result<Vec<VersionSummary>, StorageError> {
    // Answers are counted per shown item (its first accepting answer decides, as in analytics);
    // an item answered twice is one answer.
    let rows: Vec<VersionSummary> = sqlx::query_as(
        "WITH shown AS (
             SELECT i.org_id, i.model_version_id, i.event_id, i.recommendation_id, i.position,
                    EXISTS (SELECT 1 FROM feedback f WHERE f.org_id = i.org_id
                              AND f.event_id = i.event_id
                              AND f.recommendation_id = i.recommendation_id) AS answered,
                    EXISTS (SELECT 1 FROM feedback f WHERE f.org_id = i.org_id
                              AND f.event_id = i.event_id
                              AND f.recommendation_id = i.recommendation_id
                              AND f.outcome IN ('accepted', 'applied')) AS accepted
             FROM decision_items i
             WHERE ($1::text IS NULL OR i.org_id = $1)
               -- A version's own items, and the first item of each of the floor's decisions.
               AND (i.model_version_id IS NOT NULL
                    OR (i.position = 0 AND EXISTS (
                        SELECT 1 FROM decision_log l
                        WHERE l.org_id = i.org_id AND l.event_id = i.event_id
                          AND l.floor_version IS NOT NULL)))
         ),
         served AS (
             SELECT org_id, model_version_id, count(DISTINCT event_id) AS decisions,
                    count(*) FILTER (WHERE answered) AS answered,
                    count(*) FILTER (WHERE accepted) AS accepted
             FROM shown WHERE model_version_id IS NOT NULL
             GROUP BY org_id, model_version_id
         ),
         floor AS (
             SELECT l.org_id, l.floor_version AS model_version_id,
                    count(*) AS floor_decisions,
                    count(*) FILTER (WHERE l.floor_pick) AS floor_picks,
                    count(*) FILTER (WHERE l.floor_pick AND s.answered) AS pick_answered,
                    count(*) FILTER (WHERE l.floor_pick AND s.accepted) AS pick_accepted,
                    count(*) FILTER (WHERE NOT l.floor_pick AND s.answered) AS policy_answered,
                    count(*) FILTER (WHERE NOT l.floor_pick AND s.accepted) AS policy_accepted
             FROM decision_log l
             LEFT JOIN shown s ON s.org_id = l.org_id AND s.event_id = l.event_id
                              AND s.position = 0
             WHERE l.floor_version IS NOT NULL AND ($1::text IS NULL OR l.org_id = $1)
             GROUP BY l.org_id, l.floor_version
         ),
         held AS (
             SELECT org_id, model_version_id, count(*) AS candidates
             FROM candidate_recommendations
             WHERE source = 'model' AND ($1::text IS NULL OR org_id = $1)
             GROUP BY org_id, model_version_id
         )
         SELECT v.org_id, v.model_version_id, v.base_model, v.created_at, v.status,
                v.status_changed_at, coalesce(h.candidates, 0) AS candidates,
                coalesce(s.decisions, 0) AS decisions, coalesce(s.answered, 0) AS answered,
                coalesce(s.accepted, 0) AS accepted,
                coalesce(f.floor_decisions, 0) AS floor_decisions,
                coalesce(f.floor_picks, 0) AS floor_picks,
                coalesce(f.pick_answered, 0) AS pick_answered,
                coalesce(f.pick_accepted, 0) AS pick_accepted,
                coalesce(f.policy_answered, 0) AS policy_answered,
                coalesce(f.policy_accepted, 0) AS policy_accepted
         FROM model_versions v
         LEFT JOIN held h USING (org_id, model_version_id)
         LEFT JOIN served s USING (org_id, model_version_id)
         LEFT JOIN floor f USING (org_id, model_version_id)
         WHERE $1::text IS NULL OR v.org_id = $1
         ORDER BY v.created_at DESC, v.org_id, v.model_version_id",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .context("list model versions")?;
    Ok(rows)
}

/// `version`'s status in `org` (`None`: no such version).
pub async fn status(
    pool: &PgPool,
    org: &str,
    version: &str,
) -> Result<Option<VersionStatus>, StorageError> {
    let status: Option<String> = sqlx::query_scalar(
        "SELECT status FROM model_versions WHERE org_id = $1 AND model_version_id = $2",
    )
    .bind(org)
    .bind(version)
    .fetch_optional(pool)
    .await
    .context("read model version status")?;
    Ok(status.as_deref().and_then(VersionStatus::parse))
}

/// Sets `version`'s status in `org`; returns the status it had, or `None` when the organization
/// has no such version. Setting the status it already has changes nothing (not even
/// `status_changed_at`, so serving does not reload for it).
pub async fn set_status(
    pool: &PgPool,
    org: &str,
    version: &str,
    status: VersionStatus,
) -> Result<Option<VersionStatus>, StorageError> {
    let mut tx = pool.begin().await.context("begin model version status")?;
    let before: Option<String> = sqlx::query_scalar(
        "SELECT status FROM model_versions WHERE org_id = $1 AND model_version_id = $2 FOR UPDATE",
    )
    .bind(org)
    .bind(version)
    .fetch_optional(&mut *tx)
    .await
    .context("read model version status")?;
    let Some(before) = before.as_deref().and_then(VersionStatus::parse) else {
        return Ok(None);
    };
    if before != status {
        sqlx::query(
            "UPDATE model_versions SET status = $3, status_changed_at = clock_timestamp()
             WHERE org_id = $1 AND model_version_id = $2",
        )
        .bind(org)
        .bind(version)
        .bind(status.as_str())
        .execute(&mut *tx)
        .await
        .context("set model version status")?;
    }
    tx.commit().await.context("commit model version status")?;
    Ok(Some(before))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_s_price_is_the_acceptance_its_picks_lost_times_its_share() {
        assert_eq!(FloorCounts::default().price(), None);
        // 20 eligible decisions, 5 picked: picks accepted 1 of 5, the policy 9 of 15.
        let counts = FloorCounts {
            floor_decisions: 20,
            floor_picks: 5,
            pick_answered: 5,
            pick_accepted: 1,
            policy_answered: 15,
            policy_accepted: 9,
        };
        let price = counts.price().unwrap();
        assert!((price.pick_acceptance - 0.2).abs() < 1e-12);
        assert!((price.policy_acceptance - 0.6).abs() < 1e-12);
        assert!((price.given_up - 0.1).abs() < 1e-12, "0.4 × a quarter");
        let [lo, hi] = price.given_up_ci95;
        assert!(lo < price.given_up && price.given_up < hi && lo > -0.25 && hi < 0.25);
        // No answered pick yet: no price.
        let unanswered = FloorCounts {
            pick_answered: 0,
            pick_accepted: 0,
            ..counts
        };
        assert_eq!(unanswered.price(), None);
    }
}
