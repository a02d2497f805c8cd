"""The follower side of `serve` under a launch, in one process: `follow` replays
rank 0's messages on its own engine, and stops with one error when its tokens
are not rank 0's."""

import pytest
from conftest import make_loaded

from entropix_mlx.distributed import World
from entropix_mlx.errors import DistributedError
from entropix_mlx.server.engine import Engine
from entropix_mlx.server.lockstep import follow

RECIPE = {
    "sampler": "greedy",
    "overrides": {},
    "penalties": {},
    "ids": [5, 6, 7, 8],
    "max_tokens": 4,
    "seed": 0,
    "logprobs": False,
    "top_logprobs": 0,
    "stop": [],
}


class Messages:
    """Rank 0's messages, handed out in turn (what `broadcast_json` would receive)."""

    w = World(rank=1, size=2)
    beat = 0.0

    def __init__(self, messages):
        self.messages = iter(messages)

    def share(self, message):
        return next(self.messages)


def follower(tiny_model, tiny_tokenizer, messages) -> Engine:
    return Engine(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"), lockstep=Messages(messages), worker=False)


def test_a_follower_replays_rank_0s_requests_to_their_end(tiny_model, tiny_tokenizer):
    steps = [{"add": [RECIPE], "cancel": []}] + [{"add": [], "cancel": []}] * 4
    engine = follower(tiny_model, tiny_tokenizer, [*steps, {"idle": True}, {"stop": True}])
    follow(engine)
    assert engine.served == 1
    assert engine.prefix_cache.take(RECIPE["ids"])[1] > 0  # the finished row's cache was kept, as on rank 0


def test_a_follower_that_decoded_other_tokens_stops(tiny_model, tiny_tokenizer):
    steps = [{"add": [RECIPE], "cancel": [], "digest": []}, {"add": [], "cancel": [], "digest": [[0, 1, [-1]]]}]
    engine = follower(tiny_model, tiny_tokenizer, steps)
    with pytest.raises(DistributedError, match="rank 1 decoded other tokens than rank 0"):
        follow(engine)


def test_a_follower_answers_the_same_choice_of_n(tiny_model, tiny_tokenizer):
    from entropix_mlx.front import choose
    from entropix_mlx.server.engine import Job, job_recipe
    from entropix_mlx.server.lockstep import rebuild

    engine = follower(tiny_model, tiny_tokenizer, [])
    prepared = engine.loaded.prepare(RECIPE["ids"], choose("entropix"), 4, 3, path_choice=2)
    job = Job(RECIPE["ids"], prepared.sampler, 4, 3, recipe={**RECIPE, "sampler": "entropix"})
    assert rebuild(engine, job_recipe(job)).sampler.path_choice == 2  # the same branch paths as rank 0's
