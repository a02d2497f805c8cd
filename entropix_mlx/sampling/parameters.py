"""The sampling parameters a request may set (temperature, top_p, top_k,
min_p) and their ranges. The CLI, the server and the Python API read this one
table, so they agree; which samplers take them is in front/registry.py, and what
temperature 0 means in front/loaded.py (`choose`)."""

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
