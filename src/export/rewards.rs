//! Reward rules from the platform's RL plan, applied to one past recommendation.
//!
//! Outcome rewards: accepted +1, rejected −1, reliability improved +0.5, format valid +0.1.
//! Process rewards from the trajectories of the applied configuration: tool timeout −0.1 and
//! successful tool call +0.05 per run. Following the plan ("avoid complex multi-rewards
//! initially"), the process reward is reported beside the total, not folded into it.

use serde::Serialize;

/// The plan's constants.
pub const ACCEPTED: f64 = 1.0;
/// Reward for a rejected recommendation.
pub const REJECTED: f64 = -1.0;
/// Bonus when the applied change raised mean reliability.
pub const RELIABILITY_IMPROVED: f64 = 0.5;
/// Bonus for a well-formed recommendation.
pub const FORMAT_VALID: f64 = 0.1;
/// Process penalty per tool timeout (per run).
pub const TOOL_TIMEOUT: f64 = -0.1;
/// Process bonus per successful tool call (per run).
pub const SUCCESSFUL_TOOL_CALL: f64 = 0.05;
/// Reliability must rise by more than this (one point of a 0–1 score) to count as improved, so
/// noise in a handful of re-runs does not earn the bonus.
pub const RELIABILITY_EPSILON: f64 = 0.01;

/// What was decided about a recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Accepted,
    Rejected,
}

/// The facts the rules look at.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardInputs {
    pub decision: Decision,
    /// Mean reliability of the configuration before the change (its runs).
    pub reliability_before: Option<f64>,
    /// Mean reliability after the change, when it was applied and re-run.
    pub reliability_after: Option<f64>,
    /// The recommendation is a valid, effective diff of a known type.
    pub format_valid: bool,
    /// Runs of the applied configuration and what its trajectories show.
    pub after_runs: i64,
    pub after_tool_timeouts: i64,
    pub after_successful_tool_calls: i64,
}

/// The process-reward features of the applied configuration's trajectories.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessReward {
    pub runs: i64,
    pub tool_timeouts_per_run: f64,
    pub successful_tool_calls_per_run: f64,
    /// `TOOL_TIMEOUT × timeouts/run + SUCCESSFUL_TOOL_CALL × successes/run`.
    pub value: f64,
}

/// The reward of one recommendation, with every rule's part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reward {
    /// acceptance + reliability bonus + format bonus.
    pub total: f64,
    /// +1 / −1: what RL training uses by default.
    pub binary: f64,
    pub acceptance: f64,
    pub reliability_improved: bool,
    pub reliability_bonus: f64,
    /// after − before, when both are known.
    pub reliability_delta: Option<f64>,
    pub format_valid: bool,
    pub format_bonus: f64,
    /// Present when the change was applied and its runs have trajectories.
    pub process: Option<ProcessReward>,
}

/// Applies the rules.
pub fn reward(inputs: &RewardInputs) -> Reward {
    let acceptance = match inputs.decision {
        Decision::Accepted => ACCEPTED,
        Decision::Rejected => REJECTED,
    };
    let reliability_delta = match (inputs.reliability_before, inputs.reliability_after) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    let reliability_improved = reliability_delta.is_some_and(|d| d > RELIABILITY_EPSILON);
    let reliability_bonus = if reliability_improved {
        RELIABILITY_IMPROVED
    } else {
        0.0
    };
    let format_bonus = if inputs.format_valid {
        FORMAT_VALID
    } else {
        0.0
    };
    let process = (inputs.after_runs > 0).then(|| {
        let runs = inputs.after_runs as f64;
        let timeouts = inputs.after_tool_timeouts as f64 / runs;
        let successes = inputs.after_successful_tool_calls as f64 / runs;
        ProcessReward {
            runs: inputs.after_runs,
            tool_timeouts_per_run: timeouts,
            successful_tool_calls_per_run: successes,
            value: TOOL_TIMEOUT * timeouts + SUCCESSFUL_TOOL_CALL * successes,
        }
    });
    Reward {
        total: acceptance + reliability_bonus + format_bonus,
        binary: acceptance,
        acceptance,
        reliability_improved,
        reliability_bonus,
        reliability_delta,
        format_valid: inputs.format_valid,
        format_bonus,
        process,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(decision: Decision) -> RewardInputs {
        RewardInputs {
            decision,
            reliability_before: None,
            reliability_after: None,
            format_valid: false,
            after_runs: 0,
            after_tool_timeouts: 0,
            after_successful_tool_calls: 0,
        }
    }

    #[test]
    fn accepted_is_plus_one_and_rejected_minus_one() {
        assert_eq!(reward(&inputs(Decision::Accepted)).total, 1.0);
        assert_eq!(reward(&inputs(Decision::Rejected)).total, -1.0);
        assert_eq!(reward(&inputs(Decision::Rejected)).binary, -1.0);
    }

    #[test]
    fn reliability_improvement_adds_half() {
        let mut i = inputs(Decision::Accepted);
        i.reliability_before = Some(0.40);
        i.reliability_after = Some(0.70);
        let r = reward(&i);
        assert!(r.reliability_improved);
        assert!((r.total - 1.5).abs() < 1e-12);
        assert!((r.reliability_delta.unwrap() - 0.30).abs() < 1e-12);
    }

    #[test]
    fn no_bonus_for_noise_or_regression() {
        let mut i = inputs(Decision::Accepted);
        i.reliability_before = Some(0.700);
        i.reliability_after = Some(0.705);
        assert!(!reward(&i).reliability_improved);
        i.reliability_after = Some(0.5);
        assert_eq!(reward(&i).total, 1.0);
    }

    #[test]
    fn format_valid_adds_a_tenth() {
        let mut i = inputs(Decision::Rejected);
        i.format_valid = true;
        assert!((reward(&i).total - (-0.9)).abs() < 1e-12);
    }

    #[test]
    fn process_reward_counts_timeouts_and_successes_per_run() {
        let mut i = inputs(Decision::Accepted);
        i.after_runs = 4;
        i.after_tool_timeouts = 2;
        i.after_successful_tool_calls = 12;
        let p = reward(&i).process.unwrap();
        // 2/4 timeouts × −0.1 + 12/4 successes × 0.05 = −0.05 + 0.15.
        assert!((p.value - 0.10).abs() < 1e-12, "{}", p.value);
        // The process reward is reported, not added to the total.
        assert_eq!(reward(&i).total, 1.0);
    }
}
