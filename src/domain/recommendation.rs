//! The recommendation vocabulary, in the platform's own words (its RL plan and CLI messages).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What kind of change a recommendation makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecommendationType {
    /// A cheaper model that keeps at least 95% of the current reliability.
    Cheapest,
    /// The most reliable option regardless of cost.
    HighestPerf,
    /// The best reliability per dollar.
    Balanced,
    /// Another model for this failure pattern.
    ModelSwitch,
    /// Retries (attempts, backoff).
    RetryPolicy,
    /// Longer or shorter timeouts.
    TimeoutAdjustment,
    /// A different sampling temperature.
    Temperature,
    /// Tools added, removed or reconfigured.
    ToolConfiguration,
}

impl RecommendationType {
    /// Every type.
    pub const ALL: [RecommendationType; 8] = [
        RecommendationType::Cheapest,
        RecommendationType::HighestPerf,
        RecommendationType::Balanced,
        RecommendationType::ModelSwitch,
        RecommendationType::RetryPolicy,
        RecommendationType::TimeoutAdjustment,
        RecommendationType::Temperature,
        RecommendationType::ToolConfiguration,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecommendationType::Cheapest => "cheapest",
            RecommendationType::HighestPerf => "highest_perf",
            RecommendationType::Balanced => "balanced",
            RecommendationType::ModelSwitch => "model_switch",
            RecommendationType::RetryPolicy => "retry_policy",
            RecommendationType::TimeoutAdjustment => "timeout_adjustment",
            RecommendationType::Temperature => "temperature",
            RecommendationType::ToolConfiguration => "tool_configuration",
        }
    }

    /// Parses the snake_case name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The type a diff most plausibly is when nobody said: by the one field it changes, or
    /// `balanced` for a change of several fields.
    pub fn infer(diff: &Value) -> Option<Self> {
        let object = diff.as_object()?;
        let mut keys = object
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "system_prompt");
        let first = keys.next()?;
        if keys.next().is_some() {
            return Some(RecommendationType::Balanced);
        }
        Some(match first {
            "model" => RecommendationType::ModelSwitch,
            "retry" => RecommendationType::RetryPolicy,
            "timeout_s" => RecommendationType::TimeoutAdjustment,
            "temperature" => RecommendationType::Temperature,
            "tools" => RecommendationType::ToolConfiguration,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_round_trip() {
        for t in RecommendationType::ALL {
            assert_eq!(RecommendationType::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), json!(t.as_str()));
        }
        assert_eq!(RecommendationType::parse("nonsense"), None);
    }

    #[test]
    fn inference_by_changed_field() {
        assert_eq!(
            RecommendationType::infer(&json!({"retry": {"max_attempts": 3}})),
            Some(RecommendationType::RetryPolicy)
        );
        assert_eq!(
            RecommendationType::infer(&json!({"model": "x", "temperature": 0.2})),
            Some(RecommendationType::Balanced)
        );
        assert_eq!(RecommendationType::infer(&json!({"color": "red"})), None);
        assert_eq!(RecommendationType::infer(&json!([])), None);
    }
}
