"""The SGLang emulator: a stand-in for ``python -m sglang.launch_server`` (SGLang 0.5.23) to test the tuner against.

Run it exactly like SGLang, with optional emulator options that all start with ``--sim-``::

    python -m autotune.sim --model-path /models/Qwen3.5-122B-A10B --tp-size 4 \\
        --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 \\
        --speculative-num-draft-tokens 4 --port 30000 \\
        --sim-profile qwen122b --sim-time-scale 0.01 --sim-speedup 20 --sim-seed 1

It accepts every flag of SGLang 0.5.23's parser (the table in ``flags_table.py``, taken from SGLang's own parser),
with argparse's behaviour (exit 2 on unknown flags, abbreviations, the ambiguous ``--cuda-graph-max-bs``), applies
SGLang's argument rules (exit 1 with a traceback), loads with the port closed, warms up, logs SGLang's lines on
stderr and serves SGLang's endpoints (modules: ``args``, ``startup``, ``server``, ``openai_api``, ``scheduler``,
``model``, ``adaptive``, ``metrics``, ``faults``, ``logs``, ``tokens``, ``surface``). Startup failures die the way
SGLang's do: "Scheduler hit an exception: <traceback>", "Received sigquit from a child process...", the process tree
is SIGKILLed (exit status -9).

Adaptive speculative decoding (``--speculative-adaptive [--speculative-adaptive-config FILE]``, module ``adaptive``)
runs as in SGLang: the schedule file's validation and errors (exit 1 with a traceback), the fallback warnings
("speculative_adaptive disabled: <reason>. Falling back to static speculative params." for topk > 1, algorithms
other than EAGLE/EAGLE3, DP attention, multi-layer EAGLE, two-batch overlap, PD multiplexing), steps defaulting to
the middle of the candidates' union and draft tokens forced to steps + 1, a runtime state with its own CUDA graphs
for every candidate step (graphs only for the batch sizes that route to it; a schedule whose states do not fit dies
in capture like a fixed config that does not), buffers and state pools sized for max(candidate_steps) + 1, each
decode batch padded to the next captured size and routed to its slot, each slot's EMA controller and its log lines,
every decode iteration costed at the live step's width (steps 0: a plain decode plus the draft extend, unless
SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1), and the live step in /server_info's ``internal_states[0]`` and the
``sglang:spec_num_steps`` / ``sglang:spec_num_draft_tokens`` gauges.

Emulator options
----------------
``--sim-profile NAME|PATH``   profile (default ``qwen122b``); a bare name is ``autotune/sim/profiles/NAME.toml``.
``--sim-time-scale F``        multiplies every startup phase (weights, draft, KV allocation, graph capture, warm-up).
``--sim-speedup K``           generation runs K times faster than modelled; every rate reported is K times higher.
``--sim-seed N``              seeds the per-request noise (default: random).
``--sim-noise F``             relative per-request noise (default: the profile's ``noise``, 0.02); 0 turns it off.
``--sim-fault SPEC``          inject a fault, repeatable:

=========================  ==========================================================================================
``startup-crash``          dies after the weights load: "Scheduler hit an exception:" traceback, "Received sigquit
                           from a child process. It usually means the child failed.", tree SIGKILLed (rc -9)
``startup-hang``           never opens the port, logs nothing more, never exits
``warmup-hang``            opens the port but never finishes warm-up: /health, /health_generate and /ready stay 503
``slow-start:SECONDS``     adds SECONDS of real (unscaled) time to weight loading
``crash-after:TOKENS``     once TOKENS tokens were generated in total, dies like a scheduler crash (rc -9)
``oom-under-load:N``       when the running batch exceeds N requests: "torch.OutOfMemoryError: CUDA out of memory.
                           Tried to allocate ..." in a "Scheduler hit an exception:" traceback, then rc -9
``stall-after:TOKENS``     once TOKENS tokens were generated, every stream stops and new requests never progress;
                           the process stays alive and /health keeps answering 200
``errors:FRACTION``        that fraction of generation requests fails like an internal scheduler error: the request
                           is aborted with finish_reason {"type": "abort", "status_code": 500, "err_type":
                           "InternalServerError"}; non-streaming calls get HTTP 500 with SGLang's error body,
                           streams end with that abort chunk (/generate) or an {"error": ...} chunk (OpenAI routes)
=========================  ==========================================================================================

A bad spec is an argparse error (exit 2).

Profile file format
-------------------
A profile is a TOML file describing one model served on one kind of host; it holds every number of the
performance and memory model (``model.py``), so a new model or GPU needs a new file, not new code. Copy
``profiles/qwen122b.toml`` (a hybrid MoE on 4 GPUs) or ``profiles/llama8b.toml`` (a dense model on 1 GPU) and
change the values. Unknown keys are errors; keys with a default may be left out. All memory figures are per GPU
at the profile's ``reference_tp`` unless said otherwise; times are milliseconds of model time (speedup 1).

``[profile]``
    ``name`` (str, default: file stem), ``description`` (str), ``noise`` (fraction, default 0.02): standard deviation
    of the per-request acceptance factor; the step time jitters by half of it.

``[model]`` -- what SGLang would read from the checkpoint
    ``architecture`` (str): HF architecture, shown in logs and /model_info. ``model_type`` (str).
    ``draft_architecture`` (str): the draft model's class in the draft "Load weight end" line.
    ``draft_model_path`` (str, default ""): draft used when --speculative-draft-model-path is absent ("" = the
    model path, as for built-in MTP layers). ``context_length`` (tokens): derived context length.
    ``vocab_size`` (tokens), ``eos_token_id`` (id). ``dtype`` (str, e.g. "torch.bfloat16": KV cache dtype in logs).
    ``quantization`` (str, "" for none: the "quant=" of the weight log). ``multimodal`` (bool: warm-up uses a chat
    request with an image, /model_info has_image_understanding). ``hybrid_linear_attention`` (bool: the model has
    a recurrent-state (mamba/GDN) pool that caps running requests). ``auto_speculative`` ([steps, topk, draft]):
    SGLang 0.5.23's automatic choice for this architecture when no speculative numbers are given.
    ``attention_backend`` (str): SGLang's default backend on this host (topk > 1 with page_size > 1 needs one of
    flashinfer, fa3, triton).

``[hardware]``
    ``gpu_name`` (str), ``gpu_memory_gb`` (GiB per GPU as torch reports it; also picks SGLang's GPU-size defaults for
    chunked_prefill_size, CUDA-graph max batch and mem_fraction_static), ``gpus`` (GPUs on the host; tp * dp above
    it fails like an invalid CUDA device), ``cuda_context_gb`` (GiB taken before the weights: CUDA context, NCCL).

``[memory]``
    ``weights_gb`` (GiB, all ranks together, split evenly over tp), ``draft_weights_gb`` (GiB, likewise).
    ``kv_bytes_per_token`` (bytes per token per GPU for K+V of the target's attention layers),
    ``draft_kv_bytes_per_token`` (the draft layers' share; a token's cell is the sum, so a draft shrinks capacity);
    both are bf16 figures, halved by --kv-cache-dtype fp8_e4m3/fp8_e5m2.
    ``mamba_state_mb`` (MiB per request per GPU of recurrent state; 0 for none; halved by --mamba-ssm-dtype
    bfloat16 when ``mamba_ssm_dtype`` (default "float32") is the checkpoint's SSM dtype) and ``mamba_full_memory_ratio``
    (SGLang's default 0.9): the state pool gets ratio / (1 + ratio) of the KV budget and is solved jointly with its
    per-draft-token intermediate states, max_mamba_cache_size = (budget - s(1 + D)) / (s(1 + D/3)); running requests
    are capped at max_mamba_cache_size // 3 (so more draft tokens D, fewer requests).
    ``activation_gb`` (GiB kept outside the static pool for activations and workspaces).
    ``graph_base_gb`` (GiB), ``graph_verify_mb_per_token`` (MiB per verify token) and ``graph_tree_mb_per_node``
    (MiB per draft-tree candidate, topk + (steps - 1) * topk^2 per request): CUDA-graph memory =
    base + max_bs * (verify_mb * draft_tokens + tree_mb * nodes), sized for the configured CUDA-graph max batch
    (--cuda-graph-max-bs-decode; 48 under speculative defaults). More than the headroom
    gpu * (1 - mem_fraction_static) - activation_gb fails the capture ("Capture cuda graph failed: ... CUDA out of
    memory", rc -9).

``[timing]`` -- milliseconds, at ``reference_tp`` (per-GPU work scales with reference_tp / tp)
    ``reference_tp`` (int). One decode iteration for B requests of verify width W (num_draft_tokens, or 1) =
    ``base_ms`` (weights read, launches, all-reduce) + ``token_ms`` * B*W + ``expert_ms`` * distinct experts touched
    (``moe_experts`` * (1 - (1 - ``moe_topk``/``moe_experts``)^(B*W)); leave both 0 for a dense model)
    + ``kv_ms_per_ktoken`` * KV tokens held / 1000
    + steps * (``draft_step_ms`` + ``draft_token_ms`` * B * topk) + ``draft_extend_ms`` + ``draft_extend_token_ms``
    * B*W + ``sched_ms`` + ``sched_req_ms`` * B, plus ``eager_ms`` when the batch has no captured CUDA graph.
    A prefill forward = ``prefill_base_ms`` + ``prefill_token_ms`` * new tokens
    + ``prefill_attn_ms_per_mtoken2`` * (new tokens / 1000)^2 / requests (+ the draft extend with speculation).

``[acceptance]``
    Single-candidate probability of surviving depth d given d - 1: ``first`` * ``decay`` ^ ((d - 1) ^
    ``decay_shape``). m candidates at one depth cover it with 1 - (1 - q) ^ (m ^ ``topk_gain``); the tree's
    num_draft_tokens - 1 nodes go greedily where they add the most expected length (at most topk per depth).
    Expected accept length = 1 + sum over depths of P(reach depth). ``temperature_penalty`` (per unit of
    temperature, multiplies acceptance by 1 - penalty * T). ``mean_output_tokens`` (tokens): mean length at which a
    request without ignore_eos emits EOS (exponentially distributed, per prompt).

``[startup]`` -- seconds at --sim-time-scale 1
    ``init_s``, ``load_gb_per_s`` (weight loading rate, GiB/s over weights_gb), ``draft_load_s``, ``kv_alloc_s``,
    ``graph_capture_s_per_bs`` (target graph, per captured batch size), ``draft_graph_capture_s_per_bs`` (each draft
    graph), ``server_start_s`` (tokenizer/HTTP start before the port opens). Warm-up adds SGLang's 1 s wait.

``[workload]``
    ``prompt_tokens``, ``output_tokens``: request shape of the concurrent figure of ``autotune sim surface``.

Calibration and the surface
---------------------------
``autotune sim surface --profile P [--concurrency 32] [--json]`` prints the model's noise-free figures for every
valid config of the default space (``surface.surface()`` returns the same dict). The seed calibration of
``qwen122b`` is checked by tests/sim/test_model.py.
"""
