"""The sampling parameters have one home (sampling/parameters.py), and the CLI,
the server and the Python API follow it alike: the same ranges, and temperature
0 hands the answer to greedy everywhere."""

import pytest
from test_cli_run import invoke

from entropix_mlx import api
from entropix_mlx.errors import ConfigError
from entropix_mlx.front import choose
from entropix_mlx.front.registry import SAMPLER_NAMES
from entropix_mlx.sampling.parameters import PARAMETERS
from entropix_mlx.server.schema import APIError, parse

BODY = {"messages": [{"role": "user", "content": "Hi"}]}


def test_the_rule():
    c = choose("entropix", {"temperature": 0.5, "top_p": None})
    assert (c.name, c.params, c.notes) == ("entropix", {"temperature": 0.5}, ())
    c = choose("min_p", {"temperature": 0, "min_p": 0.1})
    assert (c.asked, c.name, c.params) == ("min_p", "greedy", {}) and "temperature 0" in c.notes[0]
    c = choose("deliberate", {"top_k": 5})
    assert (c.name, c.params) == ("deliberate", {}) and "top_k ignored" in c.notes[0]
    with pytest.raises(ConfigError, match=r"'top_p' = 1.5 is invalid: must be in \(0, 1\]"):
        choose("entropix", {"top_p": 1.5})
    with pytest.raises(ConfigError, match="unknown sampler 'cisc'"):
        choose("cisc")  # an eval baseline: not a name run, chat and serve take
    assert PARAMETERS["min_p"].problem(1.0) and not PARAMETERS["min_p"].problem(0.0)
    assert PARAMETERS["top_k"].problem(2.5) == "must be a whole number"


@pytest.mark.parametrize(
    "name, value", [("top_p", 1.5), ("top_p", 0), ("min_p", 1), ("top_k", -1), ("temperature", -0.1)]
)
def test_the_cli_the_server_and_the_api_refuse_the_same_values(name, value, tiny_ref):
    problem = PARAMETERS[name].problem(value)
    assert problem
    code, _, err = invoke("run", "hi", "-m", tiny_ref, f"--{name.replace('_', '-')}", value)
    assert code == 2 and problem in err
    with pytest.raises(APIError) as e:
        parse({**BODY, name: value}, True, SAMPLER_NAMES)
    assert problem in str(e.value.message) and e.value.param == name
    with pytest.raises(ConfigError) as e:
        api.make_sampler("temperature", **{name: value})
    assert problem in str(e.value)


def test_temperature_zero_means_greedy_everywhere(tiny_ref):
    code, _, err = invoke("run", "hi", "-m", tiny_ref, "--temperature", "0", "--max-tokens", "2")
    assert code == 0 and "sampler greedy" in err and "note: temperature 0" in err
    with pytest.warns(UserWarning, match="temperature 0"):
        assert api.make_sampler("min_p", temperature=0).name == "greedy"
    p = parse({**BODY, "temperature": 0}, True, SAMPLER_NAMES)
    assert choose(p.sampler, p.overrides).name == "greedy"
