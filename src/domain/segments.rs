//! The user segments the platform knows: roles and business domains. The bandit gives each its
//! own feature and the synthetic world draws its users from them; other values are accepted and
//! simply carry no segment feature.

/// User roles on the platform.
pub const ROLES: [&str; 6] = [
    "senior_ml_engineer",
    "ml_engineer",
    "data_scientist",
    "platform_engineer",
    "product_manager",
    "engineering_manager",
];

/// Business domains of organizations, users and scenarios.
pub const DOMAINS: [&str; 6] = [
    "fintech",
    "healthcare",
    "ecommerce",
    "saas",
    "insurance",
    "analytics",
];
