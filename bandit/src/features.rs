//! Feature layout: the context vector z, the candidate vector c and their interaction x = vec(z ⊗ c).
//!
//! z = [1 | cluster | config | user] describes the failure context, c whatever the caller knows
//! about a candidate (type one-hot, expected reliability and cost deltas, evidence, source, a
//! constant 1 for a bias...). The model sees x with x[i·|c| + j] = z[i]·c[j]: every context block
//! interacts with every candidate feature, and the constant 1 in z carries the candidate main
//! effects. One weight vector over x is shared by all clusters and candidates, so a new cluster
//! whose embedding lies near known ones borrows their evidence. Callers log z and c, not x, and
//! recompute x with [`FeatureLayout::interaction`].

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{BanditError, Result, check_values};

/// Largest interaction dimension d accepted. The posterior keeps two d×d matrices, so this caps
/// memory at about 270 MB and rejects absurd layouts (say, from a corrupt state) before
/// allocating.
pub const MAX_DIM: usize = 4096;

/// Names of the feature groups of x, in the order they occupy x. These are the keys of
/// [`crate::Explanation::contributions`].
pub const GROUP_NAMES: [&str; 4] = ["candidate", "cluster", "config", "user"];

/// Block sizes of the context and candidate vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureLayout {
    /// Dimensions of the (reduced) failure-cluster embedding.
    pub cluster_dims: usize,
    /// Dimensions describing the current configuration.
    pub config_dims: usize,
    /// Dimensions describing the user or segment.
    pub user_dims: usize,
    /// Dimensions of a candidate's feature vector.
    pub candidate_dims: usize,
}

impl FeatureLayout {
    /// A validated layout.
    pub fn new(
        cluster_dims: usize,
        config_dims: usize,
        user_dims: usize,
        candidate_dims: usize,
    ) -> Result<Self> {
        let layout = Self {
            cluster_dims,
            config_dims,
            user_dims,
            candidate_dims,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Checks that the candidate block is non-empty and d = |z|·|c| is at most [`MAX_DIM`].
    pub fn validate(&self) -> Result<()> {
        if self.candidate_dims == 0 {
            return Err(BanditError::Invalid {
                field: "layout.candidate_dims",
                reason: "must be at least 1".into(),
            });
        }
        let d = 1usize
            .checked_add(self.cluster_dims)
            .and_then(|n| n.checked_add(self.config_dims))
            .and_then(|n| n.checked_add(self.user_dims))
            .and_then(|n| n.checked_mul(self.candidate_dims));
        match d {
            Some(d) if d <= MAX_DIM => Ok(()),
            _ => Err(BanditError::Invalid {
                field: "layout",
                reason: format!(
                    "interaction dimension (1 + cluster + config + user) × candidate exceeds {MAX_DIM}"
                ),
            }),
        }
    }

    /// |z| = 1 + cluster + config + user. Saturates instead of overflowing on unvalidated layouts.
    pub fn context_dims(&self) -> usize {
        1usize
            .saturating_add(self.cluster_dims)
            .saturating_add(self.config_dims)
            .saturating_add(self.user_dims)
    }

    /// d = |z|·|c|, the length of x and of the weight vector.
    pub fn dim(&self) -> usize {
        self.context_dims().saturating_mul(self.candidate_dims)
    }

    /// The index ranges of z's blocks, named as in [`GROUP_NAMES`]; the "candidate" block is
    /// z's constant 1.
    pub fn context_groups(&self) -> [(&'static str, Range<usize>); 4] {
        let a = 1;
        let b = a + self.cluster_dims;
        let c = b + self.config_dims;
        let e = c + self.user_dims;
        [
            (GROUP_NAMES[0], 0..a),
            (GROUP_NAMES[1], a..b),
            (GROUP_NAMES[2], b..c),
            (GROUP_NAMES[3], c..e),
        ]
    }

    /// The index ranges of x's groups: z-block g spans x[g.start·|c| .. g.end·|c|].
    pub fn groups(&self) -> [(&'static str, Range<usize>); 4] {
        let cd = self.candidate_dims;
        self.context_groups()
            .map(|(name, r)| (name, r.start * cd..r.end * cd))
    }

    /// Assembles z = [1 | cluster | config | user], checking each block.
    pub fn context(&self, cluster: &[f64], config: &[f64], user: &[f64]) -> Result<Vec<f64>> {
        for (block, values, expected) in [
            ("cluster", cluster, self.cluster_dims),
            ("config", config, self.config_dims),
            ("user", user, self.user_dims),
        ] {
            check_block(block, values, expected)?;
        }
        let mut z = Vec::with_capacity(self.context_dims());
        z.push(1.0);
        z.extend_from_slice(cluster);
        z.extend_from_slice(config);
        z.extend_from_slice(user);
        Ok(z)
    }

    /// Checks a full context vector: length, the leading constant 1, and every block's values
    /// (the error names the block and the index within it).
    pub fn check_context(&self, z: &[f64]) -> Result<()> {
        if z.len() != self.context_dims() {
            return Err(BanditError::Dimension {
                block: "context".into(),
                expected: self.context_dims(),
                actual: z.len(),
            });
        }
        if z[0] != 1.0 {
            return Err(BanditError::ContextConstant(z[0]));
        }
        for (name, range) in self.context_groups().into_iter().skip(1) {
            check_values(name, &z[range])?;
        }
        Ok(())
    }

    /// Checks one candidate vector; the error names it as `candidate {index}`.
    pub fn check_candidate(&self, index: usize, c: &[f64]) -> Result<()> {
        check_block(&format!("candidate {index}"), c, self.candidate_dims)
    }

    /// x = vec(z ⊗ c), checked.
    pub fn interaction(&self, z: &[f64], c: &[f64]) -> Result<Vec<f64>> {
        self.check_context(z)?;
        self.check_candidate(0, c)?;
        let mut x = vec![0.0; self.dim()];
        interaction_into(z, c, &mut x);
        Ok(x)
    }
}

/// Writes x = vec(z ⊗ c) into `out` (length |z|·|c|); inputs are assumed checked.
pub(crate) fn interaction_into(z: &[f64], c: &[f64], out: &mut [f64]) {
    for (chunk, &zi) in out.chunks_exact_mut(c.len().max(1)).zip(z) {
        for (o, &cj) in chunk.iter_mut().zip(c) {
            *o = zi * cj;
        }
    }
}

fn check_block(block: &str, values: &[f64], expected: usize) -> Result<()> {
    if values.len() != expected {
        return Err(BanditError::Dimension {
            block: block.to_owned(),
            expected,
            actual: values.len(),
        });
    }
    check_values(block, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> FeatureLayout {
        FeatureLayout::new(2, 1, 1, 3).unwrap()
    }

    #[test]
    fn sizes_and_groups() {
        let l = layout();
        assert_eq!(l.context_dims(), 5);
        assert_eq!(l.dim(), 15);
        let groups = l.groups();
        assert_eq!(groups[0], ("candidate", 0..3));
        assert_eq!(groups[1], ("cluster", 3..9));
        assert_eq!(groups[2], ("config", 9..12));
        assert_eq!(groups[3], ("user", 12..15));
    }

    #[test]
    fn interaction_is_the_outer_product() {
        let l = layout();
        let z = l.context(&[2.0, 3.0], &[4.0], &[5.0]).unwrap();
        assert_eq!(z, vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        let x = l.interaction(&z, &[1.0, 10.0, 100.0]).unwrap();
        assert_eq!(&x[..6], &[1.0, 10.0, 100.0, 2.0, 20.0, 200.0]);
        assert_eq!(&x[12..], &[5.0, 50.0, 500.0]);
    }

    #[test]
    fn errors_name_the_block() {
        let l = layout();
        let err = l.context(&[1.0], &[0.0], &[0.0]).unwrap_err();
        assert!(err.to_string().starts_with("cluster: expected 2"), "{err}");
        let err = l
            .check_context(&[1.0, 0.0, 0.0, f64::NAN, 0.0])
            .unwrap_err();
        assert!(err.to_string().starts_with("config[0]"), "{err}");
        let err = l.check_context(&[1.0, 0.0, 0.0, 0.0, 1e9]).unwrap_err();
        assert!(err.to_string().starts_with("user[0]"), "{err}");
        assert_eq!(
            l.check_context(&[2.0, 0.0, 0.0, 0.0, 0.0]),
            Err(BanditError::ContextConstant(2.0))
        );
        let err = l
            .check_candidate(4, &[0.0, f64::INFINITY, 0.0])
            .unwrap_err();
        assert!(err.to_string().starts_with("candidate 4[1]"), "{err}");
        assert!(l.check_context(&[]).is_err());
    }

    #[test]
    fn rejects_degenerate_layouts() {
        assert!(FeatureLayout::new(1, 1, 1, 0).is_err());
        assert!(FeatureLayout::new(usize::MAX, 1, 1, 1).is_err());
        assert!(FeatureLayout::new(5000, 0, 0, 1).is_err());
    }
}
