"""`serve` under `mlx.launch`: rank 0 owns HTTP, the other ranks follow its batches.

Every forward pass of a split model exchanges data between the ranks
(model/sharding.py), so every rank must run the same engine operations in the
same order. Rank 0's worker shares each one before it runs it, as a small JSON
message through `mx.distributed` (distributed.broadcast_json): the requests it
admits (their prompt tokens, sampler, penalties and seed), the slots it cuts,
and the step itself. The other ranks hold no server: `follow` replays the same
operations on an engine of their own. Their logits are rank 0's and their
seeds are the same, so they take the same decisions without being told the
tokens (each step's message carries every row's length and last token, and a
rank that decided otherwise stops with an error); the cancellations, which
depend on rank 0's clients, are shared. Between requests rank 0 says it is
idle every `beat` and the followers sleep until the next one (waiting in an
exchange polls, which would keep a core busy); rank 0's shutdown sends them
`stop`, and its death closes the connection, which ends the wait with an error.
"""

import os
import signal
import sys
import time

from ..distributed import World, broadcast_json
from ..errors import DistributedError
from ..front import SamplerChoice
from .batched import BatchRunner
from .engine import Engine, Job


class Lockstep:
    # Seconds rank 0 waits for a request before telling the others it is idle. A
    # rank waiting in an exchange keeps a core busy polling, so an idle follower
    # sleeps through most of each beat instead; a request that comes meanwhile
    # waits for it, at most a beat.
    beat = 0.25

    def __init__(self, w: World):
        self.w = w

    def share(self, message):
        """Rank 0's `message` on every rank."""
        try:
            return broadcast_json(self.w, message)
        except DistributedError as e:
            if not self.w.root:
                raise
            # Rank 0's server cannot go on without the other ranks' shares of the model.
            print(f"error: {e}; stopping the server", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down as on Ctrl-C
            raise SystemExit(1) from None  # ends the worker thread quietly


def rebuild(engine: Engine, recipe: dict) -> Job:
    """Rank 0's job, as `job_recipe` described it, with no client."""
    choice = SamplerChoice(recipe["sampler"], recipe["sampler"], recipe["overrides"])
    prepared = engine.loaded.prepare(
        recipe["ids"],
        choice,
        recipe["max_tokens"],
        recipe["seed"],
        recipe["penalties"],
        reasoning=recipe.get("reasoning", False),
        json_schema=recipe.get("json_schema"),
        grammar=recipe.get("grammar"),
        path_choice=recipe.get("path_choice", 0),
    )
    return Job(
        recipe["ids"],
        prepared.sampler,
        prepared.max_tokens,
        recipe["seed"],
        recipe["logprobs"],
        recipe["top_logprobs"],
        recipe["stop"],
        prepared.penalties,
        shared_prefill=recipe.get("shared_prefill", False),
    )


def follow(engine: Engine):
    """A follower rank's loop: replay rank 0's operations until it stops."""
    # Ctrl-C reaches every rank of the launch; a follower ends with rank 0's stop
    # (or its lost connection), not in the middle of an exchange.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runner = BatchRunner(engine, engine.batch_size)
    while True:
        message = engine.lockstep.share(None)
        if message.get("stop"):
            return
        if message.get("idle"):
            time.sleep(0.9 * engine.lockstep.beat)  # wakes just before rank 0's next beat
            continue
        if "alone" in message:
            engine.run_alone(rebuild(engine, message["alone"]))
            continue
        if "digest" in message and message["digest"] != runner.digest():
            raise DistributedError(
                f"rank {engine.lockstep.w.rank} decoded other tokens than rank 0 "
                "(a different model file or version of MLX?); install the same on every machine"
            )
        for recipe in message["add"]:
            runner.add(rebuild(engine, recipe))
        try:
            runner.step(set(message["cancel"]))
        except Exception as e:  # rank 0's step failed the same way: start over as it does
            runner.fail(str(e))
