//! Thompson-sampling contextual bandit (filled in by the serving issue).
