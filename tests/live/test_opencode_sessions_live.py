"""Live, issue 19 point 5: the real OpenCode TUI under `hctx wrap`, one server, two sessions.

Measured here: the server learns which session its TUI shows only when it tells the TUI
(`POST /tui/select-session` publishes `tui.session.select {sessionID}` on `/event`); the record then
stays on that session while another one takes turns, names it (`sessionId`), and moves when the
TUI is told to show the other.
"""

from __future__ import annotations

import pytest

from tests.fakes.opencode_model import opencode_fake_model
from tests.live.test_opencode_live import TURN_S, Box, box, new_session, opencode_under_wrap, prompt, wait_for

pytestmark = pytest.mark.live
__all__ = ["box"]  # the fixture, shared with the other OpenCode live tests


async def test_the_record_follows_the_session_the_tui_was_told_to_show(box: Box) -> None:
    agent = "oc-sessions"
    async with opencode_fake_model() as fake, opencode_under_wrap(box, fake, agent, tui=True) as client:
        shown, other = await new_session(client, "shown"), await new_session(client, "other")
        await prompt(client, shown, "the shown one [[u:50000:100]]")
        first = await wait_for("A's turn", lambda: (r := box.records(agent)) and r.used_tokens == 50_100 and r, TURN_S)
        assert (first.session_id, first.harness_version) == (shown, box.version)
        response = await client.post("/tui/select-session", json={"sessionID": shown})
        assert response.status_code == 200
        await prompt(client, other, "from the side [[u:80000:100]]")
        await prompt(client, shown, "the shown one again [[u:60000:100]]")
        again = await wait_for("A again", lambda: (r := box.records(agent)) and r.used_tokens == 60_100 and r, TURN_S)
        assert again.session_id == shown
        assert 80_100 not in [w["usedTokens"] for w in box.writes(agent)]  # the other session never showed
        response = await client.post("/tui/select-session", json={"sessionID": other})
        assert response.status_code == 200
        moved = await wait_for("B shown", lambda: (r := box.records(agent)) and r.session_id == other and r, TURN_S)
        assert moved.used_tokens == 80_100  # its held turn, published when the TUI shows it
