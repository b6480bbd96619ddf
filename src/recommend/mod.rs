//! Serving recommendations: placing a failure context, generating candidates, ranking them with
//! the bandit, logging the decision durably, and learning from feedback. HTTP-free.

pub mod decision_writer;
