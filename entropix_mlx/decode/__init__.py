"""Decoding: turning a prompt into an answer, token by token.

`generate` runs one answer (`Generation`, the decode loop) or hands it to a
decoder of its own (`Deliberator`); `engine.BatchEngine` decodes many rows
together for eval, deliberate and the server (`generate_batch` for a fixed
list); `events` holds what they hand out; `chat` keeps a conversation's cache
between turns; `prompt` applies the chat template; `registry` builds samplers
and decoders by name.
"""
