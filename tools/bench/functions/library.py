#!/usr/bin/env python3
"""Issue 27 item 5: a script text as the service sends it, made a Function library.

Reads a cut-down script text (`cargo run --example script_text NAME`: lib.lua's
definitions the script names, then the script's own text) on stdin and writes a
Redis Function library on stdout in which lib.lua's part runs once, when the
library is loaded, and the script's own part is the body of one function,
registered as NAME:

    #!lua name=deductor_measure_NAME
    <lib.lua's part>
    redis.register_function('NAME', function(KEYS, ARGV)
      <the script's own part>
    end)

The script's own part starts at its first top-level `local` line that is not a
line of lua/lib.lua (deduct.lua's `local function read_memo`, deduct_batch's
`local function deduct_one`). A library's top level runs without the `string`,
`math` and `table` globals (Redis 7.0, Valkey 8.1), so a lib.lua line such as
`local find = string.find` becomes `local find`, assigned again at the start of
each call.

Used by `scripts/lua-cost --functions` to count what a Function saves per line
against EVALSHA of the same text; the service does not load Functions (see
docs/benchmarks.md, "Redis Functions against EVALSHA").

Usage: library.py NAME < cut.lua > library.lua
"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GLOBAL_ALIAS = re.compile(r"^local (\w+) = ((?:string|math|table)\.\w+)\b.*$")


def main():
    if len(sys.argv) != 2 or not re.fullmatch(r"[a-z_]+", sys.argv[1]):
        sys.exit("usage: library.py NAME < cut.lua > library.lua")
    name = sys.argv[1]
    lib_lines = set(open(os.path.join(ROOT, "lua/lib.lua")).read().splitlines())
    lines = sys.stdin.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("local ") and l not in lib_lines), None)
    if start is None:
        sys.exit("library.py: no line of the script's own found after lib.lua's")
    head, aliases = [], []
    for line in lines[:start]:
        m = GLOBAL_ALIAS.match(line)
        if m:
            head.append(f"local {m.group(1)}")
            aliases.append(f"{m.group(1)} = {m.group(2)}")
        else:
            head.append(line)
    out = [f"#!lua name=deductor_measure_{name}", *head,
           f"redis.register_function('{name}', function(KEYS, ARGV)", *aliases, *lines[start:], "end)"]
    print("\n".join(out))


if __name__ == "__main__":
    main()
