"""``run_async``: a coroutine on a fresh uvloop loop, failing on any exception that reached
the loop's handler (the suite's rule, for the benchmarks' helpers too)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh uvloop loop; fail if any exception reached the loop's handler."""
    errors: list[dict[str, Any]] = []

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        errors.append(context)

    async def wrapper() -> T:
        asyncio.get_running_loop().set_exception_handler(on_error)
        return await coro

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(wrapper())
    if errors:
        raise AssertionError(f"unhandled exception(s) in the event loop: {errors}")
    return result
