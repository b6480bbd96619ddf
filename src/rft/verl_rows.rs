//! The prompts of an RFT data set as verl's dataset rows (`arc-rec export --format verl`): one
//! JSON line per prompt, with the chat messages arc-rec's own rollouts render through the model's
//! chat template, and in `extra_info` what `arc-rec grade serve` needs to find and check the
//! prompt it grades.
//!
//! verl (`verl/utils/dataset/rl_dataset.py`) reads `.jsonl` through Hugging Face `datasets`,
//! which infers one Arrow schema for every row: so every field has one type in every row (a
//! configuration, whose keys differ between rows, travels as a canonical JSON string, and absent
//! values are `null`).

use std::io::{self, Write};

use serde_json::{Value, json};

use super::dataset::{RftDataset, RftPrompt};
use crate::domain::agent_config::canonical_json;
use crate::export::example::SYSTEM_PROMPT;
use crate::export::{Origin, Split};

/// `data_source` of every row (verl passes it to `compute_score`; the grader checks it).
pub const DATA_SOURCE: &str = "arc-rec";
/// `ability` of every row.
pub const ABILITY: &str = "configuration-recommendation";

/// The synthetic world a data set was simulated from (`simulate --seed --outcomes`), written
/// into every row so a reader knows which world's grader judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorldOrigin {
    pub seed: u64,
    pub outcomes: usize,
}

/// What [`write_rows`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RowsWritten {
    pub rows: u64,
    pub bytes: u64,
}

/// One prompt as a verl row.
pub fn row(prompt: &RftPrompt, index: usize, world: Option<WorldOrigin>) -> Value {
    // What `logged` accepts there, as canonical answers (verl shows ground_truth to a reward
    // function; arc-rec's grader reads its own copy of the data and ignores it).
    let accepted: Vec<&str> = prompt
        .logged
        .iter()
        .filter(|(_, verdicts)| verdicts.accepted())
        .map(|(answer, _)| answer.as_str())
        .collect();
    json!({
        "data_source": DATA_SOURCE,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt.user_turn},
        ],
        "ability": ABILITY,
        "reward_model": {
            "style": "rule",
            "ground_truth": serde_json::to_string(&accepted).expect("strings serialize"),
        },
        "extra_info": {
            "index": index,
            "prompt_id": prompt.id,
            "organization": prompt.org,
            "configuration_id": prompt.config_id,
            "split": prompt.split.name(),
            "cluster": prompt.cluster,
            "current_configuration": canonical_json(&prompt.current_config),
            // `served` when every logged decision of the context answers a recommendation
            // arc-rec served, else `platform`.
            "origin": if !prompt.facts.decisions.is_empty()
                && prompt.facts.decisions.iter().all(|d| d.origin() == Origin::Served)
            {
                Origin::Served
            } else {
                Origin::Platform
            }
            .name(),
            "world_seed": world.map(|w| w.seed),
            "world_outcomes": world.map(|w| w.outcomes),
        },
    })
}

/// Writes one row per prompt of `dataset` (only `split`'s, when given), in the data set's order.
pub fn write_rows(
    dataset: &RftDataset,
    split: Option<Split>,
    world: Option<WorldOrigin>,
    out: &mut impl Write,
) -> io::Result<RowsWritten> {
    let mut written = RowsWritten::default();
    let mut line = Vec::with_capacity(4096);
    for (index, prompt) in dataset
        .prompts
        .iter()
        .filter(|p| split.is_none_or(|s| p.split == s))
        .enumerate()
    {
        line.clear();
        serde_json::to_writer(&mut line, &row(prompt, index, world))
            .expect("rows serialize to JSON");
        line.push(b'\n');
        out.write_all(&line)?;
        written.rows += 1;
        written.bytes += line.len() as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::rft::dataset::tests::line;

    /// Three contexts: c1 (one answer approved and rejected once each, another rejected) and c2
    /// in whichever split their ids hash to, c3 forced into validation.
    fn dataset() -> RftDataset {
        let text = [
            line(
                "acme/d1",
                "c1",
                "approved",
                json!({"temperature": 0.2}),
                "train",
            ),
            line(
                "acme/d2",
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
            line(
                "acme/d4",
                "c2",
                "approved",
                json!({"temperature": 0.3}),
                "train",
            ),
            line(
                "acme/d5",
                "c3",
                "rejected",
                json!({"temperature": 0.9}),
                "validation",
            ),
        ]
        .join("\n");
        RftDataset::read(text.as_bytes(), Path::new("examples.jsonl")).unwrap()
    }

    #[test]
    fn rows_carry_the_messages_and_what_the_grader_checks() {
        let dataset = dataset();
        let mut out = Vec::new();
        let written = write_rows(
            &dataset,
            None,
            Some(WorldOrigin {
                seed: 7,
                outcomes: 900,
            }),
            &mut out,
        )
        .unwrap();
        assert_eq!(written.rows as usize, dataset.prompts.len());
        assert_eq!(written.bytes as usize, out.len());
        let rows: Vec<Value> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        for (index, (row, prompt)) in rows.iter().zip(&dataset.prompts).enumerate() {
            assert_eq!(row["data_source"], DATA_SOURCE);
            assert_eq!(row["prompt"][0]["content"], SYSTEM_PROMPT);
            assert_eq!(row["prompt"][1]["role"], "user");
            assert_eq!(row["prompt"][1]["content"], prompt.user_turn.as_str());
            let extra = &row["extra_info"];
            assert_eq!(extra["index"], index);
            assert_eq!(extra["prompt_id"], prompt.id.as_str());
            assert_eq!(extra["organization"], prompt.org.as_str());
            assert_eq!(extra["configuration_id"], prompt.config_id.as_str());
            assert_eq!(extra["world_seed"], 7);
            assert_eq!(extra["world_outcomes"], 900);
            let config: Value =
                serde_json::from_str(extra["current_configuration"].as_str().unwrap()).unwrap();
            assert_eq!(config, prompt.current_config);
            let truth: Vec<String> =
                serde_json::from_str(row["reward_model"]["ground_truth"].as_str().unwrap())
                    .unwrap();
            let accepted: Vec<String> = prompt
                .logged
                .iter()
                .filter(|(_, v)| v.accepted())
                .map(|(a, _)| a.clone())
                .collect();
            assert_eq!(truth, accepted);
        }
    }

    #[test]
    fn a_split_keeps_its_prompts_and_numbers_them_from_zero() {
        let dataset = dataset();
        for split in [Split::Train, Split::Validation, Split::Test] {
            let mut out = Vec::new();
            let written = write_rows(&dataset, Some(split), None, &mut out).unwrap();
            let expected = dataset.split(split).len();
            assert_eq!(written.rows as usize, expected);
            let text = String::from_utf8(out).unwrap();
            for (index, line) in text.lines().enumerate() {
                let row: Value = serde_json::from_str(line).unwrap();
                assert_eq!(row["extra_info"]["index"], index);
                assert!(row["extra_info"]["world_seed"].is_null());
            }
        }
    }
}
