"""A real MCP client we did not write (the official Python SDK) against `moat mcp`.

Usage: python3 tests/mcp_client.py MOAT -- ARGS...   (ARGS are `moat mcp`'s; any
interpreter with the `mcp` package: tests/mcp.rs runs $MOAT_TEST_PYTHON, else python3)
Prints one JSON document describing what it saw.
"""
import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.client.stdio import stdio_client


def text_of(result):
    return json.loads(result.content[0].text)


def field(obj, *names):
    """The SDK renamed fields between versions (inputSchema / input_schema)."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    raise AttributeError(names[0])


def is_error(result):
    return bool(field(result, "is_error", "isError"))


async def main() -> None:
    moat = sys.argv[1]
    args = sys.argv[sys.argv.index("--") + 1 :]
    # The SDK hands the server a bare environment (HOME, PATH, ...): pass on
    # the suite's block of host ids, or a root `moat mcp` would take the
    # host's (and add it to /etc/subuid on first use).
    env = get_default_environment()
    if "MOAT_UID_RANGE" in os.environ:
        env["MOAT_UID_RANGE"] = os.environ["MOAT_UID_RANGE"]
    params = StdioServerParameters(command=moat, args=["mcp", *args], env=env)
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            info = field(init, "server_info", "serverInfo")
            seen["server"] = {"name": info.name, "version": info.version}
            tools = await session.list_tools()
            seen["tools"] = sorted(t.name for t in tools.tools)
            seen["schemas"] = {t.name: field(t, "input_schema", "inputSchema") for t in tools.tools}
            wrote = await session.call_tool(
                "artifact_write",
                {"path": "output/hello.txt", "content": "hello from MCP\n", "maxBytes": 1000},
            )
            seen["write"] = {"isError": is_error(wrote), "result": text_of(wrote)}
            read_back = await session.call_tool(
                "artifact_read", {"path": "output/hello.txt", "maxBytes": 1000}
            )
            seen["read"] = {"isError": is_error(read_back), "result": text_of(read_back)}
            ran = await session.call_tool(
                "exec_argv", {"argv": ["cat", "/workspace/output/hello.txt"]}
            )
            seen["exec"] = {"isError": is_error(ran), "result": text_of(ran)}
            denied = await session.call_tool(
                "artifact_read", {"path": "../../etc/passwd", "maxBytes": 100}
            )
            seen["denied"] = {"isError": is_error(denied), "result": text_of(denied)}
    print(json.dumps(seen))


asyncio.run(main())
