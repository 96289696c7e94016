"""trialtool inside the harnesses' own extension points: an inspect-ai sandbox, a mini-swe-agent environment.

Each module imports its framework, an optional extra; nothing imports them but
the framework itself (by entry point or by import path from its config).
"""
