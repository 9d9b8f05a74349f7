"""Issue 49 #8: the 400 for a field the server does not implement (`functions`, ...) is a whole sentence: a long value is
described, not cut mid-repr (it read `tools=[{'type': 'function', 'function': {'n is not supported` when tools were
refused; they are served now, the legacy `functions` are not)."""

from __future__ import annotations

import httpx
import pytest

FUNCTIONS = [{"name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


@pytest.mark.parametrize("field, value, shown", [("functions", FUNCTIONS, "got a list of 1 item"),
                                                 ("best_of", 3, "got 3"),
                                                 ("echo", True, "got True")])
def test_unsupported_field_message_is_whole(server, field, value, shown):
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], field: value}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert error["message"] == (f"{field} is not supported by this server (it would change the output; {shown}): "
                                f"leave {field} out")
