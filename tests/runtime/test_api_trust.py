"""Issue 26 (Python API): an abandoned stream does not hold other calls (issue 49 #5); bad option values are InvalidArgument."""

import threading
import time

import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime import load


def test_unread_stream_in_another_thread_does_not_hold_others(pair_generator):
    it = pair_generator.stream("import os", 20, method="none")
    next(it)
    box = {}

    def other():
        try:
            box["value"] = pair_generator.generate("import os", 3, method="none")
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            box["value"] = exc

    t = threading.Thread(target=other, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the other thread waited for the stream's reader"
    assert len(box["value"].token_ids) == 3
    it.close()
    assert pair_generator.generate("import os", 3, method="none").token_ids


@pytest.mark.parametrize("option", [{"top_k": float("nan")}, {"top_k": 2.5}, {"top_p": "0.5"}, {"temperature": "1"},
                                    {"top_k": "3"}])  # None means "not given" (runtime/request.py)
def test_bad_sampling_values_are_invalid_argument(pair_generator, option):
    with pytest.raises(InvalidArgument, match=next(iter(option))):
        pair_generator.generate("import os", 3, **option)


def test_non_utf8_prompt_text_is_invalid_argument(pair_generator):
    with pytest.raises(InvalidArgument, match="not valid Unicode"):
        pair_generator.generate("abc\udcff", 3)


@pytest.mark.parametrize("threads", [0, -1, 100_000, 2.0, True])
def test_threads_are_bounded(pair_bundle, threads):
    with pytest.raises(InvalidArgument, match="threads"):
        load(pair_bundle, threads=threads)
