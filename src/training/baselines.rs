//! Floors and ceilings for `arc-rec eval` under the world grader: on the same held-out prompts
//! and the same world, the true acceptance probability of what the platform actually proposed
//! (the logged heuristic), of a uniformly random pick from the menu, and of the menu's best
//! answer (the oracle), so that every model figure sits between a floor and a ceiling and
//! "RL closes X% of the gap from warm-up to the oracle" can be said.
//!
//! **The menu** of a prompt is the set of distinct answers a recommender could pick among without
//! inventing one:
//!
//! - the world's candidate fixes for the context, [`crate::world::candidate_diffs`] of the
//!   prompt's `current_config` and the failures its user turn shows (see [`observed_failures`]
//!   for how they are read back), and
//! - the logged diffs, the prompt's canonical answers people approved or rejected there,
//!
//! each reduced to its canonical answer (the minimal merge patch, what the grader judges, so two
//! diffs with the same effect are one menu item) and scored with the world's true acceptance
//! probability for the configuration's owner and hidden circumstances.
//!
//! The history's own proposals were drawn from `candidate_diffs` of the round's first few observed
//! failures, which the export does not keep; the failures the user turn shows (the version's top
//! failure groups and failing tools) are the context's observable stand-in. The candidate
//! generator reads failures only for which tools fail (a failing configured tool gets its own
//! timeout, an unconfigured one the agent asked for gets added) and to seed its random choices,
//! and the logged diffs are always in the menu, so the menu holds every answer the platform
//! proposed there.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::rft::{RftPrompt, WorldTruthError, WorldTruths, canonical_answer};
use crate::world::{ObservedFailure, candidate_diffs};

/// Baselines that cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Truth(#[from] WorldTruthError),
    #[error("prompt {prompt}: logged answer {answer:?} is not a JSON merge patch")]
    LoggedAnswer {
        prompt: String,
        answer: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("prompt {prompt}: no candidate fix and no logged diff, so no menu to pick from")]
    EmptyMenu { prompt: String },
}

/// One answer of a prompt's menu.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MenuItem {
    /// The canonical answer (minimal merge patch, compact JSON with sorted keys).
    pub answer: String,
    /// Its true acceptance probability.
    pub acceptance_probability: f64,
    /// How many times the platform proposed it in this context (approved + rejected); 0 for a
    /// candidate fix nobody proposed there.
    pub proposed: u32,
    /// Whether the world's candidate generator offers it for the context.
    pub candidate: bool,
}

/// The failures a prompt's user turn shows, as the candidate generator takes them: one per "Top
/// failures" line (its category and quoted example message, no tool), then one per tool of the
/// "Failing tool calls" line, most failing first, ties by name (category `tool_call`, empty
/// message, the tool's name). Lines that do not follow `export::example`'s layout are skipped,
/// so a user turn without failures gives none.
pub fn observed_failures(user_turn: &str) -> Vec<ObservedFailure> {
    let mut failures = Vec::new();
    let mut tools: Vec<(String, u64)> = Vec::new();
    let mut in_top_failures = false;
    for line in user_turn.lines() {
        if line == "Top failures:" {
            in_top_failures = true;
            continue;
        }
        if let Some(list) = line.strip_prefix("Failing tool calls:") {
            in_top_failures = false;
            for entry in list.split(';') {
                if let Some((tool, count)) = entry.trim().rsplit_once(" x")
                    && let Ok(count) = count.parse::<u64>()
                    && !tool.is_empty()
                {
                    tools.push((tool.to_owned(), count));
                }
            }
            continue;
        }
        match line.strip_prefix("- ") {
            Some(group) if in_top_failures => {
                // `{category} ({type}) x{count}: "{example}"`
                let Some((category, rest)) = group.split_once(" (") else {
                    continue;
                };
                let Some((_, quoted)) = rest.split_once(": \"") else {
                    continue;
                };
                failures.push(ObservedFailure {
                    failure_category: category.to_owned(),
                    error_message: quoted.strip_suffix('"').unwrap_or(quoted).to_owned(),
                    tool_name: None,
                });
            }
            _ if line.starts_with("Current configuration:") => in_top_failures = false,
            // The continuation of a multi-line example message, or text outside the lists.
            _ => {}
        }
    }
    tools.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    failures.extend(tools.into_iter().map(|(tool, _)| ObservedFailure {
        failure_category: "tool_call".to_owned(),
        error_message: String::new(),
        tool_name: Some(tool),
    }));
    failures
}

/// The menu of `prompt` (see the module documentation), candidates first in the generator's
/// order, then logged answers no candidate matched in canonical order.
pub fn menu(truths: &WorldTruths, prompt: &RftPrompt) -> Result<Vec<MenuItem>, BaselineError> {
    let failures = observed_failures(&prompt.user_turn);
    let mut items: Vec<MenuItem> = Vec::new();
    let mut position: BTreeMap<String, usize> = BTreeMap::new();
    for candidate in candidate_diffs(&prompt.current_config, &failures) {
        let answer = canonical_answer(&prompt.current_config, &candidate.diff);
        // A candidate that changes nothing once normalized is no answer a model could give (the
        // grader calls it malformed).
        if answer == "{}" || position.contains_key(&answer) {
            continue;
        }
        let patch: Value = serde_json::from_str(&answer).unwrap_or(candidate.diff);
        position.insert(answer.clone(), items.len());
        items.push(MenuItem {
            acceptance_probability: truths.acceptance_probability(prompt, &patch)?,
            answer,
            proposed: 0,
            candidate: true,
        });
    }
    for (answer, verdicts) in &prompt.logged {
        let proposed = verdicts.approved.saturating_add(verdicts.rejected);
        if let Some(&i) = position.get(answer) {
            items[i].proposed = items[i].proposed.saturating_add(proposed);
            continue;
        }
        let patch: Value =
            serde_json::from_str(answer).map_err(|source| BaselineError::LoggedAnswer {
                prompt: prompt.id.clone(),
                answer: answer.clone(),
                source,
            })?;
        position.insert(answer.clone(), items.len());
        items.push(MenuItem {
            acceptance_probability: truths.acceptance_probability(prompt, &patch)?,
            answer: answer.clone(),
            proposed,
            candidate: false,
        });
    }
    Ok(items)
}

/// The floors and the ceiling of one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptBaselines {
    /// The prompt's id (`RftPrompt::id`).
    pub id: String,
    /// Distinct answers in its menu.
    pub menu_size: usize,
    /// Logged proposals (approved + rejected) in this context.
    pub logged_proposals: u32,
    /// Mean true acceptance of the platform's proposals here, each weighted by how often it was
    /// proposed; `None` when nothing was logged.
    pub logged_heuristic: Option<f64>,
    /// Mean true acceptance over the menu: a uniformly random pick.
    pub random_from_menu: f64,
    /// The menu's best true acceptance.
    pub menu_oracle: f64,
    /// The answer that reaches it (first in menu order on ties).
    pub oracle_answer: String,
}

impl PromptBaselines {
    /// The figures of `menu` for prompt `id`.
    pub fn of_menu(id: &str, menu: &[MenuItem]) -> Result<Self, BaselineError> {
        let mut best: Option<&MenuItem> = None;
        for item in menu {
            if best.is_none_or(|b| item.acceptance_probability > b.acceptance_probability) {
                best = Some(item);
            }
        }
        let best = best.ok_or_else(|| BaselineError::EmptyMenu { prompt: id.into() })?;
        let proposals: u64 = menu.iter().map(|i| u64::from(i.proposed)).sum();
        let logged_heuristic = (proposals > 0).then(|| {
            menu.iter()
                .map(|i| f64::from(i.proposed) * i.acceptance_probability)
                .sum::<f64>()
                / proposals as f64
        });
        Ok(Self {
            id: id.to_owned(),
            menu_size: menu.len(),
            logged_proposals: u32::try_from(proposals).unwrap_or(u32::MAX),
            logged_heuristic,
            random_from_menu: menu.iter().map(|i| i.acceptance_probability).sum::<f64>()
                / menu.len() as f64,
            menu_oracle: best.acceptance_probability,
            oracle_answer: best.answer.clone(),
        })
    }
}

/// The baselines over a set of prompts: means over prompts, and each prompt's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baselines {
    pub prompts: usize,
    /// Mean over the prompts with logged proposals (all of an export's prompts have some).
    pub logged_heuristic: Option<f64>,
    /// How many prompts [`Self::logged_heuristic`] averages.
    pub logged_prompts: usize,
    pub random_from_menu: f64,
    pub menu_oracle: f64,
    pub mean_menu_size: f64,
    /// In the order of the prompts given.
    pub per_prompt: Vec<PromptBaselines>,
}

/// The baselines of `prompts` in the world of `truths`.
pub fn baselines(truths: &WorldTruths, prompts: &[&RftPrompt]) -> Result<Baselines, BaselineError> {
    let per_prompt = prompts
        .iter()
        .map(|prompt| PromptBaselines::of_menu(&prompt.id, &menu(truths, prompt)?))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(summarize(per_prompt))
}

/// Means over prompts of per-prompt figures.
pub fn summarize(per_prompt: Vec<PromptBaselines>) -> Baselines {
    let count = per_prompt.len().max(1) as f64;
    let logged: Vec<f64> = per_prompt
        .iter()
        .filter_map(|p| p.logged_heuristic)
        .collect();
    Baselines {
        prompts: per_prompt.len(),
        logged_heuristic: (!logged.is_empty())
            .then(|| logged.iter().sum::<f64>() / logged.len() as f64),
        logged_prompts: logged.len(),
        random_from_menu: per_prompt.iter().map(|p| p.random_from_menu).sum::<f64>() / count,
        menu_oracle: per_prompt.iter().map(|p| p.menu_oracle).sum::<f64>() / count,
        mean_menu_size: per_prompt.iter().map(|p| p.menu_size as f64).sum::<f64>() / count,
        per_prompt,
    }
}

/// The share of the gap from `reference` to `oracle` that `model` closes: (model − reference) /
/// (oracle − reference). Negative when the model is worse than the reference, above 1 when it
/// beats the menu (an answer outside it); `None` when there is no gap to close (the reference
/// already reaches the oracle, within 1e-9) or a figure is not finite.
pub fn gap_closed(model: f64, reference: f64, oracle: f64) -> Option<f64> {
    let gap = oracle - reference;
    (model.is_finite() && gap.is_finite() && gap > 1e-9).then(|| (model - reference) / gap)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::export::Split;
    use crate::rft::dataset::LoggedVerdicts;
    use crate::world::{GroundTruth, World, WorldParams};

    fn item(answer: &str, p: f64, proposed: u32, candidate: bool) -> MenuItem {
        MenuItem {
            answer: answer.into(),
            acceptance_probability: p,
            proposed,
            candidate,
        }
    }

    #[test]
    fn figures_of_a_hand_made_menu() {
        let menu = [
            item("a", 0.2, 3, true),
            item("b", 0.5, 0, true),
            item("c", 0.8, 1, false),
            item("d", 0.8, 0, true),
        ];
        let figures = PromptBaselines::of_menu("p", &menu).unwrap();
        // Logged: (3·0.2 + 1·0.8) / 4; random: (0.2 + 0.5 + 0.8 + 0.8) / 4; oracle: 0.8, the
        // first to reach it.
        assert!((figures.logged_heuristic.unwrap() - 0.35).abs() < 1e-12);
        assert!((figures.random_from_menu - 0.575).abs() < 1e-12);
        assert_eq!(figures.menu_oracle, 0.8);
        assert_eq!(figures.oracle_answer, "c");
        assert_eq!((figures.menu_size, figures.logged_proposals), (4, 4));

        let unlogged = PromptBaselines::of_menu("q", &[item("a", 0.3, 0, true)]).unwrap();
        assert_eq!(unlogged.logged_heuristic, None);
        assert!(matches!(
            PromptBaselines::of_menu("r", &[]),
            Err(BaselineError::EmptyMenu { .. })
        ));

        let summary = summarize(vec![figures, unlogged]);
        assert_eq!(summary.logged_prompts, 1);
        assert!((summary.logged_heuristic.unwrap() - 0.35).abs() < 1e-12);
        assert!((summary.menu_oracle - 0.55).abs() < 1e-12);
        assert!((summary.random_from_menu - (0.575 + 0.3) / 2.0).abs() < 1e-12);
        assert!((summary.mean_menu_size - 2.5).abs() < 1e-12);
    }

    #[test]
    fn gap_closed_is_the_share_of_the_way_to_the_oracle() {
        assert!((gap_closed(0.6, 0.4, 0.8).unwrap() - 0.5).abs() < 1e-12);
        assert!((gap_closed(0.3, 0.4, 0.8).unwrap() + 0.25).abs() < 1e-12);
        assert!((gap_closed(0.9, 0.4, 0.8).unwrap() - 1.25).abs() < 1e-12);
        assert_eq!(gap_closed(0.6, 0.8, 0.8), None);
        assert_eq!(gap_closed(0.6, 0.9, 0.8), None);
        assert_eq!(gap_closed(f64::NAN, 0.4, 0.8), None);
    }

    #[test]
    fn failures_are_read_back_from_the_user_turn() {
        let turn = "7 of 10 runs failed (mean reliability 0.41).\nTop failures:\n\
            - timeout (tool_timeout) x4: \"web_search timed out after 5000 ms\"\n\
            - rate_limit (rate_limited) x2: \"429: slow down\"\n\
            Failing tool calls: calculator x2; web_search x4; crm_lookup x2\n\
            Current configuration: {\"model\":\"m\"}\nUser: ml_engineer, domain saas.\n\
            Recommend one configuration change as a JSON object.";
        let failures = observed_failures(turn);
        let described: Vec<(&str, &str, Option<&str>)> = failures
            .iter()
            .map(|f| {
                (
                    f.failure_category.as_str(),
                    f.error_message.as_str(),
                    f.tool_name.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            described,
            [
                ("timeout", "web_search timed out after 5000 ms", None),
                ("rate_limit", "429: slow down", None),
                ("tool_call", "", Some("web_search")),
                ("tool_call", "", Some("calculator")),
                ("tool_call", "", Some("crm_lookup")),
            ]
        );
        assert!(
            observed_failures(
                "No runs recorded for this configuration.\nCurrent configuration: {}"
            )
            .is_empty()
        );
    }

    /// A prompt on configuration `truth` of the world, with two logged diffs and a failing tool.
    fn world_prompt(config_id: &str, current: Value) -> RftPrompt {
        let mut logged = BTreeMap::new();
        logged.insert(
            canonical_answer(&current, &json!({"temperature": 0.05})),
            LoggedVerdicts {
                approved: 1,
                rejected: 2,
            },
        );
        logged.insert(
            canonical_answer(&current, &json!({"timeout_s": 300})),
            LoggedVerdicts {
                approved: 1,
                rejected: 0,
            },
        );
        RftPrompt {
            id: format!("acme/{config_id}/1"),
            org: "acme".into(),
            config_id: config_id.into(),
            split: Split::Validation,
            user_turn: format!(
                "3 of 5 runs failed (mean reliability 0.40).\nTop failures:\n\
                 - timeout (tool_timeout) x3: \"web_search timed out after 30000 ms\"\n\
                 Failing tool calls: web_search x3\nCurrent configuration: {current}\n\
                 Recommend one configuration change as a JSON object."
            ),
            current_config: current,
            logged,
            accepted_completions: Vec::new(),
            logged_completions: Default::default(),
            cluster: None,
            facts: Default::default(),
        }
    }

    #[test]
    fn baselines_match_a_brute_force_oracle_on_a_tiny_world() {
        let params = WorldParams {
            seed: 3,
            outcomes: 400,
            ..WorldParams::default()
        };
        let world = World::new(params.clone()).unwrap();
        let configs: Vec<_> = world.config_truths().take(6).collect();
        let prompts: Vec<RftPrompt> = configs
            .iter()
            .map(|t| world_prompt(&t.config_id, t.initial_config.clone()))
            .collect();
        let refs: Vec<&RftPrompt> = prompts.iter().collect();
        let truths = WorldTruths::new(params.clone(), refs.iter().copied()).unwrap();
        let report = baselines(&truths, &refs).unwrap();
        assert_eq!(report.prompts, prompts.len());
        assert_eq!(report.logged_prompts, prompts.len());
        for ((prompt, truth), figures) in prompts.iter().zip(&configs).zip(&report.per_prompt) {
            assert_eq!(figures.id, prompt.id);
            // By hand: every candidate and logged diff, judged on its minimal patch.
            let p = |diff: &Value| {
                let patch: Value =
                    serde_json::from_str(&canonical_answer(&prompt.current_config, diff)).unwrap();
                GroundTruth.acceptance_probability(
                    &truth.user,
                    &truth.hidden,
                    &prompt.current_config,
                    &patch,
                )
            };
            let failures = observed_failures(&prompt.user_turn);
            assert_eq!(failures.len(), 2, "one group and one tool");
            let mut all: Vec<f64> = candidate_diffs(&prompt.current_config, &failures)
                .iter()
                .map(|c| p(&c.diff))
                .collect();
            let low = p(&json!({"temperature": 0.05}));
            let high = p(&json!({"timeout_s": 300}));
            all.extend([low, high]);
            let oracle = all.iter().copied().fold(f64::MIN, f64::max);
            assert!((figures.menu_oracle - oracle).abs() < 1e-12);
            // Proposed 1 + 2 and 1 times.
            let logged = (3.0 * low + high) / 4.0;
            assert!((figures.logged_heuristic.unwrap() - logged).abs() < 1e-12);
            assert_eq!(figures.logged_proposals, 4);
            assert!(figures.menu_size >= 10, "{}", figures.menu_size);
            assert!(figures.menu_oracle >= figures.logged_heuristic.unwrap());
            assert!(figures.logged_heuristic.unwrap() >= 0.0);
            assert!(figures.menu_oracle >= figures.random_from_menu);
            assert!(figures.random_from_menu > 0.0);
        }
        assert!(report.menu_oracle >= report.logged_heuristic.unwrap());
        assert!(report.menu_oracle > report.random_from_menu);

        let stranger = world_prompt("not-a-config", json!({"model": "openai/gpt-4o-mini"}));
        let err = WorldTruths::new(params, [&stranger])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not-a-config"), "{err}");
    }

    #[test]
    fn a_logged_answer_that_is_not_json_is_named() {
        let params = WorldParams {
            seed: 3,
            outcomes: 400,
            ..WorldParams::default()
        };
        let world = World::new(params.clone()).unwrap();
        let truth = world.config_truths().next().unwrap();
        let mut prompt = world_prompt(&truth.config_id, truth.initial_config.clone());
        prompt.logged.insert(
            "{not json".into(),
            LoggedVerdicts {
                approved: 1,
                rejected: 0,
            },
        );
        let truths = WorldTruths::new(params, [&prompt]).unwrap();
        let err = menu(&truths, &prompt).unwrap_err().to_string();
        assert!(
            err.contains("{not json") && err.contains(&prompt.id),
            "{err}"
        );
    }
}
