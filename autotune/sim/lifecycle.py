"""SGLang's launch sequence: loading phases with the port closed, then uvicorn, warm-up, serving; and its deaths."""
from __future__ import annotations

import asyncio
import copy
import logging
import time
import traceback
from typing import Any

import httpx
import uvicorn

from autotune.sim import adaptive_controller, logs, model
from autotune.sim.args import Resolved, SimOptions
from autotune.sim.metrics import Metrics
from autotune.sim.profile import Profile
from autotune.sim.scheduler import Scheduler
from autotune.sim.server import create_app
from autotune.sim.serving import State

GRAPH_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
KV_DTYPES = {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2"}
WARMUP_PROMPT = "The capital city of France is"
MAX_PREFILL_TOKENS = 16384


class Lifecycle:
    """One server lifetime: loading phases (port closed), then uvicorn, warm-up and serving."""

    def __init__(self, resolved: Resolved, profile: Profile, sim: SimOptions, launcher: logging.Logger,
                 scheduler_log: logging.Logger) -> None:
        self.resolved, self.profile, self.sim = resolved, profile, sim
        self.launcher, self.log = launcher, scheduler_log
        self.config = resolved.config
        self.fields = resolved.fields
        self.plan = model.memory_plan(profile, self.config)
        self.seconds = model.startup_seconds(profile, self.config, self.plan)
        self.timings: dict[str, Any] = {"load_weight": 0.0, "kv_cache_allocation": 0.0,
                                        "cuda_graph": {}, "graph_memory": {}}
        self.avail = 0.0  # GiB free on GPU 0 as the loading phases use it up, for the log lines

    async def phase(self, model_seconds: float, extra_real: float = 0.0) -> float:
        """Sleep a startup phase: model seconds times --sim-time-scale, plus unscaled real seconds."""
        tic = time.monotonic()
        await asyncio.sleep(model_seconds * self.sim.time_scale + extra_real)
        return time.monotonic() - tic

    def die(self, phase: str, exception: str, running: bool = False, cause: str | None = None) -> None:
        logs.die(self.launcher, self.log, phase, exception, running, cause)

    async def run(self) -> None:
        tic = time.monotonic()
        self.launcher.info(f"server_args={self.fields!r}")
        await self.load()
        await self.allocate()
        await self.capture()
        plan, cfg = self.plan, self.config
        plan.graph_gb = sum(self.timings["graph_memory"].values())
        self.log.info(
            f"max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size={plan.chunked_prefill_size}, "
            f"max_prefill_tokens={self.fields['max_prefill_tokens'] or MAX_PREFILL_TOKENS}, "
            f"max_running_requests={plan.max_running_requests}, "
            f"context_len={cfg.context_length or self.profile.model.context_length}, "
            f"available_gpu_mem={plan.available_gb:.2f} GB"
        )
        scheduler_e2e = time.monotonic() - tic
        graphs = self.timings["cuda_graph"]
        graph_times = {p: graphs.get(p, 0.0) for p in ("prefill", "decode", "target_verify", "draft_prefill",
                                                        "draft_decode", "draft_extend")}
        sched_time = {"load_weight": self.timings["load_weight"],
                      "kv_cache_allocation": self.timings["kv_cache_allocation"],
                      "scheduler_e2e": scheduler_e2e, "cuda_graph": graph_times}
        engine_time = dict(sched_time, tokenizer_e2e=time.monotonic() - tic)
        cuda_graph = ", ".join(f"{k}={v:.2f}" for k, v in graph_times.items())
        self.launcher.info(
            f"Engine startup timings (s): load_weight={sched_time['load_weight']:.2f}, "
            f"kv_cache_allocation={sched_time['kv_cache_allocation']:.2f}, scheduler_e2e={scheduler_e2e:.2f}, "
            f"cuda_graph={{{cuda_graph}}}, tokenizer_e2e={engine_time['tokenizer_e2e']:.2f}"
        )
        await self.serve({"scheduler": sched_time, "engine": engine_time,
                          "graph_memory": self.timings["graph_memory"]})

    async def load(self) -> None:
        plan, prof, faults = self.plan, self.profile, self.sim.faults
        gpus = self.config.tp * self.config.dp
        if gpus > prof.hardware.gpus:
            self.die("load", "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be "
                             "asynchronously reported at some other API call, so the stacktrace below might be "
                             "incorrect.")
        await self.phase(self.seconds["init"])
        self.log.info(f"Load weight begin. avail mem={plan.pre_load_gb:.2f} GB")
        if faults.startup_hang:
            await asyncio.Event().wait()
        elapsed = await self.phase(self.seconds["load_weight"], faults.slow_start_s)
        if plan.error_phase == "load":
            self.die("load", plan.error)
        quant = f"quant={prof.model.quantization}, " if prof.model.quantization else ""
        self.log.info(
            f"Load weight end. elapsed={elapsed:.2f} s, type={prof.model.architecture}, {quant}"
            f"avail mem={plan.pre_load_gb - plan.weights_gb:.2f} GB, mem usage={plan.weights_gb:.2f} GB."
        )
        self.timings["load_weight"] = elapsed
        if faults.startup_crash:
            self.die("load", "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors "
                             "might be asynchronously reported at some other API call, so the stacktrace below might "
                             "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with "
                             "`TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        if self.config.spec is not None or self.resolved.algorithm is not None:
            avail = plan.pre_load_gb - plan.weights_gb
            self.log.info(f"Load weight begin. avail mem={avail:.2f} GB")
            elapsed = await self.phase(self.seconds["draft_load_weight"])
            self.log.info(
                f"Load weight end. elapsed={elapsed:.2f} s, type={prof.model.draft_architecture}, "
                f"avail mem={avail - plan.draft_weights_gb:.2f} GB, mem usage={plan.draft_weights_gb:.2f} GB."
            )
            self.timings["load_weight"] += elapsed
        if self.config.adaptive is not None:
            self.log.info(adaptive_controller.initialized_line(self.config.adaptive))

    async def allocate(self) -> None:
        plan, prof = self.plan, self.profile
        elapsed = await self.phase(self.seconds["kv_cache_allocation"])
        self.timings["kv_cache_allocation"] = elapsed
        deferred = self.resolved.deferred_error
        if deferred and deferred[0] == "kv":
            self.die("kv", deferred[1])
        if plan.error_phase == "kv":
            self.die("kv", plan.error)
        requested = plan.requested_max_running_requests
        if plan.capped_by == "mamba":
            self.log.warning(
                f"max_running_requests is capped to {plan.max_running_requests} by the mamba state cache "
                f"(max_mamba_cache_size={plan.mamba_cache_size}, 3 state slots per request). To raise it: increase "
                "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
                "--mamba-ssm-dtype bfloat16."
            )
        elif plan.capped_by == "kv" and requested is not None:
            self.log.warning(
                f"max_running_requests was reduced from the requested {max(1, requested // self.config.dp)} to "
                f"{plan.max_running_requests} (per dp worker) due to the available KV cache capacity."
            )
        if plan.mamba_cache_size:
            line = (f"Mamba Cache is allocated. max_mamba_cache_size: {plan.mamba_cache_size}, conv_state size: "
                    f"{plan.mamba_gb * 0.03:.2f}GB, ssm_state size: {plan.mamba_gb * 0.97:.2f}GB ")
            if self.config.spec is not None:
                line += (f"intermediate_ssm_state_cache size: {plan.intermediate_gb * 0.97:.2f}GB "
                         f"intermediate_conv_window_cache size: {plan.intermediate_gb * 0.03:.2f}GB ")
            self.log.info(line)
        dtype = KV_DTYPES.get(self.config.kv_cache_dtype, prof.model.dtype)
        for gb in (plan.kv_gb, plan.draft_kv_gb):
            if gb:
                self.log.info(f"KV Cache is allocated. dtype: {dtype}, #tokens: {plan.max_total_num_tokens}, "
                              f"K size: {gb / 2:.2f} GB, V size: {gb / 2:.2f} GB")
        self.avail = plan.available_after_load_gb - plan.mamba_gb - plan.intermediate_gb - plan.kv_gb - plan.draft_kv_gb
        self.log.info(f"Memory pool end. avail mem={self.avail:.2f} GB")

    async def capture(self) -> None:
        if not self.config.disable_cuda_graph:
            await self.capture_startup_graphs()
        if self.config.adaptive is not None:
            await self.build_adaptive_states()

    async def capture_startup_graphs(self) -> None:
        plan, cfg = self.plan, self.config
        deferred = self.resolved.deferred_error
        graph_error = deferred[1] if deferred and deferred[0] == "graph" else None
        spec = cfg.spec
        name, key = ("target verify", "target_verify") if spec else ("target decode", "decode")
        self.log.info(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={cfg.width}, "
                      f"avail mem={self.avail:.2f} GB")
        if plan.error_phase == "graph" and plan.error_step is None:
            self.die_capture(plan.error)
        if graph_error and spec is None:
            self.die("graph", graph_error)
        elapsed = await self.phase(self.seconds["target_graph"])
        share = 1.0 if spec is None else 0.6
        self._graph_end(f"Capture {name} CUDA graph end. bs={plan.capture_bs}, ", key, elapsed, plan.graph_gb * share)
        if spec is None:
            return
        phases = [("draft decode", "draft_decode", spec.topk)] if spec.steps > 1 else []
        phases.append(("draft extend", "draft_extend", spec.draft))
        for label, key, per_req in phases:
            self.log.info(f"Capture {label} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                          f"bs={plan.capture_bs}, avail mem={self.avail:.2f} GB")
            if graph_error and key == "draft_decode":
                self.die_capture(graph_error)
            elapsed = await self.phase(self.seconds["draft_graph"])
            self._graph_end(f"Capture {label} CUDA graph end. ", key, elapsed, plan.graph_gb * 0.2)

    async def build_adaptive_states(self) -> None:
        """SGLang's AdaptiveController.init_states: a runtime state (graphs only for the batch sizes that route to
        it) for every other candidate step; the first one the headroom cannot hold fails its capture."""
        plan, st = self.plan, self.profile.startup
        graphs, memory = self.timings["cuda_graph"], self.timings["graph_memory"]
        for state in plan.adaptive_states:
            draft_graphs = 2 if state.steps > 1 else 1
            per_bs = st.graph_capture_s_per_bs + st.draft_graph_capture_s_per_bs * draft_graphs
            elapsed = await self.phase(per_bs * len(state.capture_bs))
            graphs["target_verify"] = graphs.get("target_verify", 0.0) + elapsed
            shares = {"target_verify": 0.6, "draft_decode": 0.2 if draft_graphs == 2 else 0.0, "draft_extend": 0.2}
            for phase, share in shares.items():
                memory[phase] = memory.get(phase, 0.0) + share * state.graph_gb
            used = sum(shares.values()) * state.graph_gb
            self.avail -= used
            self.log.info(f"Built adaptive runtime state steps={state.steps}: elapsed={elapsed:.2f}s, mem={used:.2f}GB")
        if plan.error_step is not None:
            self.die_capture(plan.error, "adaptive_graph")

    def die_capture(self, error: str, phase: str = "graph") -> None:
        """A failed capture: SGLang re-raises the cause as "Capture cuda graph failed: ..." with its advice."""
        detail = error.partition(": ")[2]
        self.die(phase, f"Exception: Capture cuda graph failed: {detail}\n{GRAPH_FAILED_MSG}", cause=error)

    def _graph_end(self, head: str, phase: str, elapsed: float, gb: float) -> None:
        self.avail -= gb
        self.timings["cuda_graph"][phase] = elapsed
        self.timings["graph_memory"][phase] = gb
        self.log.info(f"{head}elapsed={elapsed:.2f} s, mem usage={gb:.2f} GB, avail mem={self.avail:.2f} GB.")

    async def serve(self, startup_time: dict[str, Any]) -> None:
        metrics = Metrics(self.resolved.served_model_name, self.plan.max_total_num_tokens)
        noise = self.sim.noise if self.sim.noise is not None else self.profile.noise
        scheduler = Scheduler(
            self.profile, self.config, self.plan, speedup=self.sim.speedup, noise=noise, seed=self.sim.seed,
            faults=self.sim.faults, log=self.log, decode_log_interval=self.fields["decode_log_interval"],
            metrics=metrics, crash=lambda phase, exc: self.die(phase, exc, running=True),
            deferred_error=self.resolved.deferred_error,
        )
        state = State(self.resolved, self.profile, self.sim, self.plan, scheduler, metrics, self.launcher, self.log,
                      startup_time)
        app = create_app(state)
        host, port = self.fields["host"], self.fields["port"]
        server = uvicorn.Server(uvicorn.Config(
            app, host=host, port=port, log_config=_uvicorn_log_config(),
            log_level=(self.fields["log_level_http"] or self.fields["log_level"]).lower(),
            timeout_keep_alive=5, timeout_graceful_shutdown=5,
        ))
        engine = asyncio.create_task(scheduler.run())
        warmup = asyncio.create_task(self.warmup(state, server))
        await self.phase(self.seconds["server_start"])
        try:
            await server.serve()
        finally:
            engine.cancel()
            warmup.cancel()

    async def warmup(self, state: State, server: uvicorn.Server) -> None:
        """SGLang's warm-up thread: wait, GET /model_info, one small generate, then 'fired up'."""
        while not server.started:
            await asyncio.sleep(0.01)
        if self.fields["skip_server_warmup"]:
            state.status = "Up"
            state.scheduler.serving = True
            self.launcher.info("The server is fired up and ready to roll!")
            return
        if self.sim.faults.warmup_hang:
            await asyncio.Event().wait()
        host = self.fields["host"]
        host = "127.0.0.1" if host in ("0.0.0.0", "", None) else ("::1" if host == "::" else host)
        base = f"http://[{host}]:{self.fields['port']}" if ":" in host else f"http://{host}:{self.fields['port']}"
        headers = {"Authorization": f"Bearer {self.fields['api_key']}"} if self.fields["api_key"] else {}
        last_error = ""
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=600) as client:
            for _ in range(120):
                await self.phase(1.0)
                try:
                    info = await client.get("/model_info", timeout=5)
                    if info.status_code == 200:
                        break
                    last_error = f"AssertionError: res=<Response [{info.status_code}]>, res.text='{info.text}'"
                except httpx.HTTPError:
                    last_error = traceback.format_exc()
            else:
                self._warmup_failed(last_error)
                return
            try:
                if info.json()["has_image_understanding"]:
                    res = await client.post("/v1/chat/completions", json={
                        "model": state.resolved.served_model_name, "max_tokens": 8, "stream": False,
                        "temperature": 0.0, "messages": [{"role": "user", "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
                            {"type": "text", "text": "Describe the image."}]}]})
                else:
                    res = await client.post("/generate", json={
                        "text": WARMUP_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
                if res.status_code != 200:
                    raise RuntimeError(res.text)
                state.status = "Up"
                state.scheduler.serving = True
                await client.post("/freeze_gc")
            except (httpx.HTTPError, RuntimeError):
                self._warmup_failed(traceback.format_exc())
                return
        self.launcher.info("The server is fired up and ready to roll!")

    def _warmup_failed(self, error: str) -> None:
        self.launcher.error(f"Initialization failed. warmup error: {error}")
        logs.kill_process_tree(self.launcher)


def _uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's logging with SGLang's formats (access lines to stdout, the rest to stderr)."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["formatters"]["default"]["fmt"] = "[%(asctime)s] %(levelprefix)s %(message)s"
    config["formatters"]["default"]["datefmt"] = logs.DATEFMT
    config["formatters"]["access"]["fmt"] = \
        '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'
    config["formatters"]["access"]["datefmt"] = logs.DATEFMT
    return config
