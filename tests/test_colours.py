"""The strategy colours that share a legend stay apart for every reader: with
normal colour vision and as protanopes, deuteranopes and tritanopes see them
(Machado, Oliveira and Fernandes 2009, full severity), by CIEDE2000 colour
difference on the page's colours (the terminal recording's theme)."""

import itertools
import math

from entropix_mlx.front.registry import SAMPLERS
from entropix_mlx.sampling.strategies import STRATEGY_COLORS
from entropix_mlx.server.strategies import THEME_BACKGROUND, css_color

# Linear-RGB matrices of Machado et al. (2009), severity 1.0.
DEFICIENCIES = {
    "normal": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.01182, 0.04294, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.3039)),
}
# CIEDE2000 above 10 reads as two different colours at a glance; 2 is barely noticeable.
DISTINCT = 10.0


def linear(hex_color: str) -> list[float]:
    c = [int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c]


def seen(hex_color: str, deficiency: str) -> list[float]:
    rgb = linear(hex_color)
    return [min(1.0, max(0.0, sum(m * v for m, v in zip(row, rgb, strict=True)))) for row in DEFICIENCIES[deficiency]]


def lab(rgb) -> tuple[float, float, float]:
    r, g, b = rgb
    xyz = (
        0.4124 * r + 0.3576 * g + 0.1805 * b,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        0.0193 * r + 0.1192 * g + 0.9505 * b,
    )
    fx, fy, fz = (
        t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116
        for t in (xyz[0] / 0.95047, xyz[1], xyz[2] / 1.08883)
    )
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def ciede2000(lab1, lab2) -> float:
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean**7 / (c_mean**7 + 25**7)))
    a1, a2 = (1 + g) * a1, (1 + g) * a2
    c1, c2 = math.hypot(a1, b1), math.hypot(a2, b2)
    h1, h2 = math.degrees(math.atan2(b1, a1)) % 360, math.degrees(math.atan2(b2, a2)) % 360
    dh = 0.0 if c1 * c2 == 0 else (h2 - h1 + 180) % 360 - 180
    d_l, d_c, d_h = l2 - l1, c2 - c1, 2 * math.sqrt(c1 * c2) * math.sin(math.radians(dh / 2))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    if c1 * c2 == 0:
        h_mean = h1 + h2
    elif abs(h1 - h2) > 180:
        h_mean = (h1 + h2 + 360) / 2 if h1 + h2 < 360 else (h1 + h2 - 360) / 2
    else:
        h_mean = (h1 + h2) / 2
    t = (
        1
        - 0.17 * math.cos(math.radians(h_mean - 30))
        + 0.24 * math.cos(math.radians(2 * h_mean))
        + 0.32 * math.cos(math.radians(3 * h_mean + 6))
        - 0.20 * math.cos(math.radians(4 * h_mean - 63))
    )
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    r_t = (
        -math.sin(math.radians(60 * math.exp(-(((h_mean - 275) / 25) ** 2))))
        * 2
        * math.sqrt(c_mean**7 / (c_mean**7 + 25**7))
    )
    return math.sqrt((d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (d_c / s_c) * (d_h / s_h))


def difference(color1: str, color2: str, deficiency: str) -> float:
    return ciede2000(lab(seen(color1, deficiency)), lab(seen(color2, deficiency)))


def test_ciede2000_matches_published_pairs():
    # Sharma, Wu and Dalal (2005), test data pairs 1, 7 and 17.
    assert round(ciede2000((50, 2.6772, -79.7751), (50, 0, -82.7485)), 4) == 2.0425
    assert round(ciede2000((50, 0, 0), (50, -1, 2)), 4) == 2.3669
    assert round(ciede2000((50, 2.5, 0), (73, 25, -18)), 4) == 27.1492


def test_strategies_in_one_legend_are_told_apart_with_any_colour_vision():
    worst = []
    for sampler, strategies in ((name, spec.strategies) for name, spec in SAMPLERS.items()):
        for a, b in itertools.combinations(strategies, 2):
            if css_color(STRATEGY_COLORS[a]) == css_color(STRATEGY_COLORS[b]):
                # One colour for two strategies only where a decoration tells them apart (split: underlined argmax).
                assert STRATEGY_COLORS[a].split()[1:] != STRATEGY_COLORS[b].split()[1:], (sampler, a, b)
                continue
            for deficiency in DEFICIENCIES:
                d = difference(css_color(STRATEGY_COLORS[a]), css_color(STRATEGY_COLORS[b]), deficiency)
                worst.append((round(d, 1), sampler, a, b, deficiency))
    assert min(worst)[0] > DISTINCT, sorted(worst)[:3]
    # And every strategy stands out from the page's background.
    for style in STRATEGY_COLORS.values():
        assert min(difference(css_color(style), THEME_BACKGROUND, d) for d in DEFICIENCIES) > 2 * DISTINCT, style
