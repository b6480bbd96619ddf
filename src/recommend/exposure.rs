//! The exposure cap on brand-new model versions (`arc-rec serve --new-version-share`): until a
//! model version has had `feedbacks` answers, its candidates may be shown first in at most
//! `share` of an organization's decisions. A version over its share sits out a request (its
//! candidates are left off the menu, and the decision logs that it was capped), so a model
//! whose prior is wrong cannot take the top slot everywhere before feedback can correct it.
//! Pure: the counts come from the service.

use std::collections::HashMap;

/// The cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExposureCap {
    /// Largest share of decisions (0–1] a new version's candidate may head; 1 turns the cap off.
    pub share: f64,
    /// Answers after which a version is no longer new.
    pub feedbacks: u64,
}

impl Default for ExposureCap {
    fn default() -> Self {
        Self {
            share: 0.5,
            feedbacks: 50,
        }
    }
}

impl ExposureCap {
    /// Checks the share lies in (0, 1]; the error names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.share.is_finite() && self.share > 0.0 && self.share <= 1.0 {
            Ok(())
        } else {
            Err(format!(
                "--new-version-share must lie in (0, 1], got {}",
                self.share
            ))
        }
    }
}

/// The exploration floor for the newest model version (`arc-rec serve --explore-share`): while
/// the version is new (fewer answers than the cap's `feedbacks`), `share` of the decisions whose
/// menu holds one of its ideas with fewer than `answers_per_idea` answers put one of those ideas
/// first, drawn uniformly, with exact logged propensities (`bandit::ExplorationFloor`). A new
/// version's ideas are then answered at a bounded price, whatever their prior says, so that the
/// next learned grader learns where the last one was wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExplorationFloorOptions {
    /// Share of eligible decisions [0, 1] whose first slot the floor chooses; 0 turns it off.
    pub share: f64,
    /// Answers after which an idea no longer needs the floor.
    pub answers_per_idea: u32,
}

impl Default for ExplorationFloorOptions {
    fn default() -> Self {
        Self {
            share: 0.1,
            answers_per_idea: 3,
        }
    }
}

impl ExplorationFloorOptions {
    /// Checks the share lies in [0, 1] and an idea needs at least one answer; the error names
    /// the flag.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.share.is_finite() && (0.0..=1.0).contains(&self.share)) {
            return Err(format!(
                "--explore-share must lie in [0, 1], got {}",
                self.share
            ));
        }
        if self.answers_per_idea == 0 {
            return Err("--explore-answers must be at least 1".to_owned());
        }
        Ok(())
    }
}

/// One organization's counts: decisions, decisions each model version headed, and answers
/// about each version's candidates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposure {
    decisions: u64,
    headed: HashMap<String, u64>,
    answers: HashMap<String, u64>,
}

impl Exposure {
    /// Counts as stored: `decisions` so far, and per model version the decisions it headed and
    /// the answers about its candidates.
    pub fn new(
        decisions: u64,
        headed: HashMap<String, u64>,
        answers: HashMap<String, u64>,
    ) -> Self {
        Self {
            decisions,
            headed,
            answers,
        }
    }

    /// The versions among `versions` that sit this decision out: new (fewer answers than the
    /// cap's) and already heading at least `share` of the decisions. Sorted, without repeats.
    pub fn capped<'a>(
        &self,
        cap: &ExposureCap,
        versions: impl IntoIterator<Item = &'a str>,
    ) -> Vec<String> {
        if cap.share >= 1.0 || self.decisions == 0 {
            return Vec::new();
        }
        let mut capped: Vec<String> = versions
            .into_iter()
            .filter(|v| {
                let new = self.is_new(cap, v);
                let headed = self.headed.get(*v).copied().unwrap_or(0) as f64;
                new && headed >= cap.share * self.decisions as f64
            })
            .map(str::to_owned)
            .collect();
        capped.sort();
        capped.dedup();
        capped
    }

    /// True while `version` has fewer answers than the cap's `feedbacks`.
    pub fn is_new(&self, cap: &ExposureCap, version: &str) -> bool {
        self.answers.get(version).copied().unwrap_or(0) < cap.feedbacks
    }

    /// Records a decision and the model version of its first item (`None`: a heuristic, or
    /// nothing shown).
    pub fn record_decision(&mut self, headed_by: Option<&str>) {
        self.decisions += 1;
        if let Some(version) = headed_by {
            *self.headed.entry(version.to_owned()).or_insert(0) += 1;
        }
    }

    /// Records an answer about a candidate of `version`.
    pub fn record_answer(&mut self, version: &str) {
        *self.answers.entry(version.to_owned()).or_insert(0) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_version_heads_at_most_its_share_until_it_has_its_answers() {
        let cap = ExposureCap {
            share: 0.25,
            feedbacks: 3,
        };
        let mut exposure = Exposure::default();
        // The policy would put v1 first every time; the cap lets it through while its share is
        // below a quarter.
        let mut headed = 0;
        for _ in 0..400 {
            let capped = exposure.capped(&cap, ["v1"]);
            let first = capped.is_empty().then_some("v1");
            headed += usize::from(first.is_some());
            exposure.record_decision(first);
        }
        assert!((99..=101).contains(&headed), "{headed}");
        // Three answers: no longer new, no longer capped.
        for _ in 0..3 {
            assert_eq!(exposure.capped(&cap, ["v1", "v1"]), ["v1"]);
            exposure.record_answer("v1");
        }
        assert!(exposure.capped(&cap, ["v1"]).is_empty());
        // Another new version is capped on its own counts; heuristic decisions count.
        exposure.record_decision(None);
        assert!(exposure.capped(&cap, ["v2"]).is_empty());
    }

    #[test]
    fn share_one_turns_the_cap_off_and_bad_shares_are_named() {
        let cap = ExposureCap {
            share: 1.0,
            feedbacks: 10,
        };
        let mut exposure = Exposure::default();
        for _ in 0..10 {
            exposure.record_decision(Some("v"));
        }
        assert!(exposure.capped(&cap, ["v"]).is_empty());
        for share in [0.0, -0.5, 1.5, f64::NAN] {
            let error = ExposureCap {
                share,
                feedbacks: 1,
            }
            .validate()
            .unwrap_err();
            assert!(error.contains("--new-version-share"), "{error}");
        }
        assert!(ExposureCap::default().validate().is_ok());
    }

    #[test]
    fn bad_floors_are_named_by_their_flag() {
        assert!(ExplorationFloorOptions::default().validate().is_ok());
        for share in [-0.1, 1.5, f64::NAN] {
            let floor = ExplorationFloorOptions {
                share,
                ..Default::default()
            };
            assert!(floor.validate().unwrap_err().contains("--explore-share"));
        }
        let floor = ExplorationFloorOptions {
            answers_per_idea: 0,
            ..Default::default()
        };
        assert!(floor.validate().unwrap_err().contains("--explore-answers"));
    }
}
