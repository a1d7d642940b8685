"""A CPU ``sgl_kernel`` for SGLang 0.5.23, written in torch by this project (scripts/build-sglang-cpu.sh copies it
into the sglang-cpu venv; docs/real-sglang.md).

SGLang's CPU path calls C++ kernels: ops it looks up as ``torch.ops.sgl_kernel.NAME`` and functions it imports from
this package by name. No CPU build of them is on the package registry, so the ones a dense Llama reaches are written
here, each with the meaning of the op of the same name in SGLang's CPU sources: the speculative bookkeeping
(``spec``), moves in the KV cache (``kvcache``), attention over the paged cache (``attention``), the dense layers
(``layers``) and the start-up's thread and collective set-up (``runtime``). A name SGLang imports that is not here
fails the import with its name, so a model that reaches further says what it lacks.
"""
from . import attention, layers, runtime, unwritten  # noqa: F401  (registering torch.ops.sgl_kernel.*)
from .kvcache import copy_all_layer_kv_cache_cpu, store_cache_cpu
from .spec import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__version__ = "0.0.0+autotune.cpu"

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "store_cache_cpu",
    "verify_tree_greedy_cpu",
]
