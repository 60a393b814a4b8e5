#!/usr/bin/env python3
"""Run a command and report its wall time and peak memory, sampled from
/proc every 5 ms: resident set (VmHWM, which counts pages of memory-mapped
files too), and the peak of anonymous memory (RssAnon: what the process
allocated itself) and of file-backed pages (RssFile).

    peak_memory.py [--json OUT] -- CMD ARGS...
"""
import json
import subprocess
import sys
import time


def status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def main():
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--json"]:
        out, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    start = time.monotonic()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    peak = {"VmHWM": 0, "RssAnon": 0, "RssFile": 0}
    while p.poll() is None:
        for k, v in status(p.pid).items():
            peak[k] = max(peak[k], v)
        time.sleep(0.005)
    wall = time.monotonic() - start
    r = {"command": args, "exit": p.returncode, "seconds": wall, "peak_rss_bytes": peak["VmHWM"],
         "peak_anon_bytes": peak["RssAnon"], "peak_file_bytes": peak["RssFile"]}
    print(json.dumps(r))
    if out:
        with open(out, "w") as f:
            json.dump(r, f)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
