//! Fitting the learned grader (`rft::learned_grader`) from a run's data and the database's
//! statistics: `train --grader learned` fits its reward on the train split, `candidates` prices
//! the model's ideas with one fitted on every logged decision. The caller opens the database.

use std::collections::BTreeMap;

use anyhow::Context;

use sqlx::PgPool;

use super::TrainSettings;
use crate::candidates::CandidateIndex;
use crate::clustering::ClusterModel;
use crate::export::Split;
use crate::rft::learned_grader::{Calibration, HeldOutCalibration, data_sha256, place_prompts};
use crate::rft::{LearnedGrader, LearnedGraderFile, RftDataset};
use crate::storage::training_runs;

/// Which logged decisions the grader learns from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitOn {
    /// The train split (an RL reward: validation and test stay held out; AUC on validation).
    TrainSplit,
    /// Every split (a serving prior: nothing is evaluated on the data).
    Everything,
}

/// A fitted grader and one line saying what it was fitted on (for the command to print).
#[derive(Debug)]
pub struct FittedGrader {
    pub grader: LearnedGrader,
    pub summary: String,
    /// Fitted on the train split: how it predicts the validation split's logged decisions.
    pub held_out: Option<HeldOutCalibration>,
}

impl FittedGrader {
    /// What `grader.json` keeps: the fit and its held-out calibration.
    pub fn to_file(&self) -> LearnedGraderFile {
        LearnedGraderFile {
            held_out: self.held_out.clone(),
            ..self.grader.to_file()
        }
    }
}

/// Fits the learned grader on `dataset`'s decisions (`on`), pricing model switches with each
/// organization's candidate index and placing contexts with its clustering model, both read
/// from the database.
pub async fn fit_learned_grader(
    pool: &PgPool,
    settings: &TrainSettings,
    dataset: &RftDataset,
    on: FitOn,
) -> anyhow::Result<FittedGrader> {
    let orgs = dataset.organizations();
    let (indexes, models) = async {
        let unknown = training_runs::unknown_orgs(pool, &orgs).await?;
        if !unknown.is_empty() {
            anyhow::bail!(
                "organization(s) {} of --data are not in the database, whose statistics price the model switches the grader scores; ingest their history first",
                unknown.join(", ")
            );
        }
        let mut indexes = Vec::with_capacity(orgs.len());
        let mut models = BTreeMap::new();
        for org in &orgs {
            indexes.push(CandidateIndex::load(pool, org).await?);
            if let Some(stored) = crate::storage::clusters::load_model(pool, org).await? {
                let model = ClusterModel::from_stored(stored)
                    .with_context(|| format!("the clustering model of {org}"))?;
                models.insert(org.clone(), model);
            }
        }
        anyhow::Ok((indexes, models))
    }
    .await
    .context("the learned grader: cannot read the organizations' statistics and clustering models")?;
    let placements = place_prompts(&dataset.prompts, &models);
    let sha = data_sha256(&settings.data)
        .with_context(|| format!("--data {}", settings.data.display()))?;
    let placed = placements.len();
    let (grader, fitted_on) = match on {
        FitOn::TrainSplit => (
            LearnedGrader::fit(
                dataset.split(Split::Train),
                indexes,
                placements,
                settings.learned_pessimism(),
                sha,
            )?,
            "the train split",
        ),
        FitOn::Everything => (
            LearnedGrader::fit(
                &dataset.prompts,
                indexes,
                placements,
                settings.learned_pessimism(),
                sha,
            )?,
            "every split",
        ),
    };
    let held_out = match on {
        FitOn::TrainSplit => grader.calibration(dataset.split(Split::Validation)),
        FitOn::Everything => None,
    };
    let summary = format!(
        "learned grader: fitted on {} logged decisions of {fitted_on} (κ = {}, floor: {}, served answers weighted: {}; {placed} of {} contexts placed by a clustering model){}",
        grader.observations(),
        settings.learned_lcb_z,
        settings.learned_floor.as_str(),
        settings.learned_served_weighting.as_str(),
        dataset.prompts.len(),
        held_out.as_ref().map(held_out_text).unwrap_or_default()
    );
    Ok(FittedGrader {
        grader,
        summary,
        held_out,
    })
}

/// `; AUC a on the N held-out decisions (log-loss l, calibration error e; platform: …; served:
/// …)`: the held-out figures, by origin when the data has both.
fn held_out_text(held_out: &HeldOutCalibration) -> String {
    let figures = |c: &Calibration| {
        format!(
            "log-loss {:.3}, calibration error {:.3}",
            c.log_loss, c.calibration_error
        )
    };
    let auc = |c: &Calibration| c.auc.map_or("–".to_owned(), |a| format!("{a:.3}"));
    let all = &held_out.all;
    let mut text = format!(
        "; AUC {} on the {} held-out decisions ({}",
        auc(all),
        all.decisions,
        figures(all)
    );
    if held_out.by_origin.len() > 1 {
        for (origin, c) in &held_out.by_origin {
            text.push_str(&format!(
                "; {origin}: {} decisions, AUC {}, {}",
                c.decisions,
                auc(c),
                figures(c)
            ));
        }
    }
    text.push(')');
    text
}
