"""Choosing the next token: the uncertainty metrics (`metrics`), the sampler
protocol and baselines (`samplers`), Entropix (`entropix`, `repetition`), the
settings and where they come from (`config`, `deliberate_config`, `cards`,
`calibrate`), and deliberate's branch policy and answer selection
(`branching`, `selection`). Nothing here runs a decode loop (see decode/)."""
