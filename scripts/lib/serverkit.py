"""What the scripts that check and time `qwen3 serve` have in common, written once.

The check scripts (check_*.py) start the server, talk to it through some client, print one line
per check and a count at the end; the benchmarks (bench_*.py) wait for a server someone else
started and time concurrent clients. This module holds the parts they share:

- `Server`: `qwen3 serve MODEL` on a free loopback port, ready (its `/health` answers) when the
  object exists, stopped by SIGTERM at the end of a `with` block;
- `wait_healthy` and `healthy`: the `/health` probe, for a server started elsewhere too
  (llama-server answers it as well);
- `Checks`: `check(name, ok, detail)`, one uniform line per check, and the count;
- `post`, `run_level` and `percentile`: a benchmark's request, its concurrent clients, its
  tail latencies.

A script in scripts/ finds it by the script's own location, so that it runs from any directory
(and when another program loads it as a module, as schemathesis loads check_openai_spec.py):

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
    import serverkit

Python's standard library only, like the scripts that need nothing else.
"""

import http.client
import json
import re
import subprocess
import threading
import time
from urllib.parse import urlparse


class Server:
    """`qwen3 serve MODEL FLAGS...` on 127.0.0.1 and a port the system picks (`--port 0`).

    The constructor returns once the server printed its URL and `/health` answered 200; it
    raises SystemExit (with the end of the server's stderr, if kept) when either never happens.
    `log` is a file for the server's stderr (None: discarded); `limit_s` is how long `/health`
    may take to answer once the URL is printed (a big model loads before the URL is printed). `url`,
    `port` and `line` (what the server printed on start) say where it listens; `proc` is the
    process, for a test that signals it itself. Use it in a `with` block, or call `stop()`.
    """

    def __init__(self, qwen3, model, *flags, log=None, quiet=False, limit_s=120):
        self.log = log
        cmd = [str(qwen3), "serve", str(model), "--host", "127.0.0.1", "--port", "0", *flags]
        err = open(log, "w") if log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        finally:
            if log:
                err.close()  # the child writes through its own copy of the handle
        # The server prints one line once it listens, "qwen3 serve: NAME on http://HOST:PORT
        # (...)", and nothing else on stdout; an empty line means it exited before listening.
        self.line = self.proc.stdout.readline().strip()
        m = re.search(r" on (http://\S+)", self.line)
        if not m:
            code = self.stop()
            said = f"it printed {self.line!r}" if self.line else f"it exited ({code}) first"
            self._fail(f"{' '.join(cmd)} did not start listening: {said}")
        self.url = m.group(1)
        self.port = urlparse(self.url).port
        if not quiet:
            print(f"server: {self.line}", flush=True)
        try:
            wait_healthy(self.url, limit_s, self.proc)
        except SystemExit as e:
            self.stop()
            self._fail(str(e))

    def _fail(self, why):
        if self.log:
            print(f"server stderr (last lines):\n{self.log_tail(20)}")
        raise SystemExit(why)

    def log_tail(self, n):
        """The last `n` lines the server wrote to stderr ("" without a log file)."""
        if not self.log:
            return ""
        with open(self.log, errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()

    def stop(self, grace_s=30):
        """SIGTERM (the server answers what it holds, then exits), SIGKILL after `grace_s`
        seconds; returns the exit status (0 for a clean stop)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def healthy(url, timeout_s=10):
    """Whether GET URL/health answers 200 now. (http.client, not urllib: urllib would send a
    loopback request through an HTTP proxy set in the environment.)"""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):  # refused, reset, timed out, garbled
        return False
    finally:
        conn.close()


def wait_healthy(url, limit_s=300, proc=None):
    """Waits until GET URL/health answers 200 (llama-server answers 503 while it loads a model).
    Raises SystemExit after `limit_s` seconds, or as soon as `proc` (the server, if we started
    it) has exited."""
    deadline = time.monotonic() + limit_s
    while not healthy(url):
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before {url}/health answered")
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}/health did not answer 200 within {limit_s} s")
        time.sleep(0.2)


class Checks:
    """A check script's verdicts: `check(name, ok, detail="")` prints `ok: NAME: DETAIL` or
    `FAILED: NAME: DETAIL` and counts it.

    `label` names the script in its last line, "LABEL: P passed, F failed". With `stop_at_failure`
    the first failure prints that line and exits with status 1 (what follows a failure in a
    client check often depends on it); without, every check runs and `finish()` decides.
    """

    def __init__(self, label, stop_at_failure=True):
        self.label = label
        self.stop_at_failure = stop_at_failure
        self.passed = self.failed = 0

    def __call__(self, name, ok, detail=""):
        print(f"{'ok' if ok else 'FAILED'}: {name}{': ' + detail if detail else ''}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            if self.stop_at_failure:
                self.finish()
        return ok

    def all_passed(self):
        return self.failed == 0

    def finish(self, note=""):
        """Prints the count (and `note`); exits with status 1 if any check failed."""
        print(f"{self.label}: {self.passed} passed, {self.failed} failed{note}")
        if self.failed:
            raise SystemExit(1)


def post(url, path, body, timeout_s=600):
    """POSTs `body` as JSON to URL/PATH on a fresh connection; returns (connection, response),
    the response's body unread, so that a stream can be read as it arrives. Close the connection
    when done."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def run_level(clients, rounds, offset, send):
    """One benchmark level: `clients` threads, each calling `send(i)` `rounds` times one after the
    other, with i = offset + client * rounds + round (every request its own number, so its own
    prompt). Returns (the results of every send, wall seconds of the whole level). A failed send
    ends its client; RuntimeError then names how many failed and the first error."""
    results, errors = [], []
    lock = threading.Lock()

    def client(k):
        for r in range(rounds):
            try:
                res = send(offset + k * rounds + r)
            except Exception as e:  # noqa: BLE001 - reported, and the level fails
                with lock:
                    errors.append(str(e))
                return
            with lock:
                results.append(res)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(
            f"concurrency {clients}: {len(errors)} failed requests, first: {errors[0]}")
    return results, wall


def percentile(values, p):
    """The p-th percentile by nearest rank (no interpolation: a value that was measured);
    NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]
