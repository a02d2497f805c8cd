"""`self_consistency` and `cisc` as decoders: k sampled answers per question in
the batch engine (one prefill, the rest spawned rows), then a vote
(sampling/voting.py). Each answer's record keeps every sample (its answer,
tokens, ending and per-token log-probabilities), so another vote, or the vote
of the first k' < k samples, is recomputed from one run without decoding."""

from collections.abc import Callable, Iterator

from ..errors import ConfigError
from ..sampling.answers import default_answer
from ..sampling.recorder import KEPT_ALTERNATIVES, recording
from ..sampling.selection import vote
from ..sampling.voting import SampleSpawner, VoteConfig
from .engine import by_request, forking_batch
from .rows import DEFAULT_MAX_TOKENS, Request, RowResult


def mean(values: list) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else 0.0


def sample_record(result: RowResult, text: str, answer: str | None) -> dict:
    """What a vote (now or later) needs of one sample."""
    return {
        "answer": answer,
        "tokens": len(result.tokens),
        "finish_reason": result.finish_reason,
        "mean_logprob": mean(result.logprobs),
        "logprobs": [None if lp is None else round(lp, 4) for lp in result.logprobs],
        "top": [[[t, round(lp, 3)] for t, lp in alternatives] for alternatives in result.tops],
        "text": text,
    }


def vote_rows(
    model,
    tokenizer,
    requests: list[Request],
    config: VoteConfig,
    answer_of: Callable[[int, str], str | None],
    batch_size: int = 8,
    prefix: list[int] | None = None,
) -> Iterator[tuple[int, RowResult, float]]:
    """For `eval`: each request's k samples, voted; yields (index, the winning
    sample's RowResult with `extra` for the record, seconds). About
    `batch_size` rows decode at once: batch_size // k questions in flight."""
    in_flight = max(1, batch_size // config.k)
    rows = forking_batch(
        model,
        tokenizer,
        requests,
        lambda: recording(SampleSpawner(config), KEPT_ALTERNATIVES),
        lambda: recording(SampleSpawner(config, spawns=False), KEPT_ALTERNATIVES),
        in_flight,
        prefix,
    )
    for index, results, seconds in by_request(rows):
        texts = [tokenizer.decode(r.tokens) for r in results]
        samples = [sample_record(r, t, answer_of(index, t)) for r, t in zip(results, texts, strict=True)]
        answers = [s["answer"] for s in samples]
        chosen, votes = vote(
            answers, [s["mean_logprob"] for s in samples], config.selector, config.confidence_temperature
        )
        w = results[chosen]
        result = RowResult(
            tokens=w.tokens,
            strategies=w.strategies,
            logprobs=w.logprobs,
            finish_reason=w.finish_reason,
            prompt_tokens=len(requests[index].prompt),
        )
        result.extra = {
            "tokens_spent": sum(s["tokens"] for s in samples),
            "chosen": chosen,
            "votes": votes,
            "samples": samples,
        }
        yield index, result, seconds


class Voter:
    """Self-consistency or CISC as a decoder for `eval` (see `generate.Decoder`)."""

    def __init__(self, name: str, config: VoteConfig, source: str = "defaults"):
        self.name, self.config = name, config
        self.config_source = f"{name} settings: {source}"

    def generate(
        self, model, tokenizer, prompt_tokens, max_tokens=DEFAULT_MAX_TOKENS, seed=0, cache=None, penalties=None
    ):
        # Its answer is known only once all k are in; `eval` is where it is compared.
        raise ConfigError(f"{self.name} is an eval baseline: it answers task files in eval, not one prompt")

    def answer_rows(self, model, tokenizer, requests, batch_size=8, prefix=None, answer_of=None):
        answer_of = answer_of or (lambda index, text: default_answer(text))
        return vote_rows(model, tokenizer, requests, self.config, answer_of, batch_size, prefix)
