"""Choosing the next token: the uncertainty metrics (`metrics`), the sampler
protocol and baselines (`samplers`), Entropix (`entropix`, with `candidates`,
`rollout` and `repetition`), the settings and where they come from (`settings`,
`config`, `deliberate_config`, `cards`), deliberate's branch policy and answer
selection (`branching`, `selection`), and how strategies are shown
(`strategies`). Nothing here runs the model in a decode loop: that is decode/."""
