"""`gpuop demo`'s live view: the rollout redrawn in place in the terminal, in plain ANSI.

Used only when standard output is a terminal (`gpuop_sim.cli.demo` falls back to progress lines
otherwise). The view is drawn below what was printed before it, so the process table stays
in the scrollback: each frame moves the cursor back to the frame's first line, rewrites
every line (clearing the rest of it) and clears what is below. Lines are cut to the
terminal's width and the frame to its height, so the cursor never has to reach into the
scrollback. A frame shows a table of the nodes (state, attempt, driver, last reason; in the
remediation and MIG scenarios also the kind of saga each state belongs to), a progress bar
(done, failed, under way: of the upgrades, or of the scenario's target nodes), the latest
events and the caller's footer (where the metrics are, how to tail the events). `showing`
redraws a few times a second from the `rollout_view.Tracker` and, however it ends (Ctrl-C
included), leaves the last frame on the screen and the cursor visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import sys
from collections.abc import AsyncIterator, Sequence
from typing import TextIO

from gpuop.events.upgrade import UpgradeState
from gpuop_sim.cli.rollout_view import (
    DEVICE_API,
    DONE_STATES,
    FAILED_STATES,
    MIG,
    REMEDIATION,
    SagaState,
    Tracker,
)

REDRAW_SECONDS = 0.25
BAR_WIDTH = 40
GREEN, RED, YELLOW, DIM, BOLD, RESET = (f"\x1b[{code}m" for code in (32, 31, 33, 2, 1, 0))
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
CLEAR_LINE, CLEAR_BELOW = "\x1b[K", "\x1b[J"
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def visible_length(text: str) -> int:
    """Length of `text` as the terminal shows it, escape sequences left out."""
    return len(_ESCAPE.sub("", text))


def fit(text: str, width: int) -> str:
    """`text` cut to `width` visible characters; escape sequences are kept whole."""
    out, shown, position = [], 0, 0
    while position < len(text) and shown < width:
        escape = _ESCAPE.match(text, position)
        if escape:
            out.append(escape.group())
            position = escape.end()
            continue
        out.append(text[position])
        shown += 1
        position += 1
    if position < len(text):
        out.append(RESET)
    return "".join(out)


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


MOVING = {REMEDIATION: "remediating", MIG: "re-carving", DEVICE_API: "switching"}
"""What the progress bar calls a target's saga under way, by the scenario's kind."""


def _colour(state: SagaState | None) -> str:
    if state in DONE_STATES:
        return GREEN
    if state in FAILED_STATES:
        return RED
    if state is None or state is UpgradeState.UPGRADE_REQUIRED:
        return DIM
    return YELLOW


class LiveScreen:
    """The live view of one rollout on `stream` (a terminal)."""

    def __init__(
        self,
        tracker: Tracker,
        *,
        title: str,
        footer: Sequence[str] = (),
        stream: TextIO | None = None,
    ) -> None:
        self._tracker = tracker
        self._title = title
        self._footer = list(footer)
        self._stream = stream or sys.stdout
        self._drawn = 0
        encoding = (getattr(self._stream, "encoding", None) or "").lower()
        self._glyphs = ("█", "█", "░") if encoding.startswith("utf") else ("#", "x", "-")

    def render(self, height: int = 1000) -> list[str]:
        """The frame for the tracker as it is now, in at most `height` lines: the latest
        events give way first."""
        tracker = self._tracker
        top = [f"{BOLD}{self._title}{RESET}   {clock(tracker.elapsed)} elapsed", ""]
        kinds = tracker.targets is not None
        saga = f"{'SAGA':<12} " if kinds else ""
        width = 30 if kinds else 24
        # the kubelet API serving each node's GPUs, once a device plugin has said it
        apis = any(row.api for row in tracker.rows.values())
        api = f"{'GPU API':<17} " if apis else ""
        top.append(
            f"{'NODE':<14} {saga}{'STATE':<{width}} {'ATTEMPT':<7}  {'DRIVER':<12} {api}LAST REASON"
        )
        for node in tracker.nodes:
            row = tracker.rows[node]
            state = str(row.state) if row.state else "-"
            attempt = str(row.attempt) if row.attempt else "-"
            kind = f"{row.kind or '-':<12} " if kinds else ""
            served = f"{row.api or '-':<17} " if apis else ""
            top.append(
                f"{node:<14} {kind}{_colour(row.state)}{state:<{width}}{RESET} {attempt:<7}  "
                f"{row.driver or '(unloaded)':<12} {served}{row.reason}"
            )
        top.extend(["", self._bar()])
        bottom = ["", *self._footer] if self._footer else []
        room = height - len(top) - len(bottom) - 2
        latest = list(tracker.latest)[-room:] if room > 0 else []
        events = ["", "Latest events"] if room > 0 else []
        for seen in latest:
            when = clock(seen.elapsed)
            events.append(f"  {when:>5}  {seen.node:<14} {seen.kind:<24} {seen.detail}")
        if room > 0 and not latest:
            events.append("  -")
        return [*top, *events, *bottom][:height]

    def _bar(self) -> str:
        tracker = self._tracker
        nodes = len(tracker.outcome.nodes if tracker.targets is None else tracker.targets)
        total = max(nodes, 1)
        done, failed, moving = tracker.counts()
        full_done = round(BAR_WIDTH * done / total)
        full_failed = round(BAR_WIDTH * (done + failed) / total) - full_done
        rest = BAR_WIDTH - full_done - full_failed
        done_glyph, failed_glyph, rest_glyph = self._glyphs
        bar = (
            f"{GREEN}{done_glyph * full_done}{RED}{failed_glyph * full_failed}"
            f"{DIM}{rest_glyph * rest}{RESET}"
        )
        verb = MOVING.get(tracker.kind, "upgrading")
        return f"[{bar}] {done}/{nodes} done, {failed} failed, {moving} {verb}"

    def draw(self, *, last: bool = False) -> None:
        """Replace the previous frame with the current one; the `last` frame shows the
        cursor again before its final newline, so whatever is printed next starts a clean
        line (the demo's JSON summary is read line by line)."""
        size = shutil.get_terminal_size()
        lines = [fit(line, size.columns - 1) for line in self.render(max(size.lines - 1, 1))]
        up = f"\x1b[{self._drawn}F" if self._drawn else HIDE_CURSOR
        body = "".join(f"{line}{CLEAR_LINE}\n" for line in lines)
        if last:
            self._stream.write(f"{up}{body[:-1]}{CLEAR_BELOW}{SHOW_CURSOR}\n")
        else:
            self._stream.write(f"{up}{body}{CLEAR_BELOW}")
        self._stream.flush()
        self._drawn = len(lines)

    @contextlib.asynccontextmanager
    async def showing(self) -> AsyncIterator[LiveScreen]:
        """Redraw until the block ends; then draw the last frame and show the cursor."""
        ticker = asyncio.create_task(self._tick(), name="live-view")
        try:
            yield self
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            try:
                self.draw(last=True)
            except BaseException:
                self._stream.write(SHOW_CURSOR)
                self._stream.flush()
                raise

    async def _tick(self) -> None:
        while True:
            self.draw()
            await asyncio.sleep(REDRAW_SECONDS)
