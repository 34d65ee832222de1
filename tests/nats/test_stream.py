"""The stream in start(): created if absent, evolved if present, user data never deleted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from anarchon import BackendError, InvalidOption
from anarchon.backends.nats import NatsBackend
from tests.nats.servers import connect

Make = Callable[..., Any]


async def raw_config(url: str, stream: str) -> dict[str, Any]:
    nc = await connect(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=2)
        config: dict[str, Any] = json.loads(reply.data)["config"]
        return config
    finally:
        await nc.close()


async def create_raw(url: str, config: dict[str, Any], fill: dict[str, int] | None = None) -> None:
    """Create a stream the way a user would, and put ``fill[subject]`` messages on subjects."""
    nc = await connect(url)
    try:
        reply = await nc.request(
            f"$JS.API.STREAM.CREATE.{config['name']}", json.dumps(config).encode(), timeout=2
        )
        assert "error" not in json.loads(reply.data), reply.data
        js = nc.jetstream()
        for subject, count in (fill or {}).items():
            for n in range(count):
                await js.publish(subject, str(n).encode())
    finally:
        await nc.close()


async def count(url: str, stream: str, subject: str) -> int:
    nc = await connect(url)
    try:
        info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


async def test_a_new_stream_has_the_seeds_settings(make: Make, server_url: str) -> None:
    backend: NatsBackend = await make(duplicate_window_ms=120_000, history_size=50)
    config = await raw_config(server_url, backend.stream)
    assert config["subjects"] == [f"{backend.prefix}>"]
    assert config["duplicate_window"] == 120_000 * 1_000_000
    assert config["max_msgs_per_subject"] == 50
    assert config["num_replicas"] == 1
    assert config["retention"] == "limits" and config["storage"] == "file"
    # A second instance with the same settings changes nothing.
    await make(duplicate_window_ms=120_000, history_size=50)
    assert await raw_config(server_url, backend.stream) == config


async def test_an_existing_stream_keeps_everything_else(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    other = f"o{prefix}>"
    await create_raw(
        server_url,
        {
            "name": stream,
            "subjects": [other],
            "max_age": 3_600 * 10**9,
            "max_bytes": 50_000_000,
            "max_msgs_per_subject": 5,
            "duplicate_window": 60 * 10**9,
            "description": "the user's",
            "num_replicas": 1,
        },
        fill={f"o{prefix}orders": 5},
    )
    before = await raw_config(server_url, stream)
    await make(duplicate_window_ms=600_000, history_size=100)
    after = await raw_config(server_url, stream)
    assert after["subjects"] == [other, f"{prefix}>"]
    assert after["duplicate_window"] == 600_000 * 10**6
    # Shared with other subjects: the limit was raised (5 -> 100), never lowered.
    assert after["max_msgs_per_subject"] == 100
    changed = {"subjects", "duplicate_window", "max_msgs_per_subject"}
    assert {k: v for k, v in after.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed
    }
    assert await count(server_url, stream, f"o{prefix}orders") == 5


async def test_a_shared_stream_limit_is_never_lowered(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    await create_raw(
        server_url,
        {"name": stream, "subjects": [f"o{prefix}>"], "max_msgs_per_subject": -1},
        fill={f"o{prefix}orders": 30},
    )
    await make(history_size=10)
    config = await raw_config(server_url, stream)
    assert config["max_msgs_per_subject"] == -1
    assert await count(server_url, stream, f"o{prefix}orders") == 30


async def test_a_stream_of_its_own_gets_the_history_size(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    narrow = f"{prefix}sync.claims"
    await create_raw(server_url, {"name": stream, "subjects": [narrow], "max_msgs_per_subject": -1})
    await make(history_size=20)
    config = await raw_config(server_url, stream)
    # The narrower subject is folded into <prefix>> (JetStream refuses overlaps in one stream).
    assert config["subjects"] == [f"{prefix}>"]
    assert config["max_msgs_per_subject"] == 20


async def test_a_covering_subject_is_left_alone(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    wide = f"{prefix}>"
    await create_raw(server_url, {"name": stream, "subjects": [wide]})
    await make(prefix=f"{prefix}app.")
    assert (await raw_config(server_url, stream))["subjects"] == [wide]


async def test_replicas_change_only_when_given_and_need_a_cluster(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, _ = names
    await make()
    await make(replicas=1)
    assert (await raw_config(server_url, stream))["num_replicas"] == 1
    # 2.9 and 2.10 would silently accept R3 on a single server; the backend refuses clearly.
    with pytest.raises(BackendError, match="replicas=3 needs a NATS cluster"):
        await make(replicas=3)
    assert (await raw_config(server_url, stream))["num_replicas"] == 1


async def test_a_new_stream_with_replicas_on_a_single_server_is_refused(make: Make) -> None:
    with pytest.raises(BackendError, match="replicas=3 needs a NATS cluster"):
        await make(replicas=3)


async def test_a_window_longer_than_max_age_is_explained(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    await create_raw(
        server_url, {"name": stream, "subjects": [f"{prefix}>"], "max_age": 60 * 10**9}
    )
    with pytest.raises(
        BackendError, match=r"duplicate_window_ms=300000 is longer than the max_age .* \(60000 ms\)"
    ):
        await make()


async def test_unusable_streams_are_refused(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    await create_raw(
        server_url, {"name": stream, "subjects": [f"{prefix}>"], "retention": "workqueue"}
    )
    with pytest.raises(BackendError, match=r"retention 'workqueue'.*needs 'limits'"):
        await make()


async def test_subjects_taken_by_another_stream_are_explained(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    await create_raw(server_url, {"name": stream, "subjects": [f"{prefix}>"]})
    with pytest.raises(BackendError, match="overlaps the subjects of another stream"):
        await make(stream=f"{stream}_2")


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"stream": "a.b"}, "stream='a.b' is not a JetStream stream name"),
        ({"stream": "a b"}, "without spaces"),
        ({"stream": ""}, "1 to 255"),
        ({"prefix": "cron"}, "prefix='cron' is not a NATS subject prefix.*followed by '.'"),
        ({"prefix": "cron.*."}, "without spaces, '\\*' or '>'"),
        ({"prefix": "_INBOX."}, "reserves"),
        ({"duplicate_window_ms": 50}, "duplicate_window_ms=50 for NatsBackend is out of range"),
        (
            {"duplicate_window_ms": 2**63},
            "duplicate_window_ms=9223372036854775808 for NatsBackend is out of range: it must be "
            "an integer from 100 to 315360000000",
        ),
        ({"duplicate_window_ms": 1.5e6}, "duplicate_window_ms=1500000.0 .* not a float"),
        ({"history_size": 2**63}, "history_size=9223372036854775808 .* from 1 to 1000000"),
        ({"history_size": 0}, "history_size=0"),
        ({"replicas": 7}, "between 1 and 5"),
        ({"servers": []}, "servers="),
        ({"connection": object()}, "not a nats-py client"),
    ],
)
def test_bad_options_are_refused_at_construction(options: dict[str, Any], text: str) -> None:
    with pytest.raises(InvalidOption, match=text):
        NatsBackend(**options)


async def test_reading_history_leaves_the_stream_as_it_is(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    stream, prefix = names
    backend: NatsBackend = await make(duplicate_window_ms=120_000, history_size=5000)
    before = await raw_config(server_url, backend.stream)
    reader = NatsBackend(server_url, stream=stream, prefix=prefix)  # default limits
    await reader.start_reader()
    try:
        assert await reader.history("job") == []
    finally:
        await reader.stop()
    assert await raw_config(server_url, backend.stream) == before
    missing = NatsBackend(server_url, stream=f"{stream}_NONE", prefix=f"{prefix}none.")
    with pytest.raises(BackendError, match="does not exist"):
        await missing.start_reader()


async def test_a_reader_with_another_prefix_is_told_the_stream_holds_none_of_it(
    make: Make, server_url: str, names: tuple[str, str]
) -> None:
    # A mistyped ?prefix= (or the default 'cron.' where the schedulers use another) on a stream
    # that exists: start_reader said nothing, then the first read failed with the server's
    # words (no stream answered the clock probe, "consumer filter subject is not a valid
    # subset"), which the commands reported as an unreachable backend (exit 4).
    stream, prefix = names
    await make()  # a scheduler's backend: the stream holds <prefix>>
    reader = NatsBackend(server_url, stream=stream, prefix=f"{prefix}x.")  # covered: fine
    await reader.start_reader()
    await reader.stop()
    typo = NatsBackend(server_url, stream=stream, prefix="typo.")
    with pytest.raises(BackendError) as caught:
        await typo.start_reader()
    text = str(caught.value)
    assert f"stream {stream!r} holds no subject under prefix 'typo.'" in text, text
    assert f"its subjects: {prefix}>" in text and "?prefix=" in text, text
