//! Keep sets: which experts of each layer exist after pruning (SEMANTICS.md §3, consumed by §5).

use trace_io::Shape;

use crate::{CacheSimError, Result};

/// Per-layer masks of kept experts. An expert that is not kept is never selected nor cached;
/// slots routed to it become forced misses or substitutions (SEMANTICS.md §5 steps 1 and 3).
///
/// Built from plain id lists (cachesim does not depend on the saliency crate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keep {
    layers: usize,
    num_experts: usize,
    /// `mask[l * E + e]`.
    mask: Vec<bool>,
}

impl Keep {
    /// The unpruned set: every expert of every layer of a trace of this shape is kept.
    pub fn full(shape: &Shape) -> Keep {
        Keep {
            layers: shape.layers,
            num_experts: shape.num_experts,
            mask: vec![true; shape.layers * shape.num_experts],
        }
    }

    /// A keep set from one id list per trace layer (layer index order, not model layer ids).
    /// Ids need not be sorted; a repeated id is the same as one occurrence.
    ///
    /// # Errors
    /// [`CacheSimError::KeepMismatch`] when `layers.len()` is not the trace's L,
    /// [`CacheSimError::KeepIdOutOfRange`] for the first id `>= E`.
    pub fn from_layers(shape: &Shape, layers: &[Vec<u16>]) -> Result<Keep> {
        let e_count = shape.num_experts;
        if layers.len() != shape.layers {
            return Err(CacheSimError::KeepMismatch {
                expected_layers: shape.layers,
                actual_layers: layers.len(),
                expected_experts: e_count,
                actual_experts: e_count,
            });
        }
        let mut mask = vec![false; shape.layers * e_count];
        for (l, ids) in layers.iter().enumerate() {
            for &id in ids {
                if usize::from(id) >= e_count {
                    return Err(CacheSimError::KeepIdOutOfRange { layer: l, id, num_experts: e_count });
                }
                mask[l * e_count + usize::from(id)] = true;
            }
        }
        Ok(Keep { layers: shape.layers, num_experts: e_count, mask })
    }

    /// Whether expert `e` of layer index `l` is kept (false when `l >= L` or `e >= E`).
    pub fn is_kept(&self, l: usize, e: usize) -> bool {
        l < self.layers && e < self.num_experts && self.mask[l * self.num_experts + e]
    }

    /// The mask of layer index `l`, one bool per expert. Panics when `l >= L`.
    pub fn layer_mask(&self, l: usize) -> &[bool] {
        &self.mask[l * self.num_experts..(l + 1) * self.num_experts]
    }

    /// Number of kept experts in layer index `l`. Panics when `l >= L`.
    pub fn kept_count(&self, l: usize) -> usize {
        self.layer_mask(l).iter().filter(|&&k| k).count()
    }

    /// L, the number of layers covered.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// E, experts per layer.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Checks that this keep set has the trace's L and E.
    ///
    /// # Errors
    /// [`CacheSimError::KeepMismatch`].
    pub fn check_shape(&self, shape: &Shape) -> Result<()> {
        if self.layers != shape.layers || self.num_experts != shape.num_experts {
            return Err(CacheSimError::KeepMismatch {
                expected_layers: shape.layers,
                actual_layers: self.layers,
                expected_experts: shape.num_experts,
                actual_experts: self.num_experts,
            });
        }
        Ok(())
    }
}
