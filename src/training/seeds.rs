//! The training run's randomness: independent, reproducible streams derived from (`--seed`,
//! stream, step, rollback salt), and the shuffled epochs the prompts are drawn in.
//!
//! Nothing random carries state from one step to the next, so a checkpoint needs only the step,
//! the salt and the prompt cursor to continue exactly as an uninterrupted run would. The salt is
//! 0 until a rollback: a retried step then draws other prompts and samples than the ones it
//! failed on, and a resume from the same checkpoint (same salt) draws the same ones again.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The independent random streams of a run.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    RlOrder = 1,
    SftOrder = 2,
    Sampling = 3,
    Verdicts = 4,
    TieBreak = 5,
    Torch = 6,
    Minibatches = 7,
}

/// SplitMix64 over the parts: a well-mixed seed for each (stream, step, …).
pub fn derive_seed(parts: &[u64]) -> u64 {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for &part in parts {
        state ^= part;
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        state = z ^ (z >> 31);
    }
    state
}

/// The seeds of one step's streams.
#[derive(Debug, Clone, Copy)]
pub struct StepSeeds {
    pub seed: u64,
    pub step: u64,
    /// Rollbacks so far (the checkpoint's salt).
    pub salt: u32,
}

impl StepSeeds {
    /// The seed of `stream` for this step, further keyed by `parts`. Salt 0 leaves it out, so runs
    /// without a rollback draw what they drew before salts existed.
    pub fn of(&self, stream: Stream, parts: &[u64]) -> u64 {
        let mut all = vec![self.seed, stream as u64, self.step];
        all.extend_from_slice(parts);
        salted_seed(all, self.salt)
    }
}

/// [`derive_seed`] of `parts` with the rollback salt appended (tagged so it cannot collide with
/// a step or index); salt 0 appends nothing, so runs without a rollback keep their seeds.
pub fn salted_seed(mut parts: Vec<u64>, salt: u32) -> u64 {
    if salt > 0 {
        parts.push(u64::from(salt) | (1 << 40));
    }
    derive_seed(&parts)
}

/// An endless sequence of shuffled epochs over `0..len`, reshuffled per epoch from the seed.
#[derive(Debug)]
pub struct EpochOrder {
    len: usize,
    seed: u64,
    cached: Option<(u64, Vec<usize>)>,
}

impl EpochOrder {
    pub fn new(len: usize, seed: u64) -> Self {
        Self {
            len: len.max(1),
            seed,
            cached: None,
        }
    }

    /// The item at `position` of the endless sequence.
    pub fn at(&mut self, position: u64) -> usize {
        let len = self.len as u64;
        let epoch = position / len;
        if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut order: Vec<usize> = (0..self.len).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(&[
                self.seed, epoch,
            ])));
            self.cached = Some((epoch, order));
        }
        self.cached
            .as_ref()
            .map_or(0, |(_, order)| order[(position % len) as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_visit_every_item_once() {
        let mut order = EpochOrder::new(7, 3);
        for epoch in 0..3u64 {
            let mut seen: Vec<usize> = (0..7).map(|i| order.at(epoch * 7 + i)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..7).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_salt_changes_every_stream_and_zero_changes_nothing() {
        let plain = StepSeeds {
            seed: 5,
            step: 9,
            salt: 0,
        };
        assert_eq!(
            plain.of(Stream::Sampling, &[2]),
            derive_seed(&[5, Stream::Sampling as u64, 9, 2])
        );
        let salted = StepSeeds { salt: 1, ..plain };
        assert_ne!(
            plain.of(Stream::Sampling, &[2]),
            salted.of(Stream::Sampling, &[2])
        );
        assert_ne!(
            salted.of(Stream::Sampling, &[2]),
            StepSeeds { salt: 2, ..plain }.of(Stream::Sampling, &[2])
        );
    }
}
