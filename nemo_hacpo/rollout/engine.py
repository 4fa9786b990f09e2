"""`RolloutEngine`: one agent's vLLM engine, started once per run and kept across steps.

    engine = RolloutEngine.from_agent(agent_cfg, model_dir, device="cpu")    # logs start-up time
    result = engine.generate(prompts, n=G)             # result.responses[b][g]: ids, text, finish, log-probs
    logprobs = engine.score(sequences)                  # log p(seq[t] | seq[:t]), t ≥ 1, of fixed sequences
    engine.refit(trainer_hf_weights)                    # in place, prefix cache reset; no restart
    engine.shutdown()

Prompts are rendered with the agent's chat template by `models.chat.render_prompt_ids` and fed to vLLM
as token ids, so self samples and re-encoded cross samples share one prompt encoding. Response text is
decoded by the agent's tokenizer (special tokens skipped), the same rule the broker applies.

Refit transports (`rollout.refit_transport`; the strategy that drives them is `rollout.refit`):
- `rpc`: `refit(weights)` — `collective_rpc` with safetensors chunks into the worker extension
  (`worker_extension.py`), which runs vLLM's layer-wise reload. Measured on the 2-core CPU machine, fp32:
  0.03–0.1 s for the 0.8–2.7M-parameter tiny agents (3–11 MB); their engines start in ≈ 15 s and
  generate ≈ 2.5k (Llama-like) to ≈ 4k (Qwen3-like) tokens/s at 32 sequences.
- `ipc`: `begin_refit()`, `load_staged(bucket)` per bucket, `finish_refit(...)` — every worker reads the bucket
  from the staging buffer on its own device (CUDA IPC; shared memory on CPU).
Either way a colocated engine wakes its weights first (`wake_up(["weights"])`); the KV cache stays asleep until
`wake_up()`.

Scripts that start an engine need an `if __name__ == "__main__":` guard: vLLM spawns its engine-core and
worker processes, and a spawned child re-imports the main module.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from nemo_hacpo.config import AgentConfig
from nemo_hacpo.models.chat import Message, render_prompt_ids
from nemo_hacpo.rollout.engine_processes import (
    SHM_DIR,
    engine_pids,
    engine_shm_files,
    record_engine,
    start_watchdog,
    stop_watchdog,
    unlink_orphans,
    wait_gone,
)
from nemo_hacpo.rollout.outputs import (
    GenerationResult,
    RefitStats,
    ResponseError,
    SampledResponse,
    check_response,
    completion_logprobs,
)
from nemo_hacpo.rollout.sampling import (
    SamplingSettings,
    call_request_seeds,
    sampling_kwargs,
    scoring_kwargs,
)
from nemo_hacpo.rollout.settings import (
    Device,
    EngineSettings,
    engine_environment,
    engine_settings,
    llm_kwargs,
    tokenizer_view,
    write_generation_config,
)
from nemo_hacpo.rollout.weight_wire import DEFAULT_CHUNK_BYTES, encode_chunk, iter_chunks

logger = logging.getLogger(__name__)

SLEEP_TAGS = ("weights", "kv_cache")
ENGINE_EXIT_TIMEOUT_S = 5.0
"""How long `shutdown` lets vLLM's EngineCore tear down and exit by itself before vLLM force-kills it (vLLM's own
default). Its full teardown takes longer on a busy 2-core machine (5–8 s idle, 15–32 s under load, mostly garbage
collection at exit) — too long for a stop inside Slurm's KillWait (docs/reliability.md) — so a killed EngineCore's
/dev/shm files are unlinked afterwards (`engine_processes.unlink_orphans`)."""
ENGINE_GONE_WAIT_S = 2.0
"""After vLLM's shutdown, how long `shutdown` waits for the engine's processes to be gone before it unlinks their
/dev/shm files: a killed process exits within it unless the machine is very busy; the files of one still alive are
left to the recorded sweep (`engine_processes.sweep_recorded`), so that the shutdown stays inside a SIGTERM stop's
15 s."""


class RolloutEngine:
    """One agent's vLLM engine: generate, score fixed sequences, refit weights in place, sleep/wake (CUDA)."""

    def __init__(self, settings: EngineSettings, tokenizer: Any, *, sampling: SamplingSettings | None = None,
                 chat_template: str | None = None, shm_record: str | Path | None = None) -> None:
        """Start the engine (blocking; tens of seconds on CPU). `tokenizer` must be the one in
        `settings.tokenizer_dir` (the agent's own), loaded in this process for rendering and decoding.
        `shm_record`: where to record the engine's processes and /dev/shm files once it runs, so that what it leaves
        if it is killed can be swept (`engine_processes.sweep_recorded`); removed by a clean shutdown."""
        if tokenizer.eos_token_id is None:
            raise ValueError(f"agent {settings.agent_name!r}: the tokenizer has no EOS token; responses could "
                             "never finish")
        self.settings = settings
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.sampling = sampling or SamplingSettings()
        self.eos_token_id = int(tokenizer.eos_token_id)
        self._asleep: set[str] = set()
        self._generate_calls = 0
        self._stats: dict[str, float] = {"generate_calls": 0, "refits": 0}

        environment = engine_environment(settings)  # while the engine starts: its processes inherit it
        saved = {key: os.environ.get(key) for key in environment}
        self._scratch_dir = tempfile.mkdtemp(prefix=f"nemo_hacpo_{settings.agent_name}_engine_")
        weakref.finalize(self, shutil.rmtree, self._scratch_dir, True)  # also when shutdown() is never called
        write_generation_config(self._scratch_dir, self.eos_token_id)
        view = tokenizer_view(settings.tokenizer_dir, settings.model_dir, Path(self._scratch_dir) / "tokenizer")
        from vllm import LLM

        start = time.perf_counter()
        for key, value in environment.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            self._llm: Any = LLM(**llm_kwargs(settings, generation_config_dir=self._scratch_dir, tokenizer_dir=view))
        except BaseException:
            shutil.rmtree(self._scratch_dir, ignore_errors=True)
            raise
        finally:  # a later engine in this process (a restart, a test) reads the user's settings, not these
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self._stats["startup_s"] = time.perf_counter() - start
        self._engine_pids = engine_pids(self._llm)
        self._watchdog = start_watchdog(self._engine_pids)  # kills them if this process dies without a shutdown
        self._engine_shm = engine_shm_files(self._engine_pids)
        self._shm_record = Path(shm_record) if shm_record is not None else None
        if self._shm_record is not None:
            record_engine(self._shm_record, self._engine_pids, self._engine_shm, scratch=self._scratch_dir)
        logger.info("rollout engine %s started in %.1f s (device %s, tp %d, dtype %s, max_model_len %d)",
                    settings.agent_name, self._stats["startup_s"], settings.device, settings.tensor_parallel_size,
                    settings.dtype, settings.max_model_len)

    # ------------------------------------------------------------------------------------------ building
    @classmethod
    def from_agent(cls, agent: AgentConfig, model_dir: str | Path, *, tokenizer_dir: str | Path | None = None,
                   device: Device | None = None, default_seed: int = 0,
                   cpu_cores: Sequence[int] | None = None, dummy_weights: bool = False,
                   shm_record: str | Path | None = None) -> RolloutEngine:
        """Start the engine of `agent` from the HF checkpoint in `model_dir`.

        The tokenizer is the agent's (`agent.tokenizer.source`; `model` = the checkpoint's own) unless
        `tokenizer_dir` is given. `device` defaults to CUDA when available. `default_seed` is used when
        `agent.rollout.seed` is null. `cpu_cores` (CPU): the cores the engine's threads are bound to.
        `dummy_weights`: `model_dir` needs only its config.json; the weights are vLLM's placeholders
        (`load_format="dummy"`) until the caller refits real ones — nothing is read from disk. `shm_record`: see
        `__init__`.
        """
        from nemo_hacpo.models.tokenizers import load_tokenizer, tokenizer_path

        if tokenizer_dir is None:
            source = agent.tokenizer.source
            tokenizer_dir = Path(model_dir) if source == "model" else tokenizer_path(source)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        settings = engine_settings(agent, model_dir, tokenizer_dir, device=device, default_seed=default_seed,
                                   cpu_cores=cpu_cores, dummy_weights=dummy_weights)
        return cls(settings, load_tokenizer(Path(tokenizer_dir)), sampling=SamplingSettings.from_config(agent.rollout),
                   chat_template=agent.tokenizer.chat_template, shm_record=shm_record)

    @property
    def stats(self) -> dict[str, float]:
        """startup_s, generate_calls, last_generate_s, last_tokens_per_s, refits, last_refit_s, last_refit_bytes,
        shutdown_s (once shut down)."""
        return dict(self._stats)

    @property
    def llm(self) -> Any:
        """The underlying `vllm.LLM` (for what this wrapper does not cover)."""
        return self._llm

    # ---------------------------------------------------------------------------------------- generation
    def render(self, messages: Sequence[Message] | Sequence[dict]) -> list[int]:
        """Prompt ids of one chat prompt (the agent's template, generation prompt on)."""
        return render_prompt_ids(messages, self.tokenizer, self.chat_template)

    def generate(self, prompts: Sequence[Sequence[Message] | Sequence[dict]], n: int, *,
                 max_tokens: int | None = None, seed: int | None = None,
                 sampling: SamplingSettings | None = None) -> GenerationResult:
        """G = n responses to each chat prompt (B = len(prompts)); see `generate_from_ids`."""
        return self.generate_from_ids([self.render(p) for p in prompts], n, max_tokens=max_tokens, seed=seed,
                                      sampling=sampling)

    def generate_from_ids(self, prompt_token_ids: Sequence[Sequence[int]], n: int, *,
                          max_tokens: int | None = None, seed: int | None = None,
                          sampling: SamplingSettings | None = None) -> GenerationResult:
        """G = n responses to each rendered prompt.

        `max_tokens` defaults to (and may not exceed) the agent's max_response_length. `seed` is the call's base
        seed (prompt b's request gets seed + b·n, its responses seed + b·n + g); None derives it from the engine
        seed and the call count, so a run is reproducible and successive calls differ; an engine with
        `rollout.seeded_requests: false` seeds no request and ignores it (`call_request_seeds`). `sampling`
        overrides the agent's temperature / top-p / top-k for this call (evaluation: `SamplingSettings(temperature=0.0)`).
        """
        if self._asleep:
            raise RuntimeError(f"engine {self.settings.agent_name!r} is asleep ({sorted(self._asleep)}); "
                               "call wake_up() before generating")
        max_tokens = self.settings.max_response_length if max_tokens is None else max_tokens
        if not 1 <= max_tokens <= self.settings.max_response_length:
            raise ValueError(f"max_tokens must be in [1, {self.settings.max_response_length}], got {max_tokens}")
        for b, ids in enumerate(prompt_token_ids):
            if not 1 <= len(ids) <= self.settings.max_prompt_length:
                raise ValueError(f"prompt {b} has {len(ids)} tokens; need 1..{self.settings.max_prompt_length} "
                                 f"(agent {self.settings.agent_name!r})")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seeds = call_request_seeds(self.settings.seeded_requests, self.settings.seed, self._generate_calls, seed,
                                   len(prompt_token_ids), n)
        params = [SamplingParams(**sampling_kwargs(sampling or self.sampling, n=n, max_tokens=max_tokens,
                                                   eos_token_id=self.eos_token_id, seed=s)) for s in seeds]
        prompts = [list(map(int, ids)) for ids in prompt_token_ids]
        start = time.perf_counter()
        outputs = self._llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params,
                                     use_tqdm=False)
        elapsed = time.perf_counter() - start
        self._generate_calls += 1

        groups: list[list[tuple[list[int], list[float], str]]] = []
        for b, output in enumerate(outputs):
            completions = sorted(output.outputs, key=lambda c: c.index)
            if len(completions) != n:
                raise ResponseError(f"prompt {b}: vLLM returned {len(completions)} responses, asked for {n}")
            group = []
            for completion in completions:
                token_ids = list(completion.token_ids)
                logprobs = completion_logprobs(completion)
                check_response(token_ids, logprobs, str(completion.finish_reason), self.eos_token_id, max_tokens)
                group.append((token_ids, logprobs, str(completion.finish_reason)))
            groups.append(group)
        texts = iter(self.tokenizer.batch_decode([ids for group in groups for ids, _, _ in group],
                                                 skip_special_tokens=True, clean_up_tokenization_spaces=False))
        responses = [[SampledResponse(prompt_index=b, sample_index=g, token_ids=ids, text=next(texts),
                                      finish_reason=reason, logprobs=logprobs)  # type: ignore[arg-type]
                      for g, (ids, logprobs, reason) in enumerate(group)] for b, group in enumerate(groups)]

        generated = sum(len(ids) for group in groups for ids, _, _ in group)
        stats = {"generate_s": elapsed, "num_prompts": float(len(prompts)), "num_responses": float(len(prompts) * n),
                 "num_generated_tokens": float(generated),
                 "tokens_per_s": generated / elapsed if elapsed > 0 else math.inf}
        self._stats.update(generate_calls=float(self._generate_calls), last_generate_s=elapsed,
                           last_tokens_per_s=stats["tokens_per_s"])
        logger.info("rollout engine %s: %d responses, %d tokens in %.2f s (%.0f tokens/s)", self.settings.agent_name,
                    len(prompts) * n, generated, elapsed, stats["tokens_per_s"])
        return GenerationResult(prompt_token_ids=prompts, responses=responses, seeds=list(seeds), stats=stats)

    def score(self, sequences: Sequence[Sequence[int]], num_prompt_tokens: Sequence[int] | None = None
              ) -> list[list[float]]:
        """vLLM's log-probs of fixed token sequences (prompt log-probs, one throw-away generated token).

        Row i holds log p(seq_i[t] | seq_i[:t]) for t = 1..L_i−1, or, with `num_prompt_tokens` P_i, only the
        response part t = P_i..L_i−1 (what the trainer scores). Model distribution (temperature 1).
        """
        if self._asleep:
            raise RuntimeError(f"engine {self.settings.agent_name!r} is asleep; call wake_up() before scoring")
        if num_prompt_tokens is not None and len(num_prompt_tokens) != len(sequences):
            raise ValueError(f"{len(num_prompt_tokens)} prompt lengths for {len(sequences)} sequences")
        for i, seq in enumerate(sequences):
            if not 2 <= len(seq) < self.settings.max_model_len:
                raise ValueError(f"sequence {i} has {len(seq)} tokens; scoring needs 2..{self.settings.max_model_len - 1} "
                                 "(one slot is left for vLLM's throw-away token)")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(**scoring_kwargs())
        outputs = self._llm.generate([TokensPrompt(prompt_token_ids=list(map(int, s))) for s in sequences],
                                     params, use_tqdm=False)
        rows: list[list[float]] = []
        for i, (seq, output) in enumerate(zip(sequences, outputs, strict=True)):
            per_position = output.prompt_logprobs
            row = [float(per_position[t][int(seq[t])].logprob) for t in range(1, len(seq))]
            if num_prompt_tokens is not None:
                start = num_prompt_tokens[i]
                if not 1 <= start <= len(seq):
                    raise ValueError(f"sequence {i}: prompt length {start} outside 1..{len(seq)}")
                row = row[start - 1:]
            rows.append(row)
        return rows

    # --------------------------------------------------------------------------------------------- refit
    def refit(self, weights: Iterable[tuple[str, torch.Tensor]], *,
              chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> RefitStats:
        """Load new HF-layout weights into the running engine (the `rpc` transport: safetensors chunks of
        ≤ `chunk_bytes` over collective_rpc), then reset the prefix cache. Returns (and records in `stats`)
        its time, tensors and bytes. The `ipc` transport drives `begin_refit`/`load_staged`/`finish_refit`
        (`rollout.refit.StagedRefit`)."""
        self.begin_refit()
        start = time.perf_counter()
        tensors, size = self._refit_rpc(weights, chunk_bytes)
        return self.finish_refit(time.perf_counter() - start, tensors, size, "rpc", rpc_finish=False)

    def begin_refit(self) -> None:
        """Wake the weights (a sleeping colocated engine) and start vLLM's layer-wise reload on every worker."""
        if "weights" in self._asleep:
            self.wake_up(["weights"])
        self._llm.collective_rpc("nemo_hacpo_begin_refit")

    def load_staged(self, payload: bytes) -> list[tuple[str, int]]:
        """One bucket of a staged refit (`rollout.refit.encode_staged`); every worker loads it. Returns, per
        worker (TP rank order), the device key of the buffer it read and the number of tensors it loaded."""
        try:
            return [(str(key), int(n)) for key, n in self._llm.collective_rpc("nemo_hacpo_load_staged",
                                                                            args=(payload,))]
        except BaseException:
            self._abort_refit()
            raise

    def finish_refit(self, seconds: float, tensors: int, size: int, transport: str, *,
                     rpc_finish: bool = True) -> RefitStats:
        """Finish the reload on every worker (raises if a parameter got no weight), reset the prefix cache."""
        if rpc_finish:
            self._llm.collective_rpc("nemo_hacpo_finish_refit")
        self._llm.reset_prefix_cache()
        return self._record_refit(seconds, tensors, size, transport)

    def _abort_refit(self) -> None:
        try:  # put the model back in a runnable state before surfacing the error
            self._llm.collective_rpc("nemo_hacpo_finish_refit")
        except Exception:  # noqa: BLE001 - the original error is the one to report
            logger.exception("finishing an interrupted refit failed as well")

    def _refit_rpc(self, weights: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int) -> tuple[int, int]:
        tensors = size = 0
        try:
            for chunk in iter_chunks(weights, chunk_bytes):
                payload = encode_chunk(chunk)
                self._llm.collective_rpc("nemo_hacpo_load_chunk", args=(payload,))
                tensors += len(chunk)
                size += len(payload)
        except BaseException:
            self._abort_refit()
            raise
        self._llm.collective_rpc("nemo_hacpo_finish_refit")
        return tensors, size

    def _record_refit(self, elapsed: float, tensors: int, size: int, transport: str) -> RefitStats:
        self._stats["refits"] += 1
        self._stats.update(last_refit_s=elapsed, last_refit_bytes=float(size))
        logger.info("rollout engine %s: refit of %d tensors (%.1f MB, %s) in %.2f s", self.settings.agent_name,
                    tensors, size / 1e6, transport, elapsed)
        return RefitStats(seconds=elapsed, tensors=tensors, bytes=size, transport=transport)

    # ----------------------------------------------------------------------------------------- sleep/wake
    def sleep(self, level: int = 1) -> None:
        """Release GPU memory while the trainer runs (colocated CUDA engines; a no-op on CPU).

        level 1 offloads the weights to host memory and drops the KV cache; level 2 drops both (use it when
        a refit always follows, which rewrites every weight)."""
        if self.settings.device == "cpu":
            return
        if not self.settings.enable_sleep_mode:
            raise RuntimeError(f"engine {self.settings.agent_name!r} was not started with sleep mode "
                               "(rollout.colocated: false)")
        self._llm.sleep(level=level)
        self._asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate `tags` (weights, kv_cache; None = all). A no-op on CPU."""
        if self.settings.device == "cpu" or not self._asleep:
            return
        wanted = set(SLEEP_TAGS) if tags is None else set(tags)
        unknown = wanted - set(SLEEP_TAGS)
        if unknown:
            raise ValueError(f"unknown wake-up tags {sorted(unknown)}; use {SLEEP_TAGS}")
        wanted &= self._asleep
        if wanted:
            self._llm.wake_up(tags=sorted(wanted))
            self._asleep -= wanted

    @property
    def can_sleep(self) -> bool:
        """Whether `sleep` releases accelerator memory: CUDA engines started with sleep mode (colocated)."""
        return self.settings.device != "cpu" and self.settings.enable_sleep_mode

    @property
    def asleep(self) -> frozenset[str]:
        return frozenset(self._asleep)

    # ---------------------------------------------------------------------------------------------- close
    def shutdown(self) -> None:
        """Stop the engine's processes and leave none of their shared memory behind (idempotent).

        The EngineCore gets `ENGINE_EXIT_TIMEOUT_S` to exit by itself, which unlinks its /dev/shm files; when it is
        killed instead (or died earlier), the vLLM files its processes mapped are unlinked here once they are all
        gone (`engine_processes.unlink_orphans`)."""
        llm, self._llm = getattr(self, "_llm", None), None
        shutil.rmtree(getattr(self, "_scratch_dir", ""), ignore_errors=True)
        stop_watchdog(getattr(self, "_watchdog", None))
        self._watchdog = None
        if llm is None:
            return
        pids = sorted(set(getattr(self, "_engine_pids", ())) | set(engine_pids(llm)))
        shm = set(getattr(self, "_engine_shm", ())) | engine_shm_files(pids)
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        start = time.perf_counter()
        if core is not None:
            core.shutdown(timeout=ENGINE_EXIT_TIMEOUT_S)
        del llm, core
        wait_gone(pids, timeout=ENGINE_GONE_WAIT_S)  # gone already unless the EngineCore was killed
        removed = unlink_orphans(shm, pids)
        if getattr(self, "_shm_record", None) is not None:  # what is left (still mapped: later), for the sweep
            left = sorted(name for name in shm if (SHM_DIR / name).exists())
            if left:
                record_engine(self._shm_record, pids, left)
            else:
                self._shm_record.unlink(missing_ok=True)
        self._stats["shutdown_s"] = time.perf_counter() - start
        if removed:
            logger.warning("rollout engine %s: unlinked %d shared-memory file(s) its processes left in /dev/shm: %s",
                           self.settings.agent_name, len(removed), removed)

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
