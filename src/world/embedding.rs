//! Synthetic `error_embedding`s: unit vectors that cluster by latent failure mode, with a smaller
//! pull towards the tool involved and noise, so a clusterer has real but imperfect structure to
//! find (like text embeddings of log lines, which group by cause but not perfectly).

use rand::Rng;

use super::catalogue::TOOLS;
use super::failure::FailureMode;
use super::sampling::{normal, stream_rng};

/// Length of the tool's pull relative to the mode centre (unit length).
const TOOL_PULL: f64 = 0.35;
/// Length of the per-failure noise vector.
const NOISE: f64 = 0.3;

/// Draws embeddings of one fixed dimension.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ErrorEmbedder {
    dim: usize,
    mode_centres: Vec<Vec<f64>>,
    /// One direction per catalogue tool, plus a last one for tools the catalogue lacks.
    tool_directions: Vec<Vec<f64>>,
}

impl ErrorEmbedder {
    /// Centres and directions come from their own stream of the world seed, so they do not
    /// depend on how much history was generated.
    pub fn new(seed: u64, dim: usize) -> Self {
        let mut rng = stream_rng(seed, super::STREAM_EMBEDDING);
        let mode_centres = (0..FailureMode::COUNT)
            .map(|_| unit_vector(&mut rng, dim))
            .collect();
        let tool_directions = (0..=TOOLS.len())
            .map(|_| unit_vector(&mut rng, dim))
            .collect();
        Self {
            dim,
            mode_centres,
            tool_directions,
        }
    }

    /// An embedding of one failure of `mode` involving `tool`.
    pub fn embed<R: Rng + ?Sized>(
        &self,
        mode: FailureMode,
        tool: Option<&str>,
        rng: &mut R,
    ) -> Vec<f32> {
        let centre = &self.mode_centres[mode.index()];
        let tool_direction = tool.map(|name| {
            let i = TOOLS
                .iter()
                .position(|t| t.name == name)
                .unwrap_or(TOOLS.len());
            &self.tool_directions[i]
        });
        let noise_sd = NOISE / (self.dim as f64).sqrt();
        let mut v: Vec<f64> = (0..self.dim)
            .map(|i| {
                let pull = tool_direction.map_or(0.0, |d| TOOL_PULL * d[i]);
                centre[i] + pull + normal(rng, 0.0, noise_sd)
            })
            .collect();
        normalize(&mut v);
        v.into_iter().map(|x| x as f32).collect()
    }

    /// The normalized mean of several embeddings (a context's cluster embedding).
    pub fn mean(&self, embeddings: &[Vec<f32>]) -> Option<Vec<f32>> {
        if embeddings.is_empty() {
            return None;
        }
        let mut sum = vec![0.0f64; self.dim];
        for e in embeddings {
            for (s, x) in sum.iter_mut().zip(e) {
                *s += f64::from(*x);
            }
        }
        normalize(&mut sum);
        Some(sum.into_iter().map(|x| x as f32).collect())
    }
}

fn unit_vector<R: Rng + ?Sized>(rng: &mut R, dim: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..dim).map(|_| normal(rng, 0.0, 1.0)).collect();
    normalize(&mut v);
    v
}

fn normalize(v: &mut [f64]) {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 1e-12 {
        for x in v.iter_mut() {
            *x /= norm;
        }
    } else if let Some(first) = v.first_mut() {
        // A zero vector has no direction; pick one so the result is still a unit vector.
        *first = 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    }

    #[test]
    fn embeddings_cluster_by_mode() {
        let embedder = ErrorEmbedder::new(7, 64);
        let mut rng = stream_rng(7, 99);
        let a1 = embedder.embed(FailureMode::ToolTimeout, Some("web_search"), &mut rng);
        let a2 = embedder.embed(FailureMode::ToolTimeout, Some("sql_query"), &mut rng);
        let b = embedder.embed(FailureMode::RateLimit, None, &mut rng);
        assert_eq!(a1.len(), 64);
        assert!(
            cosine(&a1, &a2) > cosine(&a1, &b) + 0.3,
            "{} vs {}",
            cosine(&a1, &a2),
            cosine(&a1, &b)
        );
    }
}
