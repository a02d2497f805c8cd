"""Stop strings over streamed text.

Text that could be the start of a stop string is held back until the next
token shows whether it is one, so a client never receives part of a stop
string (OpenAI's behaviour: the stop string itself is not returned)."""


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.text = ""  # everything generated so far
        self.sent = 0  # how much of it was handed out

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add a token's text; returns (text that is safe to send now, stop seen)."""
        self.text += piece
        if not self.stops:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out, False
        # Search from a little before the unsent part: a stop may straddle it.
        start = max(0, self.sent - max(map(len, self.stops)))
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            end = max(min(hits), self.sent)
            out, self.sent = self.text[self.sent : end], len(self.text)
            return out, True
        hold = max((n for s in self.stops for n in range(1, len(s)) if self.text.endswith(s[:n])), default=0)
        end = max(len(self.text) - hold, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out, False

    def flush(self) -> str:
        """At the end, without a stop: what was held back."""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
