"""The front doors: every way a harness or a person reaches a trial.

The CLI (cli.py), the JSON-lines server (serve.py), the MCP server
(mcp_server.py), OpenAI-style function calling (openai_tools.py) and the shell
shim (shim.py, shimcall.py) all call the typed API in `trialtool.trial`; what
an agent reads back is toolreply.py. Doors decide nothing about budgets.
"""
