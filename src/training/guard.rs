//! KL control and the divergence guard of the RL phase: the adaptive KL coefficient, the moving
//! average of KL that decides a blow-up, and what a rollback changes. Pure arithmetic over the
//! per-step KL figure; the loop applies the decisions and the checkpoint keeps the state.
//!
//! - **Adaptive KL** (Ziegler et al. 2019, as in lm-human-preferences, verl and OpenRLHF):
//!   `β ← β · (1 + clip(KL / target − 1, −0.2, 0.2) · samples / horizon)`, with the horizon in
//!   samples, not steps: at 32 samples a step and a horizon of 10,000 β would hardly move over a
//!   whole run (±14 % in 200 steps), so arc-rec's default is a few hundred.
//! - **Guard**: an exponential moving average of the per-token KL, `m ← (1 − α) m + α KL`,
//!   against `--max-kl`. One batch's KL is noisy (a handful of samples), while drift builds over
//!   many steps; a non-finite loss or gradient diverges at once.
//! - **Rollback**: back to the newest checkpoint at or before the failed step, with the salt
//!   bumped (the retried steps draw other prompts and samples: retrying the same batch failed the
//!   same way every time), the learning rate halved and β raised.

use serde::{Deserialize, Serialize};

/// Weight of the newest KL figure in the moving average.
pub const KL_AVERAGE_WEIGHT: f64 = 0.2;
/// The adaptive controller's proportional error is clipped to ±this per update.
const KL_ERROR_CLIP: f64 = 0.2;
/// After a rollback β is at least this (so a run without a KL penalty gets one).
pub const ROLLBACK_MIN_KL_COEF: f64 = 0.02;

/// How β evolves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KlControl {
    /// β stays where it is (rollbacks aside).
    Fixed,
    /// β follows the measured KL towards `target` nats per token.
    Adaptive { target: f64, horizon_samples: f64 },
}

/// What the guard and the controller carry from step to step (kept in the checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GuardState {
    /// The current KL coefficient β.
    pub kl_coef: f64,
    /// The moving average of the per-token KL; `None` before the first RL step.
    pub kl_average: Option<f64>,
}

impl GuardState {
    /// A run's start: β as configured, no KL seen.
    pub fn start(kl_coef: f64) -> Self {
        Self {
            kl_coef,
            kl_average: None,
        }
    }

    /// Folds in a step's KL (taken before its update, so it measures every earlier update) and
    /// says whether the run has diverged. On `Ok` the state has moved on: the average includes
    /// this KL and β is adapted for the next step, using `samples` samples of evidence.
    pub fn observe(
        &mut self,
        kl: f64,
        samples: usize,
        control: KlControl,
        max_kl: f64,
    ) -> Result<(), String> {
        if !kl.is_finite() {
            return Err(format!("KL per token is {kl}"));
        }
        let average = match self.kl_average {
            Some(previous) => (1.0 - KL_AVERAGE_WEIGHT) * previous + KL_AVERAGE_WEIGHT * kl,
            None => kl,
        };
        if average > max_kl {
            return Err(format!(
                "moving average of KL per token {average:.4} (this step {kl:.4}) exceeds --max-kl {max_kl}"
            ));
        }
        self.kl_average = Some(average);
        if let KlControl::Adaptive {
            target,
            horizon_samples,
        } = control
        {
            let error = (kl / target - 1.0).clamp(-KL_ERROR_CLIP, KL_ERROR_CLIP);
            self.kl_coef *= 1.0 + error * samples as f64 / horizon_samples;
        }
        Ok(())
    }

    /// The state a retry starts from: the checkpoint's, with β doubled (at least
    /// [`ROLLBACK_MIN_KL_COEF`]).
    pub fn after_rollback(self) -> Self {
        Self {
            kl_coef: (2.0 * self.kl_coef).max(ROLLBACK_MIN_KL_COEF),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADAPTIVE: KlControl = KlControl::Adaptive {
        target: 0.05,
        horizon_samples: 320.0,
    };

    #[test]
    fn beta_rises_above_the_target_and_falls_below_it() {
        let mut state = GuardState::start(0.1);
        state.observe(0.5, 32, ADAPTIVE, 2.0).unwrap();
        // Error clipped to +0.2, times 32/320: β · 1.02.
        assert!((state.kl_coef - 0.102).abs() < 1e-12, "{}", state.kl_coef);
        let mut state = GuardState::start(0.1);
        state.observe(0.0, 32, ADAPTIVE, 2.0).unwrap();
        assert!((state.kl_coef - 0.098).abs() < 1e-12);
        let mut state = GuardState::start(0.1);
        state.observe(0.5, 32, KlControl::Fixed, 2.0).unwrap();
        assert_eq!(state.kl_coef, 0.1);
    }

    #[test]
    fn the_guard_watches_the_average_not_one_batch() {
        let mut state = GuardState::start(0.0);
        for _ in 0..10 {
            state.observe(0.1, 32, KlControl::Fixed, 1.0).unwrap();
        }
        // One noisy batch at 3× the limit moves the average to 0.08 + 0.6 = 0.68: no blow-up.
        state.observe(3.0, 32, KlControl::Fixed, 1.0).unwrap();
        assert!((state.kl_average.unwrap() - 0.68).abs() < 1e-9);
        // Sustained drift does trip it.
        let tripped = (0..10).find_map(|_| state.observe(3.0, 32, KlControl::Fixed, 1.0).err());
        let reason = tripped.expect("sustained KL must trip the guard");
        assert!(reason.contains("--max-kl"), "{reason}");
        assert!(state.observe(f64::NAN, 32, KlControl::Fixed, 1.0).is_err());
    }

    #[test]
    fn a_rollback_raises_beta() {
        assert_eq!(
            GuardState::start(0.0).after_rollback().kl_coef,
            ROLLBACK_MIN_KL_COEF
        );
        assert_eq!(GuardState::start(0.1).after_rollback().kl_coef, 0.2);
    }
}
