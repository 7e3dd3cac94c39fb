#!/usr/bin/env python3
"""Two `qwen3 serve` replicas behind nginx, with deploy/nginx/qwen3.conf as shipped.

    apt-get install nginx-light        # Debian's nginx; any nginx >= 1.15.3 will do
    python3 scripts/check_replicas.py --qwen3 target/release/qwen3 --model models/tiny.bin

Starts two replicas on loopback ports (`--parallel 2 --queue 2`: four requests each) and nginx in
the foreground with a scratch prefix, the shipped config included as it is, except for its
`listen` port and its upstream's addresses, which become the replicas'. Then it checks what the
config promises, as a client sees it:

1. answers through nginx equal the replicas' own (greedy, whole and streamed);
2. a stream passes token by token (each event in its own read, not gathered into a buffer);
3. a conversation's turns (same `X-Conversation-Id`) land on one replica: its prefix-cache hits
   grow by one a turn, the other replica's do not;
4. a burst of twice one replica's slots and queue, all of one conversation, is answered with no
   5xx: the full replica's 503s are retried on the other;
5. a rolling update: one replica gets SIGTERM while it streams an answer; that answer ends in
   full, the requests sent meanwhile are answered by the other replica, and the stopped one
   exits 0.

Prints one line per check and what it measured; exits non-zero on the first failure. Standard
library only.
"""

import argparse
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: the servers and the check lines

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "deploy/nginx/qwen3.conf"
# One line per check; the first failure ends the run (later checks build on earlier ones).
check = serverkit.Checks("replicas")


def request(port, method, path, body=None, headers=None, on_read=None):
    """One HTTP/1.1 request on a fresh connection, read to its end. Returns (status, headers,
    body as text); `on_read(bytes)` sees every read from the socket as it arrives."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=300) as s:
        s.sendall(head.encode() + b"\r\n" + payload)
        raw = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            if on_read:
                on_read(chunk)
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split(" ")[1])
    hdrs = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    if "chunked" in hdrs.get("transfer-encoding", ""):
        rest = dechunk(rest)
    return status, hdrs, rest.decode()


def dechunk(b):
    out = b""
    while True:
        size_line, _, b = b.partition(b"\r\n")
        size = int(size_line.strip() or b"0", 16)
        if size == 0:
            return out
        out += b[:size]
        b = b[size + 2:]


def events(body):
    return [l[len("data: "):] for l in body.split("\n") if l.startswith("data: ")]


def metrics(port):
    _, _, body = request(port, "GET", "/metrics")
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def answered(port):
    m = metrics(port)
    return sum(v for k, v in m.items() if k.startswith("qwen3_requests_total{") and 'status="200"' in k
               and "/v1/" in k)


class Replica(serverkit.Server):
    """One replica: two running requests and two queued at most, its stderr in LOGDIR/NAME.log."""

    def __init__(self, qwen3, model, logdir, name):
        super().__init__(qwen3, model, "--parallel", "2", "--queue", "2", "--threads", "1",
                         "--model-name", "tiny", "--shutdown-timeout", "120",
                         log=logdir / f"{name}.log", quiet=True)
        self.name = name


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(conf, ports, listen):
    """The config with its upstream's two server addresses and its listen port replaced."""
    text = conf.read_text()
    servers = re.findall(r"^(\s*server )(\S+:\d+)([^;]*;)$", text, flags=re.M)
    assert len(servers) == 2, f"expected two upstream servers in {conf}, found {servers}"
    for (indent, addr, params), p in zip(servers, ports):
        text = text.replace(indent + addr + params, f"{indent}127.0.0.1:{p}{params}")
    assert text.count("    listen 80;") == 1, f"expected one `listen 80;` in {conf}"
    return text.replace("    listen 80;", f"    listen 127.0.0.1:{listen};")


def start_nginx(nginx, d, conf, ports):
    port = free_port()
    (d / "qwen3.conf").write_text(render(conf, ports, port))
    temp = " ".join(f"{k}_temp_path {d}/{k};" for k in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"])
    (d / "nginx.conf").write_text(f"""
pid {d}/nginx.pid;
error_log {d}/error.log;
worker_processes 1;
events {{}}
http {{
    log_format upstreams '$request $status upstream=$upstream_addr statuses=$upstream_status';
    access_log {d}/access.log upstreams;
    {temp}
    include {d}/qwen3.conf;
}}
""")
    proc = subprocess.Popen([nginx, "-p", str(d), "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
                            stderr=open(d / "nginx.stderr", "w"))
    try:
        serverkit.wait_healthy(f"http://127.0.0.1:{port}", limit_s=5, proc=proc)
    except SystemExit as e:
        proc.kill()
        log = (d / "error.log").read_text() if (d / "error.log").exists() else ""
        raise SystemExit(f"nginx did not answer ({e}): {log}{(d / 'nginx.stderr').read_text()}")
    return proc, port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", default="target/release/qwen3")
    ap.add_argument("--model", default="models/tiny.bin")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--conf", type=Path, default=CONF, help="the nginx config to check (default: the shipped one)")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="qwen3-replicas-"))
    a = b = ngx = None
    ok = False
    try:
        a = Replica(args.qwen3, args.model, d, "a")
        b = Replica(args.qwen3, args.model, d, "b")
        ngx, port = start_nginx(args.nginx, d, args.conf, [a.port, b.port])
        print(f"replicas on {a.port} and {b.port}; nginx on {port}")
        run(port, a, b, d / "access.log")
        check.finish()
        ok = True
    finally:
        for r in (a, b):
            if r:
                r.stop()
        if ngx:
            ngx.terminate()
            ngx.wait()
        if ok:
            shutil.rmtree(d, ignore_errors=True)
        else:
            print(f"(logs kept in {d})")


def completion(prompt, **extra):
    return {"prompt": prompt, "max_tokens": 16, "temperature": 0, **extra}


def run(port, a, b, access_log):
    # 1. The same answers through nginx as from each replica.
    for prompt in ["The capital of France is", "Once upon a time"]:
        texts = []
        for p in (port, a.port, b.port):
            status, _, body = request(p, "POST", "/v1/completions", completion(prompt))
            texts.append(json.loads(body)["choices"][0]["text"] if status == 200 else f"HTTP {status}")
        _, _, body = request(port, "POST", "/v1/completions", completion(prompt, stream=True))
        streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events(body) if e != "[DONE]")
        check(f"{prompt!r}: through nginx = replica a = replica b = streamed through nginx",
              len(set(texts + [streamed])) == 1, repr(texts[0]))

    # 2. Token by token: count the socket reads that brought events.
    def stream_reads(p):
        reads = []
        request(p, "POST", "/v1/completions",
                completion("Count:", max_tokens=48, ignore_eos=True, stream=True),
                on_read=lambda c: reads.append(c.count(b"data: ")))
        return sum(reads), sum(1 for r in reads if r)
    n, reads = stream_reads(port)
    n_direct, reads_direct = stream_reads(a.port)
    check("a stream passes token by token", n == n_direct and reads >= n // 2,
          f"{n} events in {reads} reads through nginx ({n_direct} in {reads_direct} direct)")

    # 3. Affinity: one conversation, three turns, each resending the whole conversation.
    before = {r.name: metrics(r.port)["qwen3_prefix_cache_hits_total"] for r in (a, b)}
    messages = [{"role": "user", "content": "Hello there"}]
    cached = []
    for turn in ["And then?", "Tell me more", None]:
        status, _, body = request(port, "POST", "/v1/chat/completions",
                                  {"messages": messages, "max_tokens": 8, "temperature": 0},
                                  {"X-Conversation-Id": "conversation-1"})
        v = json.loads(body)
        cached.append(v["usage"]["prompt_tokens_details"]["cached_tokens"])
        messages.append(v["choices"][0]["message"])
        if turn:
            messages.append({"role": "user", "content": turn})
    grew = {r.name: metrics(r.port)["qwen3_prefix_cache_hits_total"] - before[r.name] for r in (a, b)}
    check("a conversation's turns land on one replica",
          sorted(grew.values()) == [0, 2] and cached[0] == 0 and all(c > 0 for c in cached[1:]),
          f"prefix-cache hits grew by {grew}; cached tokens per turn {cached}")

    # 4. A burst of 8 (one replica holds 4: 2 running, 2 queued), all of one conversation.
    before = {r.name: answered(r.port) for r in (a, b)}
    results = [None] * 8

    def send(i):
        results[i] = request(port, "POST", "/v1/completions",
                             completion(f"Burst {i}:", max_tokens=32, ignore_eos=True),
                             {"X-Conversation-Id": "burst"})[0]
    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    served = {r.name: answered(r.port) - before[r.name] for r in (a, b)}
    retried = sum("statuses=503, 200" in l for l in access_log.read_text().splitlines())
    check("a burst of twice a replica's capacity is answered with no 5xx",
          results == [200] * 8 and min(served.values()) > 0,
          f"statuses {sorted(set(results))}, answered by replica {served}, "
          f"{retried} of them after a 503 from the full one")

    # 5. A rolling update: SIGTERM the replica streaming a conversation's answer.
    holder = {}

    def long_stream():
        holder["r"] = request(port, "POST", "/v1/completions",
                              completion("Long:", max_tokens=400, ignore_eos=True, stream=True,
                                         stream_options={"include_usage": True}),
                              {"X-Conversation-Id": "rolling"})
    t = threading.Thread(target=long_stream)
    t.start()
    running = None
    for _ in range(500):
        for r in (a, b):
            if metrics(r.port)["qwen3_running_sequences"] > 0:
                running = r
        if running:
            break
        time.sleep(0.01)
    if running is None:
        check("a rolling update loses nothing", False, "the long stream ended before it could be stopped")
    other = b if running is a else a
    before = answered(other.port)
    running.proc.send_signal(signal.SIGTERM)
    # The signal is handled a moment later: its /health turning 503 says it has been.
    for _ in range(500):
        if request(running.port, "GET", "/health")[0] == 503:
            break
        time.sleep(0.01)
    not_ready = request(running.port, "GET", "/health")[0] == 503
    statuses = [request(port, "POST", "/v1/completions", completion(f"During {i}"),
                        {"X-Conversation-Id": "rolling"})[0] for i in range(4)]
    t.join()
    status, _, body = holder["r"]
    evs = events(body)
    usage = json.loads(evs[-2])["usage"] if len(evs) >= 2 else {}
    code = running.proc.wait(timeout=150)
    by_other = answered(other.port) - before
    check("a rolling update loses nothing",
          status == 200 and evs[-1] == "[DONE]" and usage.get("completion_tokens") == 400
          and statuses == [200] * 4 and by_other == 4 and code == 0 and not_ready,
          f"/health said 503 once it stopped; the stream ended with {usage.get('completion_tokens')} tokens; requests meanwhile: {statuses}, "
          f"{by_other:.0f} answered by the other replica; the stopped one exited {code}")


if __name__ == "__main__":
    main()
