"""``sgl_kernel.speculative``: what SGLang's NGRAM path imports from it on a CPU
(kernels/ops/speculative/reconstruct_tree.py)."""
from .spec import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
