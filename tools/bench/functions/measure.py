#!/usr/bin/env python3
"""Issue 27 item 5: Redis Functions against EVALSHA for deduct.lua.

Loads lua/lib.lua + lua/deduct.lua twice into one throw-away redis-server:
as a script (SCRIPT LOAD, called with EVALSHA, as the service does) and as a
Function library (FUNCTION LOAD, called with FCALL) in which lib.lua's
helpers are defined once, at load, instead of on every call. Then runs
redis-benchmark on each in turn, in alternated pairs, on one promotion with
ample budget and stock and a unique order, customer and event per call
(the bench's ceiling workload), and prints calls/s and the time per call
inside Redis (INFO commandstats) of each, with the ratio per pair.

Usage: tools/bench/functions/measure.py [--pairs 3] [--requests 200000] [--port 6396] [--server BIN]
"""
import argparse, os, re, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def usec_per_call(port, name):
    info = cli(port, "INFO", "commandstats")
    m = re.search(r"cmdstat_%s:calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)" % name, info)
    if not m:
        sys.exit(f"measure: no {name} calls in INFO commandstats:\n{info}")
    return int(m.group(1)), float(m.group(3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--port", type=int, default=6396)
    ap.add_argument("--server", default="redis-server",
                    help="the server binary, e.g. ~/.cache/deductor/valkey-8.1.8/bin/valkey-server")
    a = ap.parse_args()
    lib = open(os.path.join(ROOT, "lua/lib.lua")).read()
    deduct = open(os.path.join(ROOT, "lua/deduct.lua")).read()
    script = lib + "\n" + deduct
    library = ("#!lua name=deductor_measure\n" + lib +
               "\nlocal function deduct(KEYS, ARGV)\n" + deduct + "\nend\n"
               "redis.register_function('deduct', deduct)\n")
    d = tempfile.mkdtemp(prefix="functions-measure-")
    server = subprocess.Popen([a.server, "--port", str(a.port), "--save", "", "--appendonly", "no",
                               "--dir", d], stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):
            try:
                cli(a.port, "PING")
                break
            except subprocess.CalledProcessError:
                time.sleep(0.1)
        version = cli(a.port, "INFO", "server")
        version = " ".join(re.findall(r"(?:redis|valkey)_version:(\S+)", version))
        sha = cli(a.port, "SCRIPT", "LOAD", script)
        cli(a.port, "FUNCTION", "LOAD", "REPLACE", library)
        keys_args = ["promo:{bench-ceiling}", "promo:{bench-ceiling}:used:c__rand_int__",
                     "promo:{bench-ceiling}:order:o-__rand_int__",
                     "promo:{bench-ceiling}:rejected:e-__rand_int__",
                     "1500", "1", "1795946400", "e-__rand_int__", "2592000", "604800", "c__rand_int__"]
        rows = []
        for pair in range(a.pairs):
            got = {}
            order = ["evalsha", "fcall"] if pair % 2 == 0 else ["fcall", "evalsha"]
            for mode in order:
                cli(a.port, "FLUSHALL")
                cli(a.port, "HSET", "promo:{bench-ceiling}", "budget", "1000000000000", "stock",
                    "1000000000", "per_customer", "5", "status", "active",
                    "initial_budget", "1000000000000", "initial_stock", "1000000000")
                cli(a.port, "CONFIG", "RESETSTAT")
                cmd = ["EVALSHA", sha] if mode == "evalsha" else ["FCALL", "deduct"]
                t = time.time()
                subprocess.run(["redis-benchmark", "-p", str(a.port), "-c", "50", "-P", "16", "-n",
                                str(a.requests), "-r", "1000000000", "-q", *cmd, "4", *keys_args],
                               check=True, capture_output=True)
                wall = time.time() - t
                calls, usec = usec_per_call(a.port, mode)
                accepted = int(cli(a.port, "EVAL", "return #redis.call('KEYS', 'promo:{bench-ceiling}:order:*')", "0"))
                # __rand_int__ repeats now and then (a repeated order is a
                # duplicate): nearly every call must have deducted.
                if accepted < 0.99 * calls:
                    sys.exit(f"measure: {mode}: {calls} calls but {accepted} records: the calls did not deduct")
                got[mode] = (calls / wall, usec)
            rows.append(got)
            print(f"pair {pair + 1}: EVALSHA {got['evalsha'][0]:.0f} calls/s, {got['evalsha'][1]:.2f} µs/call; "
                  f"FCALL {got['fcall'][0]:.0f} calls/s, {got['fcall'][1]:.2f} µs/call; "
                  f"FCALL/EVALSHA µs per call {got['fcall'][1] / got['evalsha'][1]:.2f}x, "
                  f"calls/s {got['fcall'][0] / got['evalsha'][0]:.2f}x", flush=True)
        ratios = sorted(r["fcall"][1] / r["evalsha"][1] for r in rows)
        print(f"redis {version}: FCALL / EVALSHA time per call inside Redis: "
              f"{ratios[0]:.2f}-{ratios[-1]:.2f}x over {len(rows)} pairs")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
