"""Asynchronous rollouts (`max_staleness` = k > 0): the server generates the next k generation batches while the
trainer trains the current one.

A FIFO of launched batches. Each generation step launches the batch it is handed (with the policy of this optimizer
step, synced first) and trains the OLDEST launched one; at the start, and after a resume, k more batches are read
ahead and launched, so k stay in flight. A batch launched at step v and trained at step t has staleness t - v <= k
(checked at every pop): one launch per pop, and every optimizer step pops at least once. The data order is kept;
the batches in flight when training ends are never trained.

Off-policy correction: the completions' log-probs come from vLLM, i.e. from the behaviour policy of step v; TRL
scores the rows with the current policy (old_per_token_logps) and its importance-sampling correction weights each
token by pi_theta_t / pi_theta_v, truncated or masked as `vllm_importance_sampling_mode` says (docs/async.md). With
k = 0 this module is not used: TRL's synchronous loop runs unchanged.

Distributed: every rank launches and pops in the same order (the prompts are gathered, a collective); only the main
process talks to the server, on a background thread with its own HTTP session, and broadcasts each result.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from transformers import TrainerCallback


def sampling_params(generation) -> dict:
    """The sampling arguments of `VLLMClient.generate`, from TRL's `VLLMGeneration` (what its server mode sends)."""
    return {
        "repetition_penalty": generation.repetition_penalty,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": 0.0 if generation.min_p is None else generation.min_p,
        "max_tokens": generation.max_completion_length,
        "logprobs": generation.logprobs,
        "structured_outputs_regex": generation.structured_outputs_regex,
    }


@dataclass
class Launched:
    """One generation batch in flight: this rank's inputs and prompt ids, the optimizer step of the policy that
    generates it and the name it is served under, where the data stream stood before it (`resume_at`), and the
    request (main process only)."""

    inputs: list
    prompt_ids: list
    version: int
    model: str
    resume_at: tuple[int, int]
    future: Future | None


class AsyncRollouts:
    """The FIFO of launched generation batches of one trainer (see the module docstring)."""

    def __init__(
        self, client, *, max_staleness, num_generations, sampling, extra_kwargs, collectives, metrics
    ):
        self.max_staleness, self.num_generations = max_staleness, num_generations
        self.sampling, self.extra_kwargs = sampling, dict(extra_kwargs or {})
        # collectives: gather_object, broadcast_object (from the main process), rank, is_main_process
        self.gather_object, self.broadcast, self.rank, self.is_main = collectives
        self.metrics = metrics
        self.queue: deque[Launched] = deque()
        self.ready = None  # (prompt_ids, completion_ids, logprobs, logprob_token_ids) of the popped batch
        self.client, self.executor = None, None
        if self.is_main:
            self.client = copy.copy(client)  # the background thread's own HTTP session
            self.client.session = type(client.session)()
            self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-hub-rollouts")
        self.served = client  # its `model` is the name the last sync serves (None off the main process)
        self.before_launch = lambda: None  # e.g. re-sync a restarted server (every rank calls it)

    def priming(self) -> bool:
        """Whether fewer than k + 1 batches are in flight (the start, or after a resume): read ahead and launch."""
        return len(self.queue) < self.max_staleness + 1

    def launch(self, inputs: list, prompt_ids: list, version: int, resume_at: tuple[int, int]) -> None:
        """Send this generation batch to the server with the policy of optimizer step `version` (synced)."""
        self.before_launch()
        all_ids = self.gather_object(prompt_ids)
        future, model = None, self.served.model if self.is_main else ""
        if self.is_main:
            unique = all_ids[
                :: self.num_generations
            ]  # each prompt is repeated num_generations times in a row
            kwargs = {**self.extra_kwargs, "model": model}
            future = self.executor.submit(
                self.client.generate,
                prompts=unique,
                n=self.num_generations,
                generation_kwargs=kwargs,
                **self.sampling,
            )
        self.queue.append(Launched(inputs, prompt_ids, version, model, resume_at, future))

    def pop(self, version: int) -> list:
        """Wait for the oldest launched batch, hold its completions for TRL's generate call (`serve`), return its
        inputs. Logs async/staleness, async/wait_seconds and async/in_flight."""
        head = self.queue.popleft()
        staleness = version - head.version
        if not 0 <= staleness <= self.max_staleness:
            raise RuntimeError(
                f"a batch of step {head.version} reached step {version}: staleness above {self.max_staleness}"
            )
        start = time.perf_counter()
        payload = [head.future.result() if self.is_main else None]
        self.broadcast(payload)
        waited = time.perf_counter() - start
        result = payload[0]
        n, rows = self.num_generations, len(head.prompt_ids)
        mine = slice(self.rank * rows, (self.rank + 1) * rows)
        all_prompt_ids = [ids for ids in result["prompt_ids"] for _ in range(n)]
        token_ids = result.get("logprob_token_ids")
        self.ready = (
            all_prompt_ids[mine],
            result["completion_ids"][mine],
            result["logprobs"][mine],
            token_ids[mine] if token_ids is not None else None,
        )
        if list(map(list, self.ready[0])) != list(map(list, head.prompt_ids)):
            raise RuntimeError("the server answered another batch's prompts: rollouts out of order")
        self.metrics["async/staleness"].append(float(staleness))
        self.metrics["async/wait_seconds"].append(waited)
        self.metrics["async/in_flight"].append(float(len(self.queue)))
        return head.inputs

    def next_batch(self, inputs: list, step: int, stream, prompt_ids, prepare=None) -> list:
        """The batch to train at optimizer step `step`: launch `inputs` (the batch `stream` pulled last; at the start
        and after a resume also k more read ahead from `stream`, each first through `prepare(batch)` when given, as
        `inputs` went: e.g. its hints) and pop the oldest launched one. `prompt_ids(batch)`: the token ids TRL's
        generate sends for a batch. The server must already serve step `step`'s policy."""
        before = (stream.epoch, max(stream.consumed - stream.period, 0))  # `inputs` is the last batch pulled
        self.launch(inputs, prompt_ids(inputs), step, before)
        while self.priming():
            before = (stream.epoch, stream.consumed)
            ahead = stream.next_batch()
            if ahead is None:  # the epoch has no full batch left
                break
            ahead = prepare(ahead) if prepare is not None else ahead
            self.launch(ahead, prompt_ids(ahead), step, before)
        head = self.pop(step)
        stream.held = self.resume_position()
        return head

    def serve(self, generate):
        """TRL's `VLLMGeneration.generate`, answering the popped batch's prompts with its completions (every other
        call, e.g. evaluation, goes to the server as TRL sends it)."""

        def serving(prompts, images, num_generations, profiler=None):
            if self.ready is None:
                return generate(
                    prompts=prompts, images=images, num_generations=num_generations, profiler=profiler
                )
            ready, self.ready = self.ready, None
            if list(map(list, prompts)) != list(map(list, ready[0])):
                raise RuntimeError("TRL asked for other prompts than the asynchronous batch it is scoring")
            return ready

        return serving

    def wait_idle(self) -> None:
        """Wait until no launched request is running (before the server's weights change in place); the wait is
        logged as async/sync_wait_seconds (the trainer waits for generation there, not in `pop`)."""
        start = time.perf_counter()
        for launched in self.queue:
            if launched.future is not None:
                launched.future.exception()
        self.metrics["async/sync_wait_seconds"].append(time.perf_counter() - start)

    def in_use(self) -> set[str]:
        """Served names still to be generated with (their adapters must stay loaded)."""
        return {launched.model for launched in self.queue}

    def resume_position(self) -> tuple[int, int] | None:
        """Where the data stream stood before the oldest batch in flight (None: none in flight)."""
        return self.queue[0].resume_at if self.queue else None

    def close(self) -> None:
        """Forget the batches in flight (never trained) and stop the background thread."""
        self.queue.clear()
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)


class RolloutsCallback(TrainerCallback):
    """Asynchronous rollouts: the batches still in flight when training ends are dropped (never trained)."""

    def __init__(self, rollouts):
        self.rollouts = rollouts

    def on_train_end(self, args, state, control, **kwargs):
        self.rollouts.close()
