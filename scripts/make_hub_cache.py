#!/usr/bin/env python3
"""Write fixtures/hub-cache/: a HuggingFace cache directory laid out by Python's huggingface_hub
itself, for qwen3-cli/tests/hub.rs (which must read such a cache offline).

No network is used: a local mirror of the hub (this script's own, on a loopback port) serves the
tiny fixture checkpoint fixtures/models/tiny-qwen2-f32-tied-gqa2 as the repository
test-org/tiny-qwen2, and huggingface_hub's `snapshot_download` fetches it from there
(HF_ENDPOINT), writing models--test-org--tiny-qwen2/{blobs,refs,snapshots} as it does for the
hub. Run once by a developer, with huggingface_hub installed (scripts/requirements-fixtures.txt):

    ../venv-torch/bin/python scripts/make_hub_cache.py
"""

import hashlib
import http.server
import json
import os
import shutil
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURE = "tiny-qwen2-f32-tied-gqa2"
SRC = REPO / "fixtures" / "models" / FIXTURE
OUT = REPO / "fixtures" / "hub-cache"
REPO_ID = "test-org/tiny-qwen2"
COMMIT = "7a3c0f1e9b2d4c6a8e0f1a2b3c4d5e6f7a8b9c0d"
# What qwen3 export reads (reference.json stays out).
FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"]


class Hub(http.server.BaseHTTPRequestHandler):
    """GET/HEAD /api/models/ID/revision/REV and /ID/resolve/REV/FILE, with the headers the hub
    sends: X-Repo-Commit, ETag (the sha256 of the file, as for LFS files), Content-Length."""

    def log_message(self, *args):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        p = self.path.split("?")[0]
        if p.startswith(f"/api/models/{REPO_ID}/tree/"):
            # The file list with sizes and ids (huggingface_hub's list_repo_tree).
            entries = []
            for f in FILES:
                data = (SRC / f).read_bytes()
                entries.append({"type": "file", "path": f, "size": len(data),
                                "oid": hashlib.sha1(data).hexdigest(),
                                "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                        "pointerSize": 134} if f.endswith(".safetensors") else None})
            entries = [{k: v for k, v in e.items() if v is not None} for e in entries]
            return self.send(200, json.dumps(entries).encode(), [("Content-Type", "application/json")])
        if p.startswith(f"/api/models/{REPO_ID}"):
            body = json.dumps({"id": REPO_ID, "sha": COMMIT,
                               "siblings": [{"rfilename": f} for f in FILES]}).encode()
            return self.send(200, body, [("Content-Type", "application/json")])
        prefix = f"/{REPO_ID}/resolve/"
        if p.startswith(prefix):
            name = p[len(prefix):].split("/", 1)[1]
            if name in FILES:
                data = (SRC / name).read_bytes()
                # The hub's etag: the sha256 for an LFS file, the git blob id otherwise.
                if name.endswith(".safetensors"):
                    etag = hashlib.sha256(data).hexdigest()
                else:
                    etag = hashlib.sha1(data).hexdigest()
                return self.send(200, data, [("X-Repo-Commit", COMMIT), ("ETag", f'"{etag}"'),
                                             ("Content-Type", "application/octet-stream")])
        self.send(404, b"{}", [("X-Error-Code", "EntryNotFound")])


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_port}"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    import huggingface_hub  # after HF_ENDPOINT: it is read at import

    if OUT.exists():
        shutil.rmtree(OUT)
    cache = OUT / "hub"
    path = huggingface_hub.snapshot_download(REPO_ID, revision="main", cache_dir=str(cache))
    server.shutdown()
    assert Path(path) == cache / "models--test-org--tiny-qwen2" / "snapshots" / COMMIT, path
    meta = {"repo_id": REPO_ID, "commit": COMMIT, "fixture": FIXTURE,
            "huggingface_hub": huggingface_hub.__version__,
            "made_by": "scripts/make_hub_cache.py: huggingface_hub.snapshot_download from a local mirror"}
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for root, dirs, files in os.walk(OUT):
        for f in files + dirs:
            q = Path(root) / f
            print(q.relative_to(OUT), "->", os.readlink(q) if q.is_symlink() else "")


if __name__ == "__main__":
    main()
