"""The sampling parameters a request may set (temperature, top_p, top_k,
min_p): their ranges, which samplers take them, and what temperature 0 means.
The CLI, the server and the Python API read this one table, so they agree.

Temperature 0 asks for deterministic answers: the greedy sampler answers (as in
mlx-lm, llama.cpp and Ollama), whichever sampler was named. Greedy and
deliberate take no sampling parameters (they never sample).
"""

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Parameter:
    name: str
    whole: bool  # a whole number
    low: float
    high: float | None  # None: no upper bound
    low_open: bool = False
    high_open: bool = False
    example: str = ""

    @property
    def interval(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def problem(self, value) -> str | None:
        """What is wrong with `value`, or None."""
        if isinstance(value, bool) or not isinstance(value, int if self.whole else (int, float)):
            return "must be a whole number" if self.whole else "must be a number"
        above = value > self.low if self.low_open else value >= self.low
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        if above and below:
            return None
        return f"must be {'in ' if self.high is not None else ''}{self.interval}" + (
            f", e.g. {self.example}" if self.example else ""
        )


PARAMETERS = {
    p.name: p
    for p in (
        Parameter("temperature", False, 0.0, None, example="0.7 (0: the greedy sampler answers)"),
        Parameter("top_p", False, 0.0, 1.0, low_open=True, example="0.9"),
        Parameter("top_k", True, 0, None, example="40 (0: all tokens)"),
        Parameter("min_p", False, 0.0, 1.0, high_open=True, example="0.05"),
    )
}
TAKE_PARAMETERS = ("entropix", "temperature", "min_p")  # the samplers that sample


def check_parameters(given: dict) -> dict:
    """The parameters that are set (not None), each checked against its range."""
    given = {k: v for k, v in given.items() if v is not None}
    for name, value in given.items():
        if name not in PARAMETERS:
            raise ConfigError(f"unknown sampling parameter '{name}'; they are: {', '.join(PARAMETERS)}")
        problem = PARAMETERS[name].problem(value)
        if problem:
            raise ConfigError(f"sampling parameter '{name}' = {value!r} is invalid: {problem}")
    return given


def sampling_request(sampler: str, given: dict) -> tuple[str, dict, list[str]]:
    """(the sampler that answers, the parameters it takes, notes on what changed).
    Parameters a sampler does not take are left out with a note; temperature 0
    hands the answer to greedy with a note."""
    given = check_parameters(given)
    if given and sampler not in TAKE_PARAMETERS:
        return sampler, {}, [f"{', '.join(given)} ignored: the {sampler} sampler takes no sampling parameters"]
    if given.get("temperature") == 0:
        return "greedy", {}, ["temperature 0 asks for deterministic answers: the greedy sampler answered"]
    return sampler, given, []
