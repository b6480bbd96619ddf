//! The prompts of an RFT run, read from an `arc-rec export` file (format `arc`): one prompt per
//! context (organization, configuration, user turn), with the canonical answers people approved
//! or rejected there (what the `logged` grader matches) and the accepted recommendations as the
//! model should write them (the supervised warm-up's targets).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::completion::canonical_answer;
use super::schema::Catalogue;
use crate::export::Split;
use crate::export::example::{FailureGroup, Origin, PromptContext, Recommendation, ServedDecision};

/// Organization → the names its diffs may use ([`RftDataset::catalogues`]).
pub type Catalogues = BTreeMap<String, Catalogue>;

/// How often people approved and rejected one canonical answer in one context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoggedVerdicts {
    pub approved: u32,
    pub rejected: u32,
}

impl LoggedVerdicts {
    /// Accepted when approvals outnumber rejections (a tie counts as accepted: someone did).
    pub fn accepted(&self) -> bool {
        self.approved > 0 && self.approved >= self.rejected
    }
}

/// One logged decision: the diff the platform proposed in a context and whether it was approved.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedDecision {
    pub diff: Value,
    pub approved: bool,
    /// How arc-rec served it, for an answer to a served recommendation (export origin
    /// `served`); `None` for the platform's own decisions.
    pub served: Option<ServedDecision>,
}

impl LoggedDecision {
    /// Served when arc-rec served it, else the platform's.
    pub fn origin(&self) -> Origin {
        if self.served.is_some() {
            Origin::Served
        } else {
            Origin::Platform
        }
    }
}

/// What a prompt's examples say about its context beyond the text the model reads: the inputs
/// of the learned grader's features (`rft::learned_grader`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptFacts {
    /// The failure groups of its first example.
    pub failures: Vec<FailureGroup>,
    pub user_role: Option<String>,
    pub domain: Option<String>,
    /// Every logged decision of the context, in file order.
    pub decisions: Vec<LoggedDecision>,
}

/// One context the recommender is asked about.
#[derive(Debug, Clone, PartialEq)]
pub struct RftPrompt {
    /// `org/config_id/n`, unique in the data set, stable across runs of the same file.
    pub id: String,
    pub org: String,
    pub config_id: String,
    pub split: Split,
    /// The user turn (the system prompt is `export::example::SYSTEM_PROMPT`).
    pub user_turn: String,
    /// The configuration a recommendation changes.
    pub current_config: Value,
    /// Canonical answer → what people decided about it here.
    pub logged: BTreeMap<String, LoggedVerdicts>,
    /// Accepted recommendations, as completions (warm-up targets), in file order.
    pub accepted_completions: Vec<String>,
    /// Canonical answer → the first logged recommendation with that answer here, as a
    /// completion: the menu the checkpoint criterion scores the policy on
    /// (`training::selection`), each item judged by `logged`.
    pub logged_completions: BTreeMap<String, String>,
    /// The context's dominant failure cluster as the export wrote it (the stored
    /// `pattern_cluster_id` when the history was clustered before the export, else the dominant
    /// failure category; `None` without failures): that of its first example that names one.
    pub cluster: Option<String>,
    pub facts: PromptFacts,
}

/// The prompts of a data file, in the order their first example appears.
#[derive(Debug, Clone, PartialEq)]
pub struct RftDataset {
    pub path: PathBuf,
    pub prompts: Vec<RftPrompt>,
    /// Example lines read.
    pub examples: usize,
}

/// A data file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read the data file {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}, line {line}: {message}", path.display())]
    BadLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("the data file {} holds no examples (write one with `arc-rec export --out FILE`)", path.display())]
    Empty { path: PathBuf },
}

/// The fields of an `arc`-format export line that RFT reads (the rest is ignored).
#[derive(Debug, Deserialize)]
struct ExampleLine {
    id: String,
    org: String,
    config_id: String,
    split: Split,
    #[serde(default)]
    cluster: Option<String>,
    context: PromptContext,
    recommendation: Recommendation,
    outcome: OutcomeLine,
    /// Absent in exports made before served answers were exported: the platform's.
    #[serde(default)]
    served: Option<ServedDecision>,
}

#[derive(Debug, Deserialize)]
struct OutcomeLine {
    approval_status: String,
}

impl RftDataset {
    /// Reads an `arc-rec export` file (format `arc`).
    pub fn load(path: &Path) -> Result<Self, DatasetError> {
        let file = std::fs::File::open(path).map_err(|source| DatasetError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::read(std::io::BufReader::new(file), path)
    }

    /// Reads export lines from `reader`; `path` names it in errors.
    pub fn read(reader: impl BufRead, path: &Path) -> Result<Self, DatasetError> {
        let bad = |line: usize, message: String| DatasetError::BadLine {
            path: path.to_owned(),
            line,
            message,
        };
        let mut prompts: Vec<RftPrompt> = Vec::new();
        // (org, config_id, user turn) → index into `prompts`; the smallest example id decides a
        // prompt's split, so a context never sits in both.
        let mut index: BTreeMap<(String, String, String), (usize, String)> = BTreeMap::new();
        let mut per_config: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut examples = 0;
        for (number, line) in reader.lines().enumerate() {
            let number = number + 1;
            let line = line.map_err(|source| DatasetError::Io {
                path: path.to_owned(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let mut deserializer = serde_json::Deserializer::from_str(&line);
            let example: ExampleLine = serde_path_to_error::deserialize(&mut deserializer)
                .map_err(|e| {
                    let field = e.path().to_string();
                    let hint = if line.contains("\"messages\"") {
                        " (this looks like a chat-format export; RFT reads `arc-rec export --format arc`)"
                    } else {
                        ""
                    };
                    if field == "." {
                        bad(number, format!("{}{hint}", e.inner()))
                    } else {
                        bad(number, format!("field `{field}`: {}{hint}", e.inner()))
                    }
                })?;
            let decision = match example.outcome.approval_status.as_str() {
                "approved" => true,
                "rejected" => false,
                other => {
                    return Err(bad(
                        number,
                        format!(
                            "field `outcome.approval_status`: {other:?} is not approved or rejected"
                        ),
                    ));
                }
            };
            if !example.context.current_config.is_object() {
                return Err(bad(
                    number,
                    "field `context.current_config`: must be a JSON object".to_owned(),
                ));
            }
            examples += 1;
            let user_turn = example.context.user_turn();
            let key = (
                example.org.clone(),
                example.config_id.clone(),
                user_turn.clone(),
            );
            let slot = match index.get_mut(&key) {
                Some((slot, smallest)) => {
                    if example.id < *smallest {
                        *smallest = example.id.clone();
                        prompts[*slot].split = example.split;
                    }
                    *slot
                }
                None => {
                    let n = per_config
                        .entry((example.org.clone(), example.config_id.clone()))
                        .or_insert(0);
                    *n += 1;
                    prompts.push(RftPrompt {
                        id: format!("{}/{}/{}", example.org, example.config_id, n),
                        org: example.org.clone(),
                        config_id: example.config_id.clone(),
                        split: example.split,
                        user_turn,
                        current_config: example.context.current_config.clone(),
                        logged: BTreeMap::new(),
                        accepted_completions: Vec::new(),
                        logged_completions: BTreeMap::new(),
                        cluster: None,
                        facts: PromptFacts {
                            failures: example.context.failures.clone(),
                            user_role: user_field(&example.context.user_context, "user_role"),
                            domain: user_field(&example.context.user_context, "domain"),
                            decisions: Vec::new(),
                        },
                    });
                    index.insert(key, (prompts.len() - 1, example.id.clone()));
                    prompts.len() - 1
                }
            };
            let prompt = &mut prompts[slot];
            if prompt.cluster.is_none() {
                prompt.cluster = example.cluster;
            }
            prompt.facts.decisions.push(LoggedDecision {
                diff: example.recommendation.diff.clone(),
                approved: decision,
                served: example.served,
            });
            let answer = canonical_answer(&prompt.current_config, &example.recommendation.diff);
            let completion = example.recommendation.completion_text();
            let verdicts = prompt.logged.entry(answer.clone()).or_default();
            if decision {
                verdicts.approved += 1;
                prompt.accepted_completions.push(completion.clone());
            } else {
                verdicts.rejected += 1;
            }
            prompt
                .logged_completions
                .entry(answer)
                .or_insert(completion);
        }
        if prompts.is_empty() {
            return Err(DatasetError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(RftDataset {
            path: path.to_owned(),
            prompts,
            examples,
        })
    }

    /// The prompts of one split.
    pub fn split(&self, split: Split) -> Vec<&RftPrompt> {
        self.prompts.iter().filter(|p| p.split == split).collect()
    }

    /// The split figures are reported on: test, which nothing was chosen on; validation for an
    /// export made before the test split existed (none of its prompts is in test).
    pub fn reported_split(&self) -> Split {
        if self.prompts.iter().any(|p| p.split == Split::Test) {
            Split::Test
        } else {
            Split::Validation
        }
    }

    /// Each organization's catalogue of model and tool names: those of its prompts' current
    /// configurations and logged diffs (every split: a context's configuration is input, not a
    /// label). What the recommendation grammar lets a diff name.
    pub fn catalogues(&self) -> Catalogues {
        let mut catalogues = Catalogues::new();
        for prompt in &self.prompts {
            let catalogue = catalogues.entry(prompt.org.clone()).or_default();
            catalogue.add(&prompt.current_config);
            for decision in &prompt.facts.decisions {
                catalogue.add(&decision.diff);
            }
        }
        catalogues
    }

    /// The organizations its prompts belong to, sorted, each once.
    pub fn organizations(&self) -> Vec<String> {
        let orgs: std::collections::BTreeSet<&str> =
            self.prompts.iter().map(|p| p.org.as_str()).collect();
        orgs.into_iter().map(str::to_owned).collect()
    }
}

/// A string field of an export's `user_context` object.
fn user_field(user_context: &Value, field: &str) -> Option<String> {
    user_context.get(field)?.as_str().map(str::to_owned)
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// One `arc` export line of organization acme.
    pub(crate) fn line(id: &str, config: &str, status: &str, diff: Value, split: &str) -> String {
        json!({
            "id": id, "org": "acme", "diff_id": id, "config_id": config,
            "created_at": "2026-06-01T00:00:00Z", "split": split, "cluster": null,
            "context": {
                "failure_summary": "3 of 10 runs failed.", "failures": [], "failing_tools": {},
                "current_config": {"model": "m", "temperature": 0.7},
                "user_context": {"user_role": "ml_engineer", "domain": "saas"}
            },
            "recommendation": {"type": "temperature", "diff": diff, "rationale": "Cooler.",
                               "llm_generated": false},
            "outcome": {"approval_status": status, "runs_before": 10, "failed_runs_before": 3,
                        "reliability_before": 0.7, "cost_per_run_before": null, "runs_after": 0,
                        "reliability_after": null, "cost_per_run_after": null},
            "reward": {}
        })
        .to_string()
    }

    fn read(text: &str) -> Result<RftDataset, DatasetError> {
        RftDataset::read(text.as_bytes(), Path::new("data.jsonl"))
    }

    #[test]
    fn examples_of_one_context_make_one_prompt() {
        let text = [
            line(
                "acme/d2",
                "c1",
                "approved",
                json!({"temperature": 0.2}),
                "validation",
            ),
            line(
                "acme/d1",
                "c1",
                "rejected",
                json!({"temperature": 0.2}),
                "train",
            ),
            line(
                "acme/d3",
                "c1",
                "rejected",
                json!({"temperature": 1.5}),
                "train",
            ),
            String::new(),
            line(
                "acme/d4",
                "c2",
                "approved",
                json!({"temperature": 0.3}),
                "train",
            ),
        ]
        .join("\n");
        let data = read(&text).unwrap();
        assert_eq!(data.examples, 4);
        assert_eq!(data.prompts.len(), 2);
        let first = &data.prompts[0];
        assert_eq!(first.id, "acme/c1/1");
        // The smallest example id (d1) is in train.
        assert_eq!(first.split, Split::Train);
        assert_eq!(
            first.logged[r#"{"temperature":0.2}"#],
            LoggedVerdicts {
                approved: 1,
                rejected: 1
            }
        );
        assert!(first.logged[r#"{"temperature":0.2}"#].accepted());
        assert!(!first.logged[r#"{"temperature":1.5}"#].accepted());
        assert_eq!(first.accepted_completions.len(), 1);
        // Every decision is kept, in file order, and the context's user.
        let decisions: Vec<(&Value, bool)> = first
            .facts
            .decisions
            .iter()
            .map(|d| (&d.diff, d.approved))
            .collect();
        assert_eq!(
            decisions,
            [
                (&json!({"temperature": 0.2}), true),
                (&json!({"temperature": 0.2}), false),
                (&json!({"temperature": 1.5}), false)
            ]
        );
        assert_eq!(first.facts.user_role.as_deref(), Some("ml_engineer"));
        assert_eq!(first.facts.domain.as_deref(), Some("saas"));
        assert!(
            first
                .user_turn
                .ends_with("Recommend one configuration change as a JSON object.")
        );
        assert_eq!(data.split(Split::Train).len(), 2);
    }

    #[test]
    fn figures_are_reported_on_test_and_on_validation_for_an_export_without_test() {
        let diff = json!({"temperature": 0.2});
        let old = [
            line("d1", "c1", "approved", diff.clone(), "train"),
            line("d2", "c2", "rejected", diff.clone(), "validation"),
        ];
        let data = read(&old.join("\n")).unwrap();
        assert_eq!(data.reported_split(), Split::Validation);
        let new = [
            line("d1", "c1", "approved", diff.clone(), "train"),
            line("d2", "c2", "rejected", diff.clone(), "validation"),
            line("d3", "c3", "rejected", diff, "test"),
        ];
        let data = read(&new.join("\n")).unwrap();
        assert_eq!(data.reported_split(), Split::Test);
        assert_eq!(data.split(Split::Test).len(), 1);
        assert_eq!(data.split(Split::Validation).len(), 1);
    }

    #[test]
    fn bad_files_are_named_with_line_and_field() {
        let err = read("{\"id\": 1}").unwrap_err().to_string();
        assert!(err.starts_with("data.jsonl, line 1: field `id`"), "{err}");
        let chat = r#"{"messages":[{"role":"user","content":"x"}]}"#;
        let err = read(chat).unwrap_err().to_string();
        assert!(err.contains("chat-format export"), "{err}");
        let err = read("not json").unwrap_err().to_string();
        assert!(err.starts_with("data.jsonl, line 1: "), "{err}");
        let pending = line(
            "acme/d1",
            "c1",
            "pending",
            json!({"temperature": 0.2}),
            "train",
        );
        let err = read(&pending).unwrap_err().to_string();
        assert!(err.contains("outcome.approval_status"), "{err}");
        let err = read("\n\n").unwrap_err().to_string();
        assert!(err.contains("holds no examples"), "{err}");
        // The CLI prints the chain (`{:#}`): the OS error once, after the path.
        let err = anyhow::Error::from(
            RftDataset::load(Path::new("/nonexistent/data.jsonl")).unwrap_err(),
        );
        let err = format!("{err:#}");
        assert!(
            err.starts_with("cannot read the data file /nonexistent/data.jsonl: "),
            "{err}"
        );
        assert_eq!(err.matches("(os error").count(), 1, "{err}");
    }
}
