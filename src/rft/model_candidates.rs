//! The recommender model's candidates for serving, the parts that need no model: which contexts
//! the model is asked about (per organization and failure cluster, the cluster's typical
//! configuration with the user turn the export rendered for it), which of its completions become
//! candidates (the graders' format check, only models and tools the organization has run, then
//! serving's hard constraints), and how one
//! organization's candidates from several clusters are stored (one row per candidate id).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::completion::parse_recommendation;
use super::dataset::{RftDataset, RftPrompt};
use super::learned_grader::{LearnedGrader, LearnedGraderError};
use crate::candidates::{CandidateIndex, UnknownName, finalize};
use crate::domain::agent_config::config_hash;
use crate::domain::{Candidate, CandidateSource};
use crate::storage::candidate_stats::SavedCandidates;

/// One context the model generates candidates for: the typical configuration of one
/// (organization, failure cluster).
#[derive(Debug, Clone, PartialEq)]
pub struct ServingContext<'a> {
    pub org: &'a str,
    /// The failure cluster as the export wrote it ([`RftPrompt::cluster`]): a stored cluster id
    /// when the history was clustered before the export, else a failure category.
    pub cluster: &'a str,
    /// The prompt of the typical configuration: its rendered user turn and configuration.
    pub prompt: &'a RftPrompt,
    /// Contexts (prompts) of the organization in this cluster.
    pub cluster_contexts: usize,
    /// Decided examples of those contexts.
    pub cluster_examples: usize,
    /// Decided examples whose context has the typical configuration.
    pub config_examples: usize,
}

/// The decided examples (approved or rejected recommendations) behind a prompt.
fn examples(prompt: &RftPrompt) -> usize {
    prompt
        .logged
        .values()
        .map(|v| v.approved as usize + v.rejected as usize)
        .sum()
}

/// One context per (organization, failure cluster) of the data set's prompts: the configuration
/// (compared by [`config_hash`], whatever its `config_id`) with the most decided examples among
/// the cluster's contexts, and of its prompts the one with the most examples (ties: the first in
/// file order). Prompts without a failure cluster (no failure recorded before the change) are
/// left out: a recommendation request always has a failure context. Ordered by organization, then
/// by the cluster's examples (most first), then cluster.
pub fn serving_contexts(dataset: &RftDataset) -> Vec<ServingContext<'_>> {
    let mut groups: BTreeMap<(&str, &str), Vec<&RftPrompt>> = BTreeMap::new();
    for prompt in &dataset.prompts {
        if let Some(cluster) = prompt.cluster.as_deref() {
            groups
                .entry((prompt.org.as_str(), cluster))
                .or_default()
                .push(prompt);
        }
    }
    let mut contexts: Vec<ServingContext<'_>> = groups
        .into_iter()
        .map(|((org, cluster), prompts)| {
            let hashes: Vec<String> = prompts
                .iter()
                .map(|p| config_hash(&p.current_config))
                .collect();
            // Configuration → (examples, first position).
            let mut configs: HashMap<&str, (usize, usize)> = HashMap::new();
            for (i, (prompt, hash)) in prompts.iter().zip(&hashes).enumerate() {
                configs.entry(hash.as_str()).or_insert((0, i)).0 += examples(prompt);
            }
            let (typical, (config_examples, _)) = configs
                .iter()
                .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.1.1.cmp(&a.1.1)))
                .map(|(hash, counts)| (*hash, *counts))
                .expect("a group has a prompt");
            let mut chosen: Option<&RftPrompt> = None;
            for (prompt, hash) in prompts.iter().zip(&hashes) {
                if hash == typical && chosen.is_none_or(|c| examples(prompt) > examples(c)) {
                    chosen = Some(prompt);
                }
            }
            ServingContext {
                org,
                cluster,
                prompt: chosen.expect("the typical configuration has a prompt"),
                cluster_contexts: prompts.len(),
                cluster_examples: prompts.iter().map(|p| examples(p)).sum(),
                config_examples,
            }
        })
        .collect();
    contexts.sort_by(|a, b| {
        a.org
            .cmp(b.org)
            .then(b.cluster_examples.cmp(&a.cluster_examples))
            .then(a.cluster.cmp(b.cluster))
    });
    contexts
}

/// What one context's completions gave.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Harvest {
    /// Completions read.
    pub generated: usize,
    /// Completions that passed the graders' format check ([`parse_recommendation`]).
    pub valid: usize,
    /// Why the others did not, by [`super::FormatError::kind`].
    pub format_errors: BTreeMap<&'static str, usize>,
    /// Valid ones dropped for bringing in a model or tool the organization has never run
    /// ([`CandidateIndex::unknown_name`]), with the first such name.
    pub unknown_names: usize,
    pub first_unknown: Option<UnknownName>,
    /// The valid ones that also pass serving's hard constraints for the context's configuration
    /// ([`finalize`]: valid merge patch and result, a real change, no two with the same effect)
    /// and name only models and tools the organization has run, as candidates of
    /// `model_version_id`.
    pub candidates: Vec<Candidate>,
}

/// Reads a context's completions as candidates. A candidate's diff is the completion's canonical
/// answer (the minimal merge patch to the configuration it leads to, so keys the model repeated
/// unchanged are not imposed on other configurations), its description the completion's
/// rationale; expected deltas and evidence are 0 (the model gives no estimate of its own, and the
/// bandit learns the candidate's worth from feedback). A diff bringing in a model or tool
/// `index` (the context's organization's) has no entry for is dropped: the heuristics propose
/// only what the organization has run, and an invented name (a recommender model wrote tools
/// named "}}," and "retry_policy") has nothing to price it or show it exists.
pub fn harvest(
    prompt: &RftPrompt,
    completions: &[String],
    model_version_id: &str,
    index: &CandidateIndex,
) -> Harvest {
    let mut harvest = Harvest {
        generated: completions.len(),
        ..Harvest::default()
    };
    let mut drafts = Vec::with_capacity(completions.len());
    for text in completions {
        let parsed = match parse_recommendation(text, &prompt.current_config) {
            Ok(parsed) => parsed,
            Err(error) => {
                *harvest.format_errors.entry(error.kind()).or_insert(0) += 1;
                continue;
            }
        };
        harvest.valid += 1;
        let diff = parsed.patch;
        if let Some(name) = index.unknown_name(&prompt.current_config, &diff) {
            harvest.unknown_names += 1;
            harvest.first_unknown.get_or_insert(name);
            continue;
        }
        drafts.push(Candidate {
            candidate_id: Candidate::id_for(parsed.kind, &diff),
            recommendation_type: parsed.kind,
            diff,
            description: parsed.rationale.trim().to_owned(),
            expected_reliability_delta: 0.0,
            expected_cost_delta_usd: 0.0,
            evidence_count: 0,
            source: CandidateSource::Model {
                model_version_id: model_version_id.to_owned(),
                prior: None,
            },
        });
    }
    harvest.candidates = finalize(&prompt.current_config, drafts, None, usize::MAX);
    harvest
}

/// Candidates with the cluster they are for (`None`: any cluster): one context's, before
/// [`merge_clusters`].
pub type ClusterCandidates = (Option<String>, Vec<Candidate>);

/// One stored candidate with the cluster it is for (`None`: any cluster).
pub type StoredCandidate = (Option<String>, Candidate);

/// One organization's candidates as stored: one row per candidate id, for the cluster of the
/// contexts that proposed it, or for any cluster (`None`) when contexts of several clusters (or
/// one without a stored cluster) proposed it. The first proposal's type, diff and rationale are
/// kept; rows are in the order candidates first appear.
pub fn merge_clusters(
    per_context: impl IntoIterator<Item = ClusterCandidates>,
) -> Vec<StoredCandidate> {
    let mut rows: Vec<StoredCandidate> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    for (cluster, candidates) in per_context {
        for candidate in candidates {
            match position.get(&candidate.candidate_id) {
                Some(&i) => {
                    if rows[i].0 != cluster {
                        rows[i].0 = None;
                    }
                }
                None => {
                    position.insert(candidate.candidate_id.clone(), rows.len());
                    rows.push((cluster.clone(), candidate));
                }
            }
        }
    }
    rows
}

/// One line of a candidates file (`arc-rec candidates --out`, read by `arc-rec bench pipeline`):
/// a stored candidate of one organization, as the database would hold it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateLine {
    pub org: String,
    /// The failure cluster it was generated for (`None`: any).
    pub cluster: Option<String>,
    pub candidate: Candidate,
}

/// Why a candidates file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CandidateFileError {
    #[error("{path}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a candidate line of `arc-rec candidates --out`: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
}

/// Reads a candidates file into each organization's candidates, in file order.
pub fn read_candidate_lines(
    path: &std::path::Path,
) -> Result<BTreeMap<String, Vec<StoredCandidate>>, CandidateFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CandidateFileError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut orgs: BTreeMap<String, Vec<StoredCandidate>> = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let parsed: CandidateLine =
            serde_json::from_str(line).map_err(|e| CandidateFileError::Line {
                path: shown.clone(),
                line: i + 1,
                message: e.to_string(),
            })?;
        if parsed.candidate.candidate_id
            != Candidate::id_for(parsed.candidate.recommendation_type, &parsed.candidate.diff)
        {
            return Err(CandidateFileError::Line {
                path: shown,
                line: i + 1,
                message: "candidate_id does not match its type and diff".into(),
            });
        }
        orgs.entry(parsed.org)
            .or_default()
            .push((parsed.cluster, parsed.candidate));
    }
    Ok(orgs)
}

/// Writes each organization's candidates as [`CandidateLine`]s.
pub fn candidate_lines(
    rows: &BTreeMap<String, Vec<StoredCandidate>>,
) -> Result<String, serde_json::Error> {
    let mut out = String::new();
    for (org, candidates) in rows {
        for (cluster, candidate) in candidates {
            let line = CandidateLine {
                org: org.clone(),
                cluster: cluster.clone(),
                candidate: candidate.clone(),
            };
            out.push_str(&serde_json::to_string(&line)?);
            out.push('\n');
        }
    }
    Ok(out)
}

/// One organization's figures in `arc-rec candidates`' table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OrgSummary {
    /// Contexts asked about.
    pub contexts: usize,
    /// Completions read.
    pub generated: usize,
    /// Completions that passed the graders' format check.
    pub valid: usize,
    /// Valid ones dropped for naming a model or tool the organization has never run.
    pub unknown: usize,
    /// Valid ones with no unknown name that pass serving's hard constraints.
    pub passed: usize,
    /// Rows priced at the learned grader's floor, p = 0 (outside the data's support in every
    /// context that proposed it), and so not stored ([`price`]).
    pub floored: usize,
    /// Rows to store (a candidate proposed in several contexts is one row).
    pub rows: usize,
    /// Rows tied to one failure cluster.
    pub for_cluster: usize,
    /// What the database write did (zero when the candidates go to a file).
    pub saved: SavedCandidates,
}

impl OrgSummary {
    fn add(&mut self, other: &OrgSummary) {
        self.contexts += other.contexts;
        self.generated += other.generated;
        self.valid += other.valid;
        self.unknown += other.unknown;
        self.passed += other.passed;
        self.floored += other.floored;
        self.rows += other.rows;
        self.for_cluster += other.for_cluster;
        self.saved.inserted += other.saved.inserted;
        self.saved.updated += other.saved.updated;
    }
}

/// Every context's harvest, gathered per organization into the rows to store.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    pub summaries: BTreeMap<String, OrgSummary>,
    /// Per organization, the rows to store ([`merge_clusters`]).
    pub rows: BTreeMap<String, Vec<StoredCandidate>>,
    /// Contexts whose cluster is not an active stored cluster of their organization: their
    /// candidates are stored for any cluster.
    pub unmatched: usize,
    /// Format errors by kind, over every context.
    pub format_errors: BTreeMap<&'static str, usize>,
    /// The first unknown name met, as `NAME in ORG`.
    pub first_unknown: Option<String>,
}

/// Gathers the harvests of `contexts` (in the same order) per organization. Candidates of a
/// context whose cluster is not one of its organization's `stored_clusters` (an export made
/// before `arc-rec cluster`, whose clusters are failure categories, or clusters renamed since)
/// are stored for any cluster.
pub fn gather(
    contexts: &[ServingContext<'_>],
    harvests: &[Harvest],
    stored_clusters: &BTreeMap<String, BTreeSet<String>>,
) -> Gathered {
    let mut gathered = Gathered::default();
    let mut per_org: BTreeMap<&str, Vec<ClusterCandidates>> = BTreeMap::new();
    for (context, harvest) in contexts.iter().zip(harvests) {
        let stored = stored_clusters
            .get(context.org)
            .is_some_and(|ids| ids.contains(context.cluster));
        if !stored {
            gathered.unmatched += 1;
        }
        let summary = gathered
            .summaries
            .entry(context.org.to_owned())
            .or_default();
        summary.contexts += 1;
        summary.generated += harvest.generated;
        summary.valid += harvest.valid;
        summary.unknown += harvest.unknown_names;
        summary.passed += harvest.candidates.len();
        if gathered.first_unknown.is_none() {
            gathered.first_unknown = harvest
                .first_unknown
                .as_ref()
                .map(|name| format!("{name} in {}", context.org));
        }
        for (kind, count) in &harvest.format_errors {
            *gathered.format_errors.entry(kind).or_insert(0) += count;
        }
        per_org.entry(context.org).or_default().push((
            stored.then(|| context.cluster.to_owned()),
            harvest.candidates.clone(),
        ));
    }
    gathered.rows = per_org
        .into_iter()
        .map(|(org, per_context)| (org.to_owned(), merge_clusters(per_context)))
        .collect();
    gathered.count_rows();
    gathered
}

impl Gathered {
    /// Each organization's summary counts its rows as they are now.
    fn count_rows(&mut self) {
        for (org, rows) in &self.rows {
            let summary = self.summaries.entry(org.clone()).or_default();
            summary.rows = rows.len();
            summary.for_cluster = rows.iter().filter(|(c, _)| c.is_some()).count();
        }
    }

    /// Every organization's figures summed.
    pub fn total(&self) -> OrgSummary {
        let mut total = OrgSummary::default();
        for summary in self.summaries.values() {
            total.add(summary);
        }
        total
    }

    /// The format errors as `kind count, kind count`; empty when there were none.
    pub fn format_errors_text(&self) -> String {
        self.format_errors
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Candidates to store, over every organization.
    pub fn row_count(&self) -> usize {
        self.rows.values().map(Vec::len).sum()
    }
}

/// Stores with every candidate the learned grader's prior over the contexts that proposed it
/// ([`LearnedGrader::prior`]), and drops the candidates it prices at its floor (mean 0: outside
/// the data's support in every such context, since inside it σ(μ) > 0), counting them in the
/// summaries; returns the kept priors' means, sorted, to show how they spread.
///
/// Why drop rather than store with the floor's uncertainty: serving ranks a priced candidate by
/// the shared model's score of its features plus its prior (`recommend::engine::prior_offset`),
/// so a prior of 0 ± 0 adds nothing and the idea ranks as a heuristic with the same features
/// would: a one-second timeout for a rate-limit failure headed the quick start's answer that way.
/// The floor is the grader's "never seen anything like it", which RL's reward also scored 0, and
/// with no exploration share that could measure such ideas at a bounded price, showing them is
/// all cost.
pub fn price(
    grader: &LearnedGrader,
    contexts: &[ServingContext<'_>],
    harvests: &[Harvest],
    gathered: &mut Gathered,
) -> Result<Vec<f64>, PriceError> {
    let mut proposed: BTreeMap<(&str, &str), Vec<(&RftPrompt, &serde_json::Value)>> =
        BTreeMap::new();
    for (context, harvest) in contexts.iter().zip(harvests) {
        for candidate in &harvest.candidates {
            proposed
                .entry((context.org, candidate.candidate_id.as_str()))
                .or_default()
                .push((context.prompt, &candidate.diff));
        }
    }
    let mut means = Vec::new();
    for (org, org_rows) in gathered.rows.iter_mut() {
        let mut kept = Vec::with_capacity(org_rows.len());
        for (cluster, mut candidate) in std::mem::take(org_rows) {
            let contexts = proposed
                .get(&(org.as_str(), candidate.candidate_id.as_str()))
                .cloned()
                .unwrap_or_default();
            let prior = grader.prior(contexts).map_err(|source| PriceError {
                org: org.clone(),
                candidate_id: candidate.candidate_id.clone(),
                source,
            })?;
            if let (Some(prior), CandidateSource::Model { prior: slot, .. }) =
                (prior, &mut candidate.source)
            {
                if prior.mean == 0.0 {
                    gathered.summaries.entry(org.clone()).or_default().floored += 1;
                    continue;
                }
                means.push(prior.mean);
                *slot = Some(prior);
            }
            kept.push((cluster, candidate));
        }
        *org_rows = kept;
    }
    gathered.count_rows();
    means.sort_by(f64::total_cmp);
    Ok(means)
}

/// A candidate the learned grader could not price.
#[derive(Debug, thiserror::Error)]
#[error("pricing {org}'s candidate {candidate_id}")]
pub struct PriceError {
    pub org: String,
    pub candidate_id: String,
    #[source]
    pub source: LearnedGraderError,
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::domain::RecommendationType;
    use crate::export::Split;
    use crate::rft::LoggedVerdicts;

    fn prompt(
        id: &str,
        org: &str,
        cluster: Option<&str>,
        config: Value,
        decided: u32,
    ) -> RftPrompt {
        let mut logged = BTreeMap::new();
        logged.insert(
            format!("{{\"n\":{id:?}}}"),
            LoggedVerdicts {
                approved: decided,
                rejected: 0,
            },
        );
        RftPrompt {
            id: id.to_owned(),
            org: org.to_owned(),
            config_id: id.to_owned(),
            split: Split::Train,
            user_turn: format!("turn {id}"),
            current_config: config,
            logged,
            accepted_completions: Vec::new(),
            logged_completions: Default::default(),
            cluster: cluster.map(str::to_owned),
            facts: Default::default(),
        }
    }

    fn config(temperature: f64) -> Value {
        json!({"model": "openai/gpt-4.1", "temperature": temperature, "retry": {"max_attempts": 1}})
    }

    fn dataset(prompts: Vec<RftPrompt>) -> RftDataset {
        RftDataset {
            path: "data.jsonl".into(),
            examples: prompts.len(),
            prompts,
        }
    }

    #[test]
    fn one_context_per_org_and_cluster_with_the_most_decided_configuration() {
        let data = dataset(vec![
            prompt("a1", "acme", Some("timeout-web_search"), config(0.7), 2),
            // The same configuration under another config id: their examples add up (2 + 2 > 3).
            prompt("a2", "acme", Some("timeout-web_search"), config(0.9), 3),
            prompt("a3", "acme", Some("timeout-web_search"), config(0.7), 2),
            prompt("a4", "acme", Some("rate_limit"), config(0.5), 1),
            prompt("a5", "acme", None, config(0.1), 9),
            prompt("g1", "globex", Some("timeout-web_search"), config(0.3), 1),
        ]);
        let contexts = serving_contexts(&data);
        let picked: Vec<(&str, &str, &str)> = contexts
            .iter()
            .map(|c| (c.org, c.cluster, c.prompt.id.as_str()))
            .collect();
        assert_eq!(
            picked,
            [
                ("acme", "timeout-web_search", "a1"),
                ("acme", "rate_limit", "a4"),
                ("globex", "timeout-web_search", "g1"),
            ],
            "the configuration with the most examples, its first prompt on a tie; no context \
             without a cluster; clusters by examples"
        );
        assert_eq!(
            (
                contexts[0].cluster_contexts,
                contexts[0].cluster_examples,
                contexts[0].config_examples
            ),
            (3, 7, 4)
        );
    }

    /// A candidate the learned grader prices at its floor (outside the data's support wherever
    /// it was proposed) is not written but counted; one inside the support is written with its
    /// prior.
    #[test]
    fn candidates_priced_at_the_floor_are_not_written() {
        use crate::rft::learned_grader::tests::{fitted, prompt as decided};
        let prompts: Vec<RftPrompt> = (0..30).map(decided).collect();
        let grader = fitted(&prompts);
        let fresh = decided(99);
        let completions: Vec<String> = [
            r#"{"type": "timeout_adjustment", "diff": {"timeout_s": 120}, "rationale": "Longer."}"#,
            // Two seconds: below every timeout the organization's decisions hold.
            r#"{"type": "timeout_adjustment", "diff": {"timeout_s": 2}, "rationale": "Shorter."}"#,
        ]
        .map(str::to_owned)
        .to_vec();
        let harvests = vec![harvest(
            &fresh,
            &completions,
            "rft-1",
            &CandidateIndex::empty("acme"),
        )];
        assert_eq!(harvests[0].candidates.len(), 2, "{:?}", harvests[0]);
        let contexts = vec![ServingContext {
            org: "acme",
            cluster: "timeout",
            prompt: &fresh,
            cluster_contexts: 1,
            cluster_examples: 10,
            config_examples: 10,
        }];
        let mut gathered = gather(&contexts, &harvests, &BTreeMap::new());
        assert_eq!(gathered.total().rows, 2);
        let means = price(&grader, &contexts, &harvests, &mut gathered).unwrap();
        assert_eq!(means.len(), 1, "{means:?}");
        assert!(means[0] > 0.5, "{means:?}");
        let total = gathered.total();
        assert_eq!((total.passed, total.floored, total.rows), (2, 1, 1));
        let (_, kept) = &gathered.rows["acme"][0];
        assert_eq!(kept.diff, json!({"timeout_s": 120}));
        assert!(
            matches!(&kept.source, CandidateSource::Model { prior: Some(p), .. } if p.mean > 0.5),
            "{:?}",
            kept.source
        );
    }

    #[test]
    fn completions_pass_the_format_check_and_the_constraints() {
        let p = prompt("a1", "acme", Some("c"), config(0.7), 1);
        let completions: Vec<String> = [
            // Valid; repeats the unchanged model, which the canonical diff leaves out.
            r#"{"type": "temperature", "diff": {"model": "openai/gpt-4.1", "temperature": 0.2}, "rationale": "Cooler. "}"#,
            // The same effect again: one candidate.
            r#"{"type": "temperature", "diff": {"temperature": 0.20}, "rationale": "Again."}"#,
            r#"{"type": "retry_policy", "diff": {"retry": {"max_attempts": 3}}, "rationale": "Retry."}"#,
            // No change, unknown type, not JSON, invalid result.
            r#"{"type": "temperature", "diff": {"temperature": 0.7}, "rationale": "Same."}"#,
            r#"{"type": "magic", "diff": {"temperature": 0.1}, "rationale": "?"}"#,
            "{\"type\": \"temperature\", \"diff\": {\"tempera",
            r#"{"type": "temperature", "diff": {"temperature": 9}, "rationale": "Hot."}"#,
        ]
        .map(str::to_owned)
        .to_vec();
        let harvest = harvest(&p, &completions, "rft-1", &CandidateIndex::empty("acme"));
        assert_eq!((harvest.generated, harvest.valid), (7, 3));
        assert_eq!(harvest.format_errors.values().sum::<usize>(), 4);
        assert_eq!(harvest.format_errors["no_change"], 1);
        assert_eq!(harvest.candidates.len(), 2, "{:#?}", harvest.candidates);
        let cooler = harvest
            .candidates
            .iter()
            .find(|c| c.recommendation_type == RecommendationType::Temperature)
            .unwrap();
        assert_eq!(cooler.diff, json!({"temperature": 0.2}));
        assert_eq!(cooler.description, "Cooler.");
        assert_eq!(
            cooler.candidate_id,
            Candidate::id_for(cooler.recommendation_type, &cooler.diff)
        );
        assert_eq!(
            cooler.source,
            CandidateSource::Model {
                model_version_id: "rft-1".to_owned(),
                prior: None,
            }
        );
        assert_eq!(
            (
                cooler.expected_reliability_delta,
                cooler.expected_cost_delta_usd,
                cooler.evidence_count
            ),
            (0.0, 0.0, 0)
        );
    }

    #[test]
    fn names_the_organization_has_never_run_are_dropped() {
        let p = prompt(
            "a1",
            "acme",
            Some("c"),
            json!({"model": "openai/gpt-4.1", "temperature": 0.7, "tools": [{"name": "web_search"}]}),
            1,
        );
        let completions: Vec<String> = [
            // What a recommender model wrote, ranked first by serving before this check: every
            // tool replaced by invented ones, one with a timeout of 38,933 s.
            r#"{"type": "tool_configuration", "diff": {"tools": [{"name": "anthropic/claude-3.5-sonnet"}, {"name": "}},"}, {"name": "retry_policy", "timeout_s": 38933}]}, "rationale": "Tools."}"#,
            r#"{"type": "model_switch", "diff": {"model": "acme/gpt-9"}, "rationale": "Bigger."}"#,
            // Known: a tool the organization has run, and a model it has run.
            r#"{"type": "tool_configuration", "diff": {"tools": [{"name": "web_search"}, {"name": "calculator"}]}, "rationale": "Add."}"#,
            r#"{"type": "model_switch", "diff": {"model": "anthropic/claude-3-haiku"}, "rationale": "Cheaper."}"#,
            // Removing a tool brings nothing in.
            r#"{"type": "tool_configuration", "diff": {"tools": []}, "rationale": "Fewer."}"#,
        ]
        .map(str::to_owned)
        .to_vec();
        let rows = crate::storage::candidate_stats::StatsRows {
            models: vec![crate::storage::candidate_stats::ModelRow {
                model: "anthropic/claude-3-haiku".into(),
                runs: 40,
                simulations: 10,
                mean_reliability: Some(0.8),
                mean_cost_usd: Some(0.01),
                usd_per_1k_tokens: Some(0.4),
                success_reliability: None,
                failure_reliability: None,
            }],
            tools: vec![crate::storage::candidate_stats::ToolRow {
                tool: "calculator".into(),
                calls: 20,
                ok_calls: 20,
                p50_ok_ms: Some(5.0),
                p90_ok_ms: Some(9.0),
                versions_configured: 2,
                versions_called: 2,
            }],
            ..Default::default()
        };
        let index = CandidateIndex::from_rows("acme", &rows);
        let harvest = harvest(&p, &completions, "m", &index);
        assert_eq!((harvest.generated, harvest.valid), (5, 5));
        assert_eq!(harvest.unknown_names, 2);
        assert_eq!(
            harvest.first_unknown,
            Some(UnknownName::Tool("anthropic/claude-3.5-sonnet".into()))
        );
        let kept: Vec<&Value> = harvest.candidates.iter().map(|c| &c.diff).collect();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(kept.contains(&&json!({"model": "anthropic/claude-3-haiku"})));
        assert!(kept.contains(&&json!({"tools": []})));
        // With no statistics at all, nothing new is known.
        let bare = super::harvest(&p, &completions, "m", &CandidateIndex::empty("acme"));
        assert_eq!((bare.unknown_names, bare.candidates.len()), (4, 1));
    }

    #[test]
    fn a_candidate_of_several_clusters_is_stored_once_for_any_cluster() {
        let p = prompt("a1", "acme", Some("c"), config(0.7), 1);
        let completion =
            |diff: &str| format!(r#"{{"type": "temperature", "diff": {diff}, "rationale": "r"}}"#);
        let index = CandidateIndex::empty("acme");
        let cool = harvest(&p, &[completion(r#"{"temperature": 0.2}"#)], "m", &index).candidates;
        let warm = harvest(&p, &[completion(r#"{"temperature": 0.9}"#)], "m", &index).candidates;
        let rows = merge_clusters([
            (Some("a".to_owned()), cool.clone()),
            (Some("b".to_owned()), [warm.clone(), cool.clone()].concat()),
            (Some("a".to_owned()), cool.clone()),
        ]);
        assert_eq!(
            rows.iter()
                .map(|(cluster, c)| (cluster.as_deref(), c.diff["temperature"].as_f64()))
                .collect::<Vec<_>>(),
            [(None, Some(0.2)), (Some("b"), Some(0.9))]
        );
        let rows = merge_clusters([
            (Some("a".to_owned()), cool.clone()),
            (Some("a".to_owned()), cool),
        ]);
        assert_eq!(rows[0].0.as_deref(), Some("a"));
    }

    #[test]
    fn unreadable_candidate_files_name_the_path_and_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.jsonl");
        // The CLI prints the chain (`{:#}`): the OS error once, after the path.
        let err = format!(
            "{:#}",
            anyhow::Error::from(read_candidate_lines(&missing).unwrap_err())
        );
        assert!(
            err.starts_with(&format!("{}: ", missing.display())),
            "{err}"
        );
        assert_eq!(err.matches("(os error").count(), 1, "{err}");

        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, "\n{\"org\": 1}\n").unwrap();
        let err = read_candidate_lines(&bad).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}:2: not a candidate line", bad.display())),
            "{err}"
        );
    }
}
