//! Index samplers: sequential, random (with or without replacement), subset-random and
//! weighted-random, after `torch/utils/data/sampler.py`.

use crate::error::{DataError, Result};
use crate::permutation::{LazyPermutation, EAGER_EPOCH_LIMIT};
use crate::rng::Generator;

/// A source of dataset indices, one epoch at a time (`torch.utils.data.Sampler[int]`).
pub trait Sampler: Send {
    /// Number of indices one epoch yields.
    fn len(&self) -> usize;

    /// Whether an epoch yields nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices of the next epoch, collected. Random samplers draw a new order on every call.
    ///
    /// This holds the whole epoch (8 bytes an index); loaders call
    /// [`epoch_iter`](Self::epoch_iter) instead.
    fn epoch(&mut self) -> Vec<usize>;

    /// The indices of the next epoch, one at a time (Note [Lazy epochs]). Every random draw of
    /// the epoch is made by this call (so loaders draw in the same order with or without
    /// workers); the iterator owns what it needs.
    ///
    /// The provided version collects [`epoch`](Self::epoch); [`SequentialSampler`] and
    /// [`RandomSampler`] hold O(1) memory (a random epoch longer than
    /// [`EAGER_EPOCH_LIMIT`] indices is a [`LazyPermutation`]).
    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = usize> + Send> {
        Box::new(self.epoch().into_iter())
    }
}

impl<S: Sampler + ?Sized> Sampler for Box<S> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn epoch(&mut self) -> Vec<usize> {
        (**self).epoch()
    }
    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = usize> + Send> {
        (**self).epoch_iter()
    }
}

/// `0, 1, …, len − 1` every epoch (`SequentialSampler`).
#[derive(Debug, Clone)]
pub struct SequentialSampler {
    len: usize,
}

impl SequentialSampler {
    /// A sampler over `len` items.
    pub fn new(len: usize) -> Self {
        SequentialSampler { len }
    }
}

impl Sampler for SequentialSampler {
    fn len(&self) -> usize {
        self.len
    }
    fn epoch(&mut self) -> Vec<usize> {
        (0..self.len).collect()
    }
    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = usize> + Send> {
        Box::new(0..self.len)
    }
}

/// A fresh random order every epoch (`RandomSampler`), drawn from its own [`Generator`].
///
/// Without replacement an epoch is `num_samples / len` full permutations followed by the prefix of
/// one more; with replacement, `num_samples` uniform draws.
///
/// Memory: an epoch of at most [`EAGER_EPOCH_LIMIT`] samples is drawn at once by Fisher–Yates
/// (PyTorch's `randperm`, at most 8 MiB); a longer one is walked lazily from a private generator
/// seeded by one draw of this sampler's generator, each permutation of more than
/// [`EAGER_EPOCH_LIMIT`] items a [`LazyPermutation`] (O(1) memory; Note [Lazy epochs]). Given a generator, the sampler advances
/// it epoch after epoch; given none, it owns a private generator seeded from entropy (never a
/// global RNG: Note [No global RNG]).
#[derive(Debug, Clone)]
pub struct RandomSampler {
    data_len: usize,
    replacement: bool,
    num_samples: usize,
    generator: Generator,
}

impl RandomSampler {
    /// A sampler over `len` items without replacement, `len` samples per epoch.
    ///
    /// Over an empty dataset (`len = 0`) the sampler is empty: `len()` is 0 and every epoch is
    /// empty. (PyTorch's constructor refuses that case, with `ValueError("num_samples should
    /// be a positive integer value, but got num_samples=0")`; asking an empty dataset for
    /// samples with [`with_num_samples`](Self::with_num_samples) is refused here too.)
    pub fn new(len: usize, generator: Option<Generator>) -> Self {
        RandomSampler {
            data_len: len,
            replacement: false,
            num_samples: len,
            generator: generator.unwrap_or_else(Generator::from_entropy),
        }
    }

    /// Draws with replacement (`replacement=True`).
    pub fn with_replacement(mut self, replacement: bool) -> Self {
        self.replacement = replacement;
        self
    }

    /// Sets the number of samples per epoch (`num_samples`).
    ///
    /// # Errors
    /// [`DataError::InvalidOption`] when `num_samples` is 0 (PyTorch's message), and when the
    /// dataset is empty, with or without replacement: there is nothing to draw, so `len()`
    /// could not match the epoch. PyTorch's `RandomSampler`
    /// (<https://github.com/pytorch/pytorch/blob/main/torch/utils/data/sampler.py>) accepts
    /// that sampler and fails on the first draw (`torch.randint` with `high=0`: `random_
    /// expects 'from' to be less than 'to', but got from=0 >= to=0`; without replacement, a
    /// division by zero); berth fails when it is configured.
    pub fn with_num_samples(mut self, num_samples: usize) -> Result<Self> {
        if num_samples == 0 {
            return Err(DataError::option(
                "num_samples",
                "num_samples should be a positive integer value, but got num_samples=0",
            ));
        }
        if self.data_len == 0 {
            return Err(DataError::option(
                "num_samples",
                format!(
                    "num_samples={num_samples} cannot be drawn from an empty dataset: RandomSampler needs at least one item (PyTorch fails on the first draw: random_ expects 'from' to be less than 'to', but got from=0 >= to=0)"
                ),
            ));
        }
        self.num_samples = num_samples;
        Ok(self)
    }

    /// The generator this sampler draws from.
    pub fn generator(&self) -> &Generator {
        &self.generator
    }
}

impl Sampler for RandomSampler {
    fn len(&self) -> usize {
        self.num_samples
    }
    fn epoch(&mut self) -> Vec<usize> {
        let n = self.data_len;
        if n == 0 {
            return Vec::new();
        }
        if self.replacement {
            return (0..self.num_samples)
                .map(|_| self.generator.below(n))
                .collect();
        }
        let mut out = Vec::with_capacity(self.num_samples);
        for _ in 0..self.num_samples / n {
            out.extend(self.generator.randperm(n));
        }
        let rest = self.num_samples % n;
        if rest > 0 {
            out.extend(self.generator.randperm(n).into_iter().take(rest));
        }
        out
    }
    fn epoch_iter(&mut self) -> Box<dyn Iterator<Item = usize> + Send> {
        if self.num_samples <= EAGER_EPOCH_LIMIT || self.data_len == 0 {
            return Box::new(self.epoch().into_iter());
        }
        let private = Generator::new(self.generator.next_u64());
        let n = self.data_len;
        let take = self.num_samples;
        if self.replacement {
            return Box::new((0..take).map(move |_| private.below(n)));
        }
        // Permutation after permutation, as many as `take` needs; each drawn when reached.
        let perms = std::iter::repeat_with(move || -> Box<dyn Iterator<Item = usize> + Send> {
            if n <= EAGER_EPOCH_LIMIT {
                Box::new(private.randperm(n).into_iter())
            } else {
                Box::new(LazyPermutation::new(n, &private))
            }
        });
        Box::new(perms.flatten().take(take))
    }
}

/// A fresh random order of a fixed index list every epoch (`SubsetRandomSampler`).
#[derive(Debug, Clone)]
pub struct SubsetRandomSampler {
    indices: Vec<usize>,
    generator: Generator,
}

impl SubsetRandomSampler {
    /// A sampler over `indices`, shuffled every epoch.
    pub fn new(indices: Vec<usize>, generator: Option<Generator>) -> Self {
        SubsetRandomSampler {
            indices,
            generator: generator.unwrap_or_else(Generator::from_entropy),
        }
    }
}

impl Sampler for SubsetRandomSampler {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn epoch(&mut self) -> Vec<usize> {
        self.generator
            .randperm(self.indices.len())
            .into_iter()
            .map(|i| self.indices[i])
            .collect()
    }
}

/// Indices drawn with probability proportional to `weights` (`WeightedRandomSampler`,
/// `torch.multinomial`).
///
/// Any finite non-negative weights work, however large: they are divided by the largest weight
/// before they are summed, so a sum that would overflow (`1e308 + 1e308`) does not turn every
/// probability into 0.
#[derive(Debug, Clone)]
pub struct WeightedRandomSampler {
    /// Cumulative weights, normalised so the last is exactly 1.
    cumulative: Vec<f64>,
    /// The weights as given (all finite and non-negative).
    weights: Vec<f64>,
    num_samples: usize,
    replacement: bool,
    generator: Generator,
}

impl WeightedRandomSampler {
    /// `num_samples` indices per epoch into `weights` (one non-negative weight per item).
    ///
    /// # Errors
    /// [`DataError::InvalidOption`] when `num_samples` is 0, a weight is negative or not finite,
    /// the weights sum to 0, or, without replacement, `num_samples` exceeds the number of non-zero
    /// weights (PyTorch's messages).
    pub fn new(
        weights: Vec<f64>,
        num_samples: usize,
        replacement: bool,
        generator: Option<Generator>,
    ) -> Result<Self> {
        if num_samples == 0 {
            return Err(DataError::option(
                "num_samples",
                "num_samples should be a positive integer value, but got num_samples=0",
            ));
        }
        if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
            return Err(DataError::option(
                "weights",
                format!("invalid multinomial distribution (encountering probability entry < 0 or not finite: {w})"),
            ));
        }
        let max = weights.iter().copied().fold(0.0, f64::max);
        if max <= 0.0 {
            return Err(DataError::option(
                "weights",
                "invalid multinomial distribution (sum of probabilities <= 0)",
            ));
        }
        let nonzero = weights.iter().filter(|w| **w > 0.0).count();
        if !replacement && num_samples > nonzero {
            return Err(DataError::option(
                "num_samples",
                format!(
                    "cannot sample n_sample > prob_dist.size(-1) samples without replacement (num_samples={num_samples}, {nonzero} non-zero weights)"
                ),
            ));
        }
        // Scaled by the largest weight, each term is at most 1 and the sum at most `len`:
        // finite. Dividing by the last partial sum makes the last entry exactly 1, so a draw
        // in [0, 1) never falls past the last non-zero weight.
        let mut acc = 0.0;
        let mut cumulative: Vec<f64> = weights
            .iter()
            .map(|w| {
                acc += w / max;
                acc
            })
            .collect();
        for c in &mut cumulative {
            *c /= acc;
        }
        Ok(WeightedRandomSampler {
            cumulative,
            weights,
            num_samples,
            replacement,
            generator: generator.unwrap_or_else(Generator::from_entropy),
        })
    }

    fn draw(cumulative: &[f64], u: f64) -> usize {
        cumulative
            .partition_point(|&c| c <= u)
            .min(cumulative.len() - 1)
    }
}

impl Sampler for WeightedRandomSampler {
    fn len(&self) -> usize {
        self.num_samples
    }
    fn epoch(&mut self) -> Vec<usize> {
        if self.replacement {
            return (0..self.num_samples)
                .map(|_| Self::draw(&self.cumulative, self.generator.uniform()))
                .collect();
        }
        // Without replacement: draw, remove the drawn item, renormalise (what multinomial
        // does). Each draw scales the weights left by the largest of them, so the sum stays
        // finite and is at least 1. A positive weight too small to survive the scaling (it
        // underflows to 0 beside a huge one) is still drawn once the larger ones are gone.
        let mut left: Vec<bool> = self.weights.iter().map(|w| *w > 0.0).collect();
        let mut out = Vec::with_capacity(self.num_samples);
        for _ in 0..self.num_samples {
            let live = || {
                self.weights
                    .iter()
                    .zip(&left)
                    .enumerate()
                    .filter(|(_, (_, l))| **l)
                    .map(|(i, (w, _))| (i, *w))
            };
            let max = live().map(|(_, w)| w).fold(0.0, f64::max);
            // `new` checked there are at least `num_samples` positive weights.
            let Some(last) = live().next_back().map(|(i, _)| i) else {
                break;
            };
            let total: f64 = live().map(|(_, w)| w / max).sum();
            let u = self.generator.uniform() * total;
            let mut acc = 0.0;
            let pick = live()
                .find(|&(_, w)| {
                    acc += w / max;
                    u < acc
                })
                .map_or(last, |(i, _)| i);
            out.push(pick);
            left[pick] = false;
        }
        out
    }
}
