"""Logs are JSON lines with timestamp, level, service, event and the request id."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import grpc
import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.v1 import cache_pb2
from services.common.logging import (
    bind_request_id,
    configure_logging,
    current_request_id,
    get_logger,
)


def test_lines_carry_timestamp_level_service_event_and_fields(log_lines):
    get_logger("tests.logging").info("page_evicted", page=7)
    [line] = log_lines()
    assert line["event"] == "page_evicted"
    assert (line["level"], line["service"], line["page"]) == ("info", "log_test", 7)
    assert datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).tzinfo is not None
    assert list(line)[:4] == ["timestamp", "level", "service", "event"]
    assert "req_id" not in line


def test_bound_request_id_tags_lines_inside_the_block_only(log_lines):
    log = get_logger("tests.logging")
    with bind_request_id("req-1"):
        assert current_request_id() == "req-1"
        log.info("inside")
        with bind_request_id("req-2"):
            log.info("nested")
        log.info("inside_again")
    log.info("outside")
    assert [(line["event"], line.get("req_id")) for line in log_lines()] == [
        ("inside", "req-1"),
        ("nested", "req-2"),
        ("inside_again", "req-1"),
        ("outside", None),
    ]


async def test_request_ids_do_not_leak_between_tasks(log_lines):
    log = get_logger("tests.logging")
    both_bound = asyncio.Barrier(2)

    async def work(req_id: str) -> None:
        with bind_request_id(req_id):
            await both_bound.wait()
            log.info("working")

    await asyncio.gather(work("a"), work("b"))
    working = [line for line in log_lines() if line["event"] == "working"]
    assert sorted(line["req_id"] for line in working) == ["a", "b"]


def test_standard_library_records_become_json_lines(log_lines):
    logging.getLogger("grpc._cython").warning("peer %s went away", "10.0.0.1")
    [line] = log_lines()
    assert (line["event"], line["level"], line["logger"]) == (
        "peer 10.0.0.1 went away",
        "warning",
        "grpc._cython",
    )
    assert line["service"] == "log_test"


def test_exceptions_are_logged_with_their_traceback(log_lines):
    try:
        raise ValueError("bad page table")
    except ValueError:
        get_logger("tests.logging").exception("step_failed")
    [line] = log_lines()
    assert line["level"] == "error"
    assert "Traceback" in line["exception"] and "bad page table" in line["exception"]


def test_configure_again_replaces_the_handler_and_level(log_lines):
    configure_logging("log_test", level="warning", stream=log_lines.buffer)
    log = get_logger("tests.logging")
    log.info("dropped")
    log.warning("kept")
    assert [line["event"] for line in log_lines()] == ["kept"]


def test_bad_level_is_rejected_by_name():
    with pytest.raises(InvalidArgument, match=r"^level:"):
        configure_logging("x", level="loud")


async def test_grpc_metadata_request_id_tags_handler_and_error_logs(log_lines, mesh):
    metadata = (("x-request-id", "req-42"),)
    await mesh.cache_stub.Match(cache_pb2.MatchRequest(token_ids=[1, 2]), metadata=metadata)
    mesh.cache.error = RuntimeError("boom")
    with pytest.raises(grpc.aio.AioRpcError):
        await mesh.cache_stub.Match(cache_pb2.MatchRequest(), metadata=metadata)
    lines = log_lines()
    handled = [line for line in lines if line["event"] == "match_handled"]
    assert [line.get("req_id") for line in handled] == ["req-42", "req-42"]
    [error] = [line for line in lines if line["event"] == "rpc_internal_error"]
    assert error["req_id"] == "req-42"
    assert error["method"] == "/radixmesh.v1.Cache/Match"
    assert "RuntimeError: boom" in error["exception"]
